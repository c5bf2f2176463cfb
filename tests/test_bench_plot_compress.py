"""The bench plot: the compress panel (the prefill form's share of copy bandwidth per way of calling it, from a
result shaped as `dsv4hal bench compress` writes it; an older result without the num_groups timing still plots), the
mHC panel, and a result with nothing to draw."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

from dsv4hal.bench.plot import plot  # noqa: E402


def _row(config: str, with_num_groups: bool) -> dict:
    row = {"config": config, "tokens": 32768, "chosen": "triton_compress",
           "fraction_of_copy": {"triton_compress": 0.2, "torch_reference": 0.03},
           "triton_kernel_fraction_of_copy": 0.9}
    if with_num_groups:
        row["num_groups_fraction_of_copy"] = {"triton_compress": 0.88}
    return row


@pytest.mark.parametrize("with_num_groups", [True, False])
def test_compress_panel(tmp_path: Path, with_num_groups: bool) -> None:
    result = {"device": "test", "command": "dsv4hal bench compress",
              "compress": {"decode": [], "prefill": [_row("c4_main", with_num_groups), _row("c128_main", False)],
                           "goals": {"prefill_goal_min": 0.6}}}
    out = tmp_path / "compress.png"
    plot(result, str(out))
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000


def test_mhc_panel_and_nothing_to_plot(tmp_path: Path) -> None:
    """`dsv4hal bench mhc --plot` draws its rows (it failed with no mHC panel: a figure of zero columns); a result with
    no benchmark the plot draws is refused with the list of those it does."""
    rows = [{"op": "mhc_pre", "T": t, "hidden": 4096, "us": {"triton_mhc_pre": 9.0 + t / 64, "torch_reference": 240.0},
             "floor_us": 1.0} for t in (1, 64)]
    rows.append({"op": "mhc_pre_gemm", "T": 1, "hidden": 4096, "us": {"triton_partials": 3.7}, "floor_us": 0.4})
    out = tmp_path / "mhc.png"
    plot({"device": "test", "command": "dsv4hal bench mhc", "mhc": rows}, str(out))
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000
    with pytest.raises(ValueError, match="nothing to plot"):
        plot({"device": "test", "command": "x", "other": [1]}, str(tmp_path / "none.png"))
