"""The tables `dsv4hal info` prints (as lines): each op's or collective op's candidates with their marks and reasons."""

from __future__ import annotations

from typing import Any

from dsv4hal.errors import Dsv4HalError


def collective_decisions(platform: Any) -> dict[str, Any]:
    """Each collective op's Decision for its default case here, or the error's text (a forced backend that cannot
    run the default case is an override for other cases, not a fault of info)."""
    out: dict[str, Any] = {}
    for op in platform.registry.collectives:
        try:
            out[op] = platform.decide_collective(op)
        except Dsv4HalError as exc:
            out[op] = str(exc).splitlines()[0]
    return out


def decision_lines(decisions: dict[str, Any]) -> list[str]:
    """Each op, then its candidates: * chosen, + eligible, - rejected (with the reasons)."""
    lines = []
    for op, d in decisions.items():
        lines.append(f"  {op}" + ("" if hasattr(d, "candidates") else f": {d}"))
        for c in getattr(d, "candidates", ()):
            mark = {"chosen": "*", "eligible": "+", "rejected": "-"}[c.status]
            why = f"  <- {'; '.join(c.reasons)}" if c.reasons else ""
            note = f"  (p{c.priority} {c.priority_note})" if c.priority_note else ""
            lines.append(f"    {mark} {c.name:<28} p{c.priority:<4} {c.tier:<9}{why}{note}")
    return lines
