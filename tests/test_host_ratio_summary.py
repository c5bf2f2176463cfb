"""bench/host_ratio_summary.py reads issue 13's ratios from `dsv4hal bench attention` JSON: each name to its column,
and a goal counted as met only at or below it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from host_ratio_summary import summarize  # noqa: E402


def _row(validated: float, unvalidated: float, t: int = 1) -> dict:
    ratios = {"direct_flashmla": 1.0, "dsv4hal[flashmla_sm90_sgl]": validated,
              "dsv4hal[flashmla_sm90_sgl] no validation": unvalidated,
              "flashmla_sm90_sgl kernel (hoisted dispatch)": 0.9,
              "flashmla_sm90_sgl kernel, Python glue (hoisted dispatch)": 1.05,
              "dsv4hal[triton_sparse_decode]": 1.8, "dsv4hal[triton_sparse_decode] no validation": 1.7,
              "direct_flashmla (views per call)": 1.1}
    return {"T": t, "host_us": {"direct_flashmla": 40.0 + validated}, "host_ratio_vs_direct": ratios}


def test_columns_and_goals(tmp_path: Path) -> None:
    rows = [_row(1.2, 1.1), _row(1.21, 1.05), _row(1.0, 1.11), {"T": 64, "host_us": {}, "host_ratio_vs_direct": {}}]
    path = tmp_path / "a.json"
    path.write_text(json.dumps({"attention": rows}))
    s = summarize(str(path))
    assert s["cells"] == 3  # the T = 64 row has no host times
    assert s["validated"] == {"min": 1.0, "max": 1.21, "median": 1.2, "met": 2}
    assert s["validate=False"]["met"] == 2 and s["validate=False"]["max"] == 1.11
    assert s["glue alone, as bound"]["median"] == 0.9 and s["glue alone, Python views"]["median"] == 1.05
    assert s["direct_us"] == [41.0, 41.21]
