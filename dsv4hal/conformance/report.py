"""Markdown rendering of a conformance report: one matrix per op (case by mode), then each tolerance reason and
each note once, numbered (ops and cells refer to the numbers)."""

from __future__ import annotations

from dsv4hal.conformance.cells import Report

MODES_ORDER = ("eager", "graph", "verify", "draft_extend")
SHORT = {"pass": "pass", "fail": "**FAIL**", "production-unreachable": "unreachable", "blocked": "blocked",
         "deferred": "deferred", "not-run": "not-run"}


def markdown(report: Report) -> str:
    info = report.info
    lines = [f"# Conformance: platform `{report.platform}`", "",
             f"Machine: {info.get('vendor')}/{info.get('arch')} {info.get('device_name', '')}, "
             f"detected by {info.get('detected_by')}.", "",
             "Summary: " + ", ".join(f"{v} {k}" for k, v in report.counts().items() if v), ""]
    ops: dict[str, list] = {}
    for c in report.cells:
        ops.setdefault(c.op, []).append(c)
    notes: dict[str, int] = {}
    tolerances: dict[str, int] = {}  # each reason once, numbered; ops refer to the numbers
    for op, cells in ops.items():
        modes = [m for m in MODES_ORDER if any(c.mode == m for c in cells)]
        impls = sorted({c.implementation for c in cells if c.implementation})
        lines += [f"## {op}", "", f"Implementation(s): {', '.join(impls) or '-'}", "",
                  "| case | ratio | " + " | ".join(modes) + " |", "|---|---|" + "---|" * len(modes)]
        rows: dict[str, dict[str, str]] = {}
        ratio: dict[str, str] = {}
        for c in cells:
            text = SHORT[c.status]
            if c.max_error is not None and c.status in ("pass", "fail"):
                text += f" {c.max_error:.2g}"
            if c.detail and c.status != "pass":
                key = c.detail
                notes.setdefault(key, len(notes) + 1)
                text += f" [{notes[key]}]"
            rows.setdefault(c.case, {})[c.mode] = text
            ratio[c.case] = "-" if c.compress_ratio is None else str(c.compress_ratio)
        for case, by_mode in rows.items():
            lines.append(f"| {case} | {ratio[case]} | " + " | ".join(by_mode.get(m, "") for m in modes) + " |")
        reasons = sorted({r for c in cells if (r := (c.tolerance or {}).get("reason"))})
        for r in reasons:
            tolerances.setdefault(r, len(tolerances) + 1)
        if reasons:
            lines += ["", "Tolerances: " + ", ".join(f"T{tolerances[r]}" for r in reasons)]
        lines.append("")
    if tolerances:
        lines += ["## Tolerances", ""] + [f"T{n}. {text}" for text, n in tolerances.items()] + [""]
    if notes:
        lines += ["## Notes", ""] + [f"{n}. {text}" for text, n in notes.items()]
    return "\n".join(lines) + "\n"
