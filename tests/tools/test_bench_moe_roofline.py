"""`dsv4hal bench moe`'s roofline of a row (dsv4hal.bench.moe._rooflines): the slower of the experts' weight bytes
at copy bandwidth and the FLOPs at the compute peak, and each kernel's share of it."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dsv4hal.bench import moe as bench

COPY = 3.0e12  # bytes/s
PEAK = 1200.0  # TFLOP/s


def _row(weight_bytes: int, flop: int, us: dict[str, float]) -> dict:
    return {"weight_bytes": weight_bytes, "flop": flop, "us": us}


def test_fp8_experts_at_4096_tokens_are_bound_by_their_weights() -> None:
    """V4-Flash's 256 FP8 experts at T = 4096: 6.44 GB of weights outlast 1.24 TFLOP at the FP8 peak."""
    row = _row(6_444_023_808, 1_236_950_581_248, {"deepgemm": 2727.8})
    bench._rooflines(row, COPY, PEAK)
    assert row["roofline_us"] == pytest.approx(6_444_023_808 / COPY * 1e6)
    assert row["x_roofline"]["deepgemm"] == pytest.approx(2148.0 / 2727.8, rel=1e-3)


def test_a_compute_bound_row_takes_the_flops_bound() -> None:
    row = _row(1_000_000, 2_400_000_000_000, {"k": 4000.0})
    bench._rooflines(row, COPY, PEAK)
    assert row["roofline_us"] == pytest.approx(2000.0)
    assert row["x_roofline"]["k"] == pytest.approx(0.5)


def test_without_a_compute_peak_the_weights_alone_bound() -> None:
    """FP8 rows on a platform without an fp8_linear kernel: no FP8 peak was timed, so the roofline is the weights'
    bytes alone (never the bf16 peak, which would overstate the FP8 FLOPs' time)."""
    row = _row(3_000_000_000, 10**15, {"k": 2000.0})
    bench._rooflines(row, COPY, None)
    assert row["roofline_us"] == pytest.approx(1000.0) and row["x_roofline"]["k"] == pytest.approx(0.5)


def test_the_bf16_baseline_gets_no_share() -> None:
    row = _row(3_000_000, 1, {"k": 2.0, bench.BASELINE: 50.0})
    bench._rooflines(row, COPY, PEAK)
    assert set(row["x_roofline"]) == {"k"} and row["x_roofline"]["k"] == pytest.approx(0.5)


@given(st.integers(1, 10**10), st.integers(1, 10**13), st.floats(0.1, 1e5))
def test_the_roofline_is_the_larger_bound(weight_bytes: int, flop: int, us: float) -> None:
    row = _row(weight_bytes, flop, {"k": us})
    bench._rooflines(row, COPY, PEAK)
    memory, compute = weight_bytes / COPY * 1e6, flop / PEAK / 1e6
    assert row["roofline_us"] == pytest.approx(max(memory, compute))
    assert row["roofline_us"] >= min(memory, compute)
    assert row["x_roofline"]["k"] == pytest.approx(row["roofline_us"] / us)
