"""The bench plot: the compress panel (the prefill form's share of copy bandwidth per way of calling it, from a
result shaped as `dsv4hal bench compress` writes it; an older result without the num_groups timing still plots), the
mHC panel, the MoE panel, and a result with nothing to draw. Each is checked by what it drew (bars, lines, labels)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

from figures import bars, drawn, lines, tick_labels  # noqa: E402

from dsv4hal.bench.plot import plot  # noqa: E402


def _row(config: str, with_num_groups: bool) -> dict:
    row = {"config": config, "tokens": 32768, "chosen": "triton_compress",
           "fraction_of_copy": {"triton_compress": 0.2, "torch_reference": 0.03},
           "triton_kernel_fraction_of_copy": 0.9}
    if with_num_groups:
        row["num_groups_fraction_of_copy"] = {"triton_compress": 0.88}
    return row


@pytest.mark.parametrize("with_num_groups", [True, False])
def test_compress_panel_draws_each_way_of_calling_at_its_share_of_copy(tmp_path: Path, with_num_groups: bool,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The compress panel draws a bar a way of calling a shape, at the result's share of copy bandwidth, and the goal
    line; the num_groups way only where the result timed it."""
    result = {"device": "test", "command": "dsv4hal bench compress",
              "compress": {"decode": [], "prefill": [_row("c4_main", with_num_groups), _row("c128_main", False)],
                           "goals": {"prefill_goal_min": 0.6}}}
    (ax,) = drawn(monkeypatch, lambda out: plot(result, out), tmp_path / "compress.png").axes
    want = {"op (eager, host sync)": [0.2, 0.2], "kernel alone (graph)": [0.9, 0.9]}
    if with_num_groups:
        want["op given num_groups (graph)"] = [0.88]
    assert bars(ax) == want
    assert tick_labels(ax) == ["c4_main N32K", "c128_main N32K"]
    assert list(ax.lines[0].get_ydata()) == [0.6, 0.6]


def test_mhc_panel_draws_every_row_and_an_empty_result_is_refused(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """`dsv4hal bench mhc --plot` draws each row's kernels and floor (a GEMM row's kernels beside the ops'); a result
    with no benchmark the plot draws is refused with the list of those it does."""
    rows = [{"op": "mhc_pre", "T": t, "hidden": 4096, "us": {"triton_mhc_pre": 9.0 + t / 64, "torch_reference": 240.0},
             "floor_us": 1.0} for t in (1, 64)]
    rows.append({"op": "mhc_pre_gemm", "T": 1, "hidden": 4096, "us": {"triton_partials": 3.7}, "floor_us": 0.4})
    result = {"device": "test", "command": "dsv4hal bench mhc", "mhc": rows}
    (ax,) = drawn(monkeypatch, lambda out: plot(result, out), tmp_path / "mhc.png").axes
    assert bars(ax) == {"triton_mhc_pre": [9.015625, 10.0], "torch_reference": [240.0, 240.0],
                        "triton_partials": [3.7], "bandwidth floor": [1.0, 1.0, 0.4]}
    assert tick_labels(ax) == ["mhc_pre T1 d4096", "mhc_pre T64 d4096", "mhc_pre_gemm T1 d4096"]
    with pytest.raises(ValueError, match="nothing to plot"):
        plot({"device": "test", "command": "x", "other": [1]}, str(tmp_path / "none.png"))


def test_moe_panel_draws_a_line_per_format_and_kernel_over_tokens(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The moe panel draws one line per (format, kernel) through each row's time at its T; EP rows are left out."""
    rows = [{"format": f, "T": t, "us": {"a": 1.0 * t, "b": 2.0 * t}} for f in ("mxfp4", "fp8_block") for t in (1, 64)]
    rows.append({"format": "mxfp4", "T": 8, "us": {"a": 99.0}, "dropped": 0.5})
    result = {"moe": rows, "device": "cpu", "command": "test"}
    (ax,) = drawn(monkeypatch, lambda out: plot(result, out), tmp_path / "moe.png").axes
    assert lines(ax) == {f"{f} {k}": ([1.0, 64.0], [scale, 64 * scale]) for f in ("mxfp4", "fp8_block")
                         for k, scale in (("a", 1.0), ("b", 2.0))}
