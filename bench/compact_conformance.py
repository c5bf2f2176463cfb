"""Rewrite conformance reports written before `dsv4hal conformance --json` left deselected cells out (the tenth
session): the cells not selected by --ops / --cases are dropped and counted in "deselected", as the runner now
writes them; the summary is unchanged. Committed reports were ~300 KB each, mostly such cells, and the tree a
device call carries is limited to 64 MiB.

    python3 bench/compact_conformance.py bench/results/h200/conformance-*.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from dsv4hal.conformance.runner import DESELECTED


def compact(path: Path) -> int:
    """Cells dropped from the report at `path` (rewritten only when there were some)."""
    data = json.loads(path.read_text())
    kept = [c for c in data["cells"] if c.get("detail") != DESELECTED]
    dropped = len(data["cells"]) - len(kept)
    if dropped:
        data["deselected"] = data.get("deselected", 0) + dropped
        data["cells"] = kept
        path.write_text(json.dumps(data, indent=1) + "\n")
    return dropped


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        print(arg, "cells dropped:", compact(Path(arg)))
