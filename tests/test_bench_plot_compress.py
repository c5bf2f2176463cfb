"""The bench plot: the compress panel (the prefill form's share of copy bandwidth per way of calling it, from a
result shaped as `dsv4hal bench compress` writes it; an older result without the num_groups timing still plots), the
mHC panel, and a result with nothing to draw."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("matplotlib")

from dsv4hal.bench.plot import plot  # noqa: E402


def _drawn(monkeypatch: pytest.MonkeyPatch, result: dict[str, Any], out: Path) -> Any:
    """Plot `result` into `out` and return the figure saved there (the PNG written, its bars readable)."""
    from matplotlib.figure import Figure

    saved: list[Figure] = []
    original = Figure.savefig

    def savefig(fig: Figure, *args: Any, **kwargs: Any) -> None:
        saved.append(fig)
        original(fig, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", savefig)
    plot(result, str(out))
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and len(saved) == 1
    return saved[0]


def _bars(ax: Any) -> dict[str, list[float]]:
    """Each labelled bar series of a panel: its heights in drawing order."""
    return {c.get_label(): [round(p.get_height(), 6) for p in c] for c in ax.containers}


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
    (ax,) = _drawn(monkeypatch, result, tmp_path / "compress.png").axes
    want = {"op (eager, host sync)": [0.2, 0.2], "kernel alone (graph)": [0.9, 0.9]}
    if with_num_groups:
        want["op given num_groups (graph)"] = [0.88]
    assert _bars(ax) == want
    assert [t.get_text() for t in ax.get_xticklabels()] == ["c4_main N32K", "c128_main N32K"]
    assert list(ax.lines[0].get_ydata()) == [0.6, 0.6]


def test_mhc_panel_draws_every_row_and_an_empty_result_is_refused(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """`dsv4hal bench mhc --plot` draws each row's kernels and floor (a GEMM row's kernels beside the ops'); a result
    with no benchmark the plot draws is refused with the list of those it does."""
    rows = [{"op": "mhc_pre", "T": t, "hidden": 4096, "us": {"triton_mhc_pre": 9.0 + t / 64, "torch_reference": 240.0},
             "floor_us": 1.0} for t in (1, 64)]
    rows.append({"op": "mhc_pre_gemm", "T": 1, "hidden": 4096, "us": {"triton_partials": 3.7}, "floor_us": 0.4})
    (ax,) = _drawn(monkeypatch, {"device": "test", "command": "dsv4hal bench mhc", "mhc": rows},
                   tmp_path / "mhc.png").axes
    assert _bars(ax) == {"triton_mhc_pre": [9.015625, 10.0], "torch_reference": [240.0, 240.0],
                         "triton_partials": [3.7], "bandwidth floor": [1.0, 1.0, 0.4]}
    assert [t.get_text() for t in ax.get_xticklabels()] == ["mhc_pre T1 d4096", "mhc_pre T64 d4096",
                                                            "mhc_pre_gemm T1 d4096"]
    with pytest.raises(ValueError, match="nothing to plot"):
        plot({"device": "test", "command": "x", "other": [1]}, str(tmp_path / "none.png"))
