"""Issue 13's host-time ratios from `dsv4hal bench attention --json` files, one line per file: the direct FlashMLA
call's host time (views hoisted: the issue's baseline) and, against it, the bound call validated (goal <= 1.2) and
with validate=False (goal <= 1.1), each as min-max, median and the cells that meet the goal; then the glue alone with
the C++ and the Python views.

    python3 bench/host_ratio_summary.py bench/results/h200/bench-attention-host-*.json
"""

from __future__ import annotations

import json
import statistics
import sys
from typing import Any

GOALS = {"validated": 1.2, "validate=False": 1.1}


def _columns(ratios: dict[str, float]) -> dict[str, float]:
    out: dict[str, float] = {}
    for name, v in ratios.items():
        if name.startswith("dsv4hal[flashmla") and name.endswith("]"):
            out["validated"] = v
        elif name.startswith("dsv4hal[flashmla") and name.endswith("no validation"):
            out["validate=False"] = v
        elif name.startswith("flashmla") and "Python glue" in name:
            out["glue alone, Python views"] = v
        elif name.startswith("flashmla") and name.endswith("kernel (hoisted dispatch)"):
            out["glue alone, as bound"] = v
    return out


def summarize(path: str) -> dict[str, Any]:
    rows = [r for r in json.load(open(path))["attention"] if r.get("host_ratio_vs_direct")]
    direct = [r["host_us"]["direct_flashmla"] for r in rows]
    cols: dict[str, list[float]] = {}
    for r in rows:
        for k, v in _columns(r["host_ratio_vs_direct"]).items():
            cols.setdefault(k, []).append(v)
    out: dict[str, Any] = {"file": path, "cells": len(rows), "direct_us": [min(direct), max(direct)]}
    for k, vs in cols.items():
        out[k] = {"min": min(vs), "max": max(vs), "median": statistics.median(vs)}
        if k in GOALS:
            out[k]["met"] = sum(v <= GOALS[k] for v in vs)
    return out


def main(paths: list[str]) -> None:
    for p in paths:
        s = summarize(p)
        parts = [f"{p.rsplit('/', 1)[-1]}: direct {s['direct_us'][0]:.1f}-{s['direct_us'][1]:.1f} us"]
        for k in ("validated", "validate=False", "glue alone, as bound", "glue alone, Python views"):
            if k in s:
                c = s[k]
                met = f", goal met in {c['met']} of {s['cells']}" if "met" in c else ""
                parts.append(f"{k} {c['min']:.2f}-{c['max']:.2f} (median {c['median']:.2f}{met})")
        print("; ".join(parts))


if __name__ == "__main__":
    main(sys.argv[1:])
