"""build_attention_metadata: a hand-computed row, in-place writes, and typed errors for bad inputs."""

from __future__ import annotations

import pytest
import torch

import dsv4hal
from dsv4hal.errors import InvalidArgumentError
from dsv4hal.ops.attention_metadata import AttentionMetadata, validate
from dsv4hal.reference.attention_metadata import build_attention_metadata


def test_hand_computed_row() -> None:
    """The window indices of one hand-computed position map through the page table and full_to_swa."""
    pos = torch.tensor([257], dtype=torch.int32)  # L = 258: second page, offset 1
    table = torch.tensor([[3, 7]], dtype=torch.int32)
    f2s = torch.arange(8 * 256, dtype=torch.int64) + 10_000
    m = build_attention_metadata(pos, table, f2s)
    assert m.swa_indices[0, 0] == 10_000 + 7 * 256 + 1  # newest: position 257
    assert m.swa_indices[0, 2] == 10_000 + 3 * 256 + 255  # position 255 sits on the first page
    assert m.swa_lengths.tolist() == [128]
    assert (m.c4_lengths_raw.tolist(), m.c4_lengths.tolist()) == ([64], [64])
    assert m.c128_indices[0, :3].tolist() == [6, 7, -1] and m.c128_lengths.tolist() == [2]
    assert m.c4_out_loc.tolist() == [0]  # 258 % 4 != 0: dummy slot
    m = build_attention_metadata(torch.tensor([255], dtype=torch.int32), table, f2s)
    assert m.c4_out_loc.tolist() == [3 * 256 // 4 + 255 // 4] and m.c128_out_loc.tolist() == [3 * 2 + 1]
    short = build_attention_metadata(torch.tensor([2], dtype=torch.int32), table, f2s)
    assert short.swa_indices[0, 3:].eq(-1).all() and short.c4_lengths.tolist() == [1]


def test_writes_in_place() -> None:
    """build_attention_metadata with out= fills and returns that same object."""
    out = AttentionMetadata.empty(1, 2)
    ret = build_attention_metadata(torch.tensor([9], dtype=torch.int32), torch.tensor([[1, 2]], dtype=torch.int32),
                                   torch.arange(1024), out=out)
    assert ret is out and out.swa_lengths.tolist() == [10]


@pytest.mark.parametrize("bad", ["positions_dtype", "table_rows", "out_shape", "topk", "beyond_table"])
def test_validator(bad: str) -> None:
    """Each malformed argument (dtype, table rows, out shape, topk, position past the table) is refused by name."""
    args = dict(positions=torch.tensor([5, 300], dtype=torch.int32), page_table=torch.zeros(2, 2, dtype=torch.int32),
                full_to_swa=torch.zeros(1024, dtype=torch.int64), index_topk=512, out=None)
    if bad == "positions_dtype":
        args["positions"] = args["positions"].long()
    elif bad == "table_rows":
        args["page_table"] = torch.zeros(3, 2, dtype=torch.int32)
    elif bad == "out_shape":
        args["out"] = AttentionMetadata.empty(3, 2)
    elif bad == "topk":
        args["index_topk"] = 256
    else:
        args["positions"] = torch.tensor([5, 600], dtype=torch.int32)
    with pytest.raises(InvalidArgumentError):
        validate(**args, checked=True)


def test_bound_on_cpu_platform() -> None:
    """The cpu platform's build_attention_metadata fills the window and marks missing entries -1."""
    p = dsv4hal.select_platform("cpu")
    m = p.ops.build_attention_metadata(torch.tensor([0], dtype=torch.int32), torch.zeros(1, 1, dtype=torch.int32),
                                       torch.arange(256))
    assert m.swa_indices[0, 0] == 0 and m.swa_indices[0, 1] == -1
