"""The indexer_topk reference and page_transform against torch.topk and a hand-computed example, and the
indexer_topk validator against bad inputs."""

from __future__ import annotations

import pytest
import torch

from dsv4hal.errors import InvalidArgumentError
from dsv4hal.ops import indexer_topk as topk_contract
from dsv4hal.reference.indexer_topk import indexer_topk, page_transform


def test_topk_sets_equal_torch_topk_and_short_rows_ascending() -> None:
    """Reference top-k returns torch.topk's sets, and short rows all indices ascending."""
    gen = torch.Generator().manual_seed(3)
    scores = torch.randn(3, 2000, generator=gen)
    lengths = torch.tensor([2000, 1500, 7], dtype=torch.int32)
    raw, pages = indexer_topk(scores, lengths, 512)
    assert pages is None
    for row, n in enumerate(lengths.tolist()[:2]):
        want = set(torch.topk(scores[row, :n], 512).indices.tolist())
        assert set(raw[row].tolist()) == want
    assert raw[2].tolist() == list(range(7)) + [-1] * 505


def test_page_transform_hand_example() -> None:
    """page_transform maps raw indices through the page table, -1 kept."""
    raw = torch.tensor([[0, 63, 64, 130, -1]], dtype=torch.int32)
    table = torch.tensor([[5, 9, 2]], dtype=torch.int32)
    assert page_transform(raw, table).tolist() == [[5 * 64, 5 * 64 + 63, 9 * 64, 2 * 64 + 2, -1]]


def test_topk_validator() -> None:
    """indexer_topk validation refuses a bad k and, checked, lengths past the row."""
    s, n = torch.zeros(2, 600), torch.tensor([5, 600], dtype=torch.int32)
    topk_contract.validate(s, n, 512, checked=True)
    with pytest.raises(InvalidArgumentError, match="'k'"):
        topk_contract.validate(s, n, 300)
    with pytest.raises(InvalidArgumentError, match="'lengths'"):
        topk_contract.validate(s, torch.tensor([5, 601], dtype=torch.int32), 512, checked=True)
    with pytest.raises(InvalidArgumentError, match="'page_table'"):
        topk_contract.validate(s, n, 512, torch.zeros(2, 3, dtype=torch.int32), checked=True)
    with pytest.raises(InvalidArgumentError, match="'scores'"):
        topk_contract.validate(s.double(), n, 512)
