"""Tensor-parallel query heads: padded to the count the chosen attention kernel declares (QueryHeads), and padding
leaves the real heads' outputs unchanged."""

from __future__ import annotations

import pytest
import torch
from conftest import fake
from op_args import prefill

import dsv4hal
from dsv4hal.distributed.tp import attention_heads, pad_heads, pad_rows, unpad_heads
from dsv4hal.errors import InvalidArgumentError

ATTN = ("sparse_attention_decode", "sparse_attention_prefill")


@pytest.mark.parametrize(("arch", "libs", "heads", "padded", "kernel"), [
    ("sm90", {"flash_mla": "1.0.0", "triton": "3"}, 8, 64, "flashmla_sm90_sgl"),
    ("sm90", {"flash_mla": "1.0.0", "triton": "3"}, 100, 128, "flashmla_sm90_sgl"),
    ("sm100", {"flash_mla": "1.0.0", "triton": "3"}, 16, 64, "flashmla_sm100_sgl"),
    ("sm100", {"flash_mla": "1.0.0", "triton": "3"}, 65, 128, "flashmla_sm100_sgl"),
    ("gfx950", {"aiter": "1", "triton": "3"}, 8, 64, "aiter_pa_decode_sparse"),
    ("cpu", {}, 32, 64, "torch_reference"),
])
def test_attention_heads_pad_to_the_count_the_chosen_kernel_runs(arch: str, libs: dict, heads: int, padded: int,
                                                                 kernel: str) -> None:
    """A rank's heads are padded to the smallest count both the ops' contract and the best kernel take, and that
    kernel is the one chosen for the padded count."""
    p = dsv4hal.select_platform(info=fake(arch, **libs), validate=False)
    plan = attention_heads(p, heads)
    assert (plan.heads, plan.padded, plan.kernels["sparse_attention_decode"]) == (heads, padded, kernel)


def test_attention_kernels_declare_the_heads_their_supports_check() -> None:
    """Every attention kernel that declares QueryHeads refuses, through supports(), exactly the head counts its
    declaration excludes (one rule: the declaration), naming pad_heads as the remedy."""
    p = dsv4hal.select_platform(info=fake("sm90", flash_mla="1.0.0", triton="3"), validate=False)
    declared = 0
    for op in ATTN:
        for impl in p.registry.kernels_for(op):
            if impl.query_heads is None or impl.supports is None:
                continue
            declared += 1
            base = {**p.ops[op].spec.default_case, "fp8": "e4m3fn", "width": 1024, "extra_width": 512}
            for h in (16, 48, 64, 96, 128, 192):
                refused = [r for r in impl.supports({**base, "h_q": h}, p.info) if "h_q" in r]
                runs = impl.query_heads.padded(h) == h
                assert bool(refused) != runs, (impl.name, h, refused)
                assert not refused or "pad_heads" in refused[0]
    assert declared >= 5  # FlashMLA SM90 (two bindings x two ops), SM100 (two ops), aiter decode


def test_attention_heads_refuse_more_heads_than_the_ops_take() -> None:
    """More heads a rank than the attention ops' largest h_q (128) is a typed error naming the remedy."""
    with pytest.raises(InvalidArgumentError, match="up to 128") as exc:
        attention_heads(dsv4hal.select_platform("cpu"), 200)
    assert exc.value.remedy


def test_padded_heads_leave_the_real_heads_outputs_unchanged() -> None:
    """32 real query heads padded with zero heads to 64 give, on the real heads, the outputs and lse the same heads
    get beside 32 other real heads: heads are independent, so padding changes nothing the caller keeps."""
    ops = dsv4hal.select_platform("cpu").ops
    a = prefill(t=3)
    q, sink = a["q"], a["sink"]
    padded = pad_heads(q[:, :32], 64)
    assert padded.shape == q.shape and not padded[:, 32:].any()
    full_o, full_lse = ops.sparse_attention_prefill(**a)
    o, lse = ops.sparse_attention_prefill(**{**a, "q": padded, "sink": pad_heads(sink[:32], 64, 0)})
    assert torch.equal(unpad_heads(o, 32), full_o[:, :32]) and torch.equal(lse[:, :32], full_lse[:, :32])


def test_pad_heads_and_pad_rows_refuse_shrinking() -> None:
    """Padding to fewer heads or rows than the tensor has is a typed error; padding rows fills with -1."""
    with pytest.raises(InvalidArgumentError):
        pad_heads(torch.zeros(2, 64, 8), 32)
    with pytest.raises(InvalidArgumentError):
        pad_rows(torch.zeros(4, 2), 3)
    assert pad_rows(torch.zeros(2, 3, dtype=torch.int32), 4).tolist()[2:] == [[-1, -1, -1]] * 2
