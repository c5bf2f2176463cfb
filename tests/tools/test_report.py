"""The markdown conformance report states each tolerance reason once, however many cells and ops share it."""

from __future__ import annotations

from dsv4hal.conformance.report import markdown
from dsv4hal.conformance.runner import Cell, Report


def test_each_tolerance_reason_once() -> None:
    """The conformance report states each tolerance reason once."""
    shared, other = "fp8 rounding of the cache (shared)", "bf16 output rounding (other)"
    cells = [Cell(op, "impl", f"case{i}", mode, None, "cpu", "pass", 1e-3,
                  tolerance={"atol": 1e-2, "rtol": 0.0, "reason": shared if i % 2 else other})
             for op in ("op_a", "op_b") for i in range(3) for mode in ("eager", "graph")]
    cells.append(Cell("op_c", "impl", "case0", "eager", None, "cpu", "fail", 1.0, detail="off by one",
                      tolerance={"atol": 0.0, "rtol": 0.0, "reason": shared}))
    md = markdown(Report("cpu", {"vendor": "cpu", "arch": "x86", "detected_by": "test"}, cells))
    assert md.count(shared) == 1 and md.count(other) == 1
    assert "## Tolerances" in md and md.count("Tolerances: T1, T2") == 2  # op_a, op_b refer to both
    assert "Tolerances: T" in md.split("## op_c")[1].split("##")[0]
    assert md.count("off by one") == 1
