"""Sparse attention (decode and prefill) with arguments at the edge of its contract: index rows with a row stride,
a NaN sink, a softmax_scale that is not a positive finite number, invalid negative indices in unchecked mode."""

from __future__ import annotations

import op_args
import pytest
import torch
from op_args import I32_MIN

from dsv4hal.errors import InvalidArgumentError
from dsv4hal.kernels.triton import sparse_attention as tri_attn
from dsv4hal.reference import sparse_attention as ref_attn

pytest.importorskip("triton")


def test_row_strided_indices_are_taken() -> None:
    """Only the last dimension of the index rows must be dense: the Triton decode takes their row stride."""
    args = op_args.decode(extra=True)
    args["swa_indices"] = op_args.strided(args["swa_indices"], 0)
    want = ref_attn.sparse_attention_decode(**{**args, "swa_indices": args["swa_indices"].contiguous()})
    got = tri_attn.sparse_attention_decode(**args)
    assert torch.equal(got[1].isinf(), want[1].isinf())
    torch.testing.assert_close(got[0].float(), want[0].float(), atol=2e-2, rtol=2e-2)


@pytest.mark.parametrize("op", ["sparse_attention_decode", "sparse_attention_prefill"])
def test_nan_sink_refused_in_checked_mode(reference_checked, reference_unchecked, op) -> None:  # noqa: ANN001
    """Checked mode refuses a NaN attention sink; unchecked mode runs without reading values."""
    args = op_args.decode() if op.endswith("decode") else op_args.prefill()
    args["sink"][3] = float("nan")
    with pytest.raises(InvalidArgumentError) as e:
        reference_checked.ops[op](**args)
    assert e.value.argument == "sink"
    reference_unchecked.ops[op](**args)  # unchecked mode reads no values


@pytest.mark.parametrize("scale", [float("inf"), float("nan"), True, 0.0, -0.1, "0.04", None])
@pytest.mark.parametrize("op", ["sparse_attention_decode", "sparse_attention_prefill"])
def test_softmax_scale_must_be_a_positive_finite_number(reference_unchecked, op, scale) -> None:  # noqa: ANN001
    """Attention refuses a softmax_scale that is not a positive finite number, even reference_unchecked."""
    args = op_args.decode() if op.endswith("decode") else op_args.prefill()
    with pytest.raises(InvalidArgumentError) as e:
        reference_unchecked.ops[op](**{**args, "softmax_scale": scale})
    assert e.value.argument == "softmax_scale"


@pytest.mark.parametrize("value", [-2, I32_MIN])
def test_unchecked_invalid_negatives_stay_inside(value) -> None:  # noqa: ANN001
    """Unchecked, an invalid negative's contribution is unspecified; the reference and Triton both skip it."""
    args = op_args.with_entry(op_args.decode(extra=True), "swa_indices", value)
    args = op_args.with_entry(args, "extra_indices", value)
    want, got = ref_attn.sparse_attention_decode(**args), tri_attn.sparse_attention_decode(**args)
    torch.testing.assert_close(got[0].float(), want[0].float(), atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(got[1], want[1], atol=1e-3, rtol=1e-3)
    skip = op_args.with_entry(op_args.with_entry(op_args.decode(extra=True), "swa_indices", -1), "extra_indices", -1)
    torch.testing.assert_close(want[1], ref_attn.sparse_attention_decode(**skip)[1])


@pytest.mark.parametrize("launch", [
    {"block_h": 16, "bk": 32, "dv_split": 2, "programs": 1},  # one split: the output written directly
    {"block_h": 16, "bk": 32, "dv_split": 2, "programs": 64},  # split-K: partials and the combine kernel
    {"block_h": 32, "bk": 64, "dv_split": 1, "programs": 64},
])
def test_every_launch_shape_gives_the_reference_result(launch: dict) -> None:
    """The decode kernel's launch shapes (two programs sharing a head block's output, split-K or not, other head
    blocks and key blocks) each give the reference's output and lse, NaN-free, on rows whose lengths end inside a
    block or leave no SWA key, with -1 entries."""
    args = op_args.decode(t=3, w=96, extra=True)
    dev = args["q"].device
    args["swa_lengths"] = torch.tensor([96, 27, 0], dtype=torch.int32, device=dev)  # a block ends mid-way, or none
    args["extra_lengths"] = torch.tensor([64, 5, 40], dtype=torch.int32, device=dev)
    args["swa_indices"][0, 3] = args["extra_indices"][2, 7] = -1
    want = ref_attn.sparse_attention_decode(**args)
    got = tri_attn._launch(args["q"], args["sink"], args["softmax_scale"], args["swa_cache"], args["swa_indices"],
                           args["swa_lengths"], args["extra_cache"], args["extra_indices"], args["extra_lengths"],
                           fp8_source=True, config=launch)
    assert not got[0].isnan().any()
    torch.testing.assert_close(got[0].float(), want[0].float(), atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(got[1], want[1], atol=1e-3, rtol=1e-3)


@pytest.mark.parametrize("w", [1, 40, 96, 100])
def test_swa_widths_off_the_key_block_keep_the_extra_keys_apart(w: int) -> None:
    """SWA index rows whose width is not a multiple of the kernel's key block, followed by extra keys: the default
    launch gives the reference's output and lse (the extra list starts at the next block, never inside one)."""
    args = op_args.decode(t=2, w=w, extra=True)
    want, got = ref_attn.sparse_attention_decode(**args), tri_attn.sparse_attention_decode(**args)
    torch.testing.assert_close(got[0].float(), want[0].float(), atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(got[1], want[1], atol=1e-3, rtol=1e-3)
