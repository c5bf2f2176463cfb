"""`dsv4hal run`: the benchmark, conformance and trust suites of `suites.py`, each in a process of its own, into
`bench/results/<card>/<suite>.json` (plots and markdown beside it), overwritten on every run. Every file carries the
environment header (`environment.py`), the suite's command, its status (passed, failed, timeout, unavailable), the
seconds it took and the tail of its output; the command's own report is its "result"."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dsv4hal.runner.suites import SUITES, SUITES_BY_NAME, Suite

__all__ = ["SUITES", "SUITES_BY_NAME", "Suite", "listing", "main"]


def listing(suites: tuple[Suite, ...] = SUITES) -> str:
    """One line per suite: name, tags, time limit, whether it needs a GPU, what it measures."""
    width = max(len(s.name) for s in suites)
    return "\n".join(f"{s.name:<{width}}  {','.join(s.tags):<19} {s.timeout_s:>4} s  {'GPU' if s.gpu else 'CPU'}  "
                     f"{s.measures}" for s in suites)


def main(args: argparse.Namespace) -> int:
    from dsv4hal import hardware
    from dsv4hal.output_paths import check_output
    from dsv4hal.runner.environment import environment
    from dsv4hal.runner.execute import run_suites, select

    if args.list:
        print(listing())
        return 0
    suites = select(args.suites, gpu=hardware.detect().is_gpu)
    out_dir = Path(args.out_dir)
    check_output(str(out_dir / (args.card or "card") / "check.json"))
    records = run_suites(suites, out_dir, args.card, cwd=Path.cwd(), environment=environment, limit_s=args.limit,
                         progress=lambda line: print(line, file=sys.stderr, flush=True))
    bad = [r["suite"] + ": " + r["status"] for r in records if r["status"] != "passed"]
    print(f"dsv4hal run: {len(records) - len(bad)} of {len(records)} suites passed" + (f" ({', '.join(bad)})"
                                                                                       if bad else ""))
    return 1 if bad else 0
