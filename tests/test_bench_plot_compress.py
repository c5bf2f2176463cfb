"""The bench plot's compress panel: the prefill form's share of copy bandwidth per way of calling it, from a result
shaped as `dsv4hal bench compress` writes it (an older result without the num_groups timing still plots)."""

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
