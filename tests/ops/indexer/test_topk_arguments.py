"""indexer_topk with arguments at the edge of its contract: k and page_size must be ints, an empty page table, and
scores past each row's length (ignored) against non-finite scores within it (refused when checked)."""

from __future__ import annotations

import op_args
import pytest
import torch
from op_args import DEV

from dsv4hal.errors import InvalidArgumentError
from dsv4hal.reference import indexer_topk as ref_topk

pytest.importorskip("triton")


@pytest.mark.parametrize(("arg", "value"), [("k", 512.0), ("k", True), ("page_size", True), ("page_size", 64.0)])
def test_topk_ints_are_ints(reference_unchecked, arg, value) -> None:  # noqa: ANN001
    """indexer_topk refuses a float or bool k or page_size, naming the argument."""
    with pytest.raises(InvalidArgumentError) as e:
        reference_unchecked.ops.indexer_topk(**{**op_args.topk(), arg: value})
    assert e.value.argument == arg


def test_reference_page_transform_with_an_empty_table() -> None:
    """The reference page_transform maps every index to -1 against an empty page table."""
    raw = torch.tensor([[0, 5, -1]], dtype=torch.int32)
    assert ref_topk.page_transform(raw, torch.zeros(1, 0, dtype=torch.int32)).tolist() == [[-1, -1, -1]]


def test_checked_topk_ignores_scores_past_each_length_and_refuses_them_within(reference_checked,
                                                                              triton_checked) -> None:  # noqa: ANN001
    """indexer_logits leaves -inf past a row's length, and top-k ignores whatever lies there (spec 4.3): checked
    mode accepts -inf and NaN past the length, and refuses either within it."""
    args = {**op_args.topk(), "lengths": torch.tensor([600, 650], dtype=torch.int32, device=DEV)}
    scores = args["scores"].clone()
    scores[0, 600:] = float("-inf")
    scores[1, 650:] = float("nan")
    want = ref_topk.indexer_topk(**{**args, "scores": scores})
    for p in (reference_checked, triton_checked):
        raw, pages = p.ops.indexer_topk(**{**args, "scores": scores})
        assert torch.equal(raw.sort(1).values.cpu(), want[0].sort(1).values.cpu())
        for bad in (float("-inf"), float("nan")):
            inside = scores.clone()
            inside[1, 10] = bad
            with pytest.raises(InvalidArgumentError, match="within each row's length") as e:
                p.ops.indexer_topk(**{**args, "scores": inside})
            assert e.value.argument.startswith("scores")
