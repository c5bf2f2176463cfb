"""Markdown rendering of a conformance report: one matrix per op (case by mode), then the reasons."""

from __future__ import annotations

from dsv4hal.conformance.runner import Report

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
        tols = {(c.tolerance or {}).get("reason") for c in cells if c.tolerance}
        for t in sorted(x for x in tols if x):
            lines.append(f"\nTolerance: {t}")
        lines.append("")
    if notes:
        lines += ["## Notes", ""] + [f"{n}. {text}" for text, n in notes.items()]
    return "\n".join(lines) + "\n"
