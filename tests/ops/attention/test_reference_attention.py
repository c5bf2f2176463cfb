"""The sparse attention references (decode and prefill) against hand-computed examples and invariants, and
their validator against bad inputs."""

from __future__ import annotations

import math

import pytest
import torch

from dsv4hal.errors import InvalidArgumentError
from dsv4hal.formats.v4_cache import V4PagedCache, quantize_tokens, write_records
from dsv4hal.ops import sparse_attention as attn_contract
from dsv4hal.reference.sparse_attention import sparse_attention_decode, sparse_attention_prefill

SCALE = 512 ** -0.5


def _cache_with(keys: torch.Tensor, slots: list[int], page: int = 256) -> V4PagedCache:
    cache = V4PagedCache.empty(1, page)
    write_records(cache, torch.tensor(slots), quantize_tokens(keys.bfloat16(), "e4m3fn"))
    return cache


def _two_keys() -> tuple[torch.Tensor, torch.Tensor]:
    """Keys exact in FP8 (powers of two), so the hand computation is exact."""
    k = torch.zeros(2, 512)
    k[0, 0], k[1, 1], k[1, 500] = 1.0, 2.0, 0.5  # dim 500 lies in the bf16 rope part
    q = torch.zeros(1, 64, 512)
    q[0, :, 0], q[0, :, 1] = 3.0, 1.0
    return k, q


def test_decode_hand_computed() -> None:
    """Reference sparse decode on two hand-built keys gives the hand-computed output and lse."""
    k, q = _two_keys()
    cache = _cache_with(k, [5, 9])
    idx = torch.full((1, 64), -1, dtype=torch.int32)
    idx[0, :2] = torch.tensor([5, 9])
    out, lse = sparse_attention_decode(q.bfloat16(), cache, idx, torch.tensor([2], dtype=torch.int32),
                                       torch.full((64,), -math.inf), SCALE)
    s = [3.0 * SCALE, 2.0 * SCALE]  # <q, k0> = 3, <q, k1> = 2
    p0 = math.exp(s[0]) / (math.exp(s[0]) + math.exp(s[1]))
    assert lse[0, 0].item() == pytest.approx(math.log(math.exp(s[0]) + math.exp(s[1])), rel=1e-6)
    assert out[0, 0, 0].item() == pytest.approx(p0, rel=1e-2)
    assert out[0, 0, 1].item() == pytest.approx(2 * (1 - p0), rel=1e-2)
    assert out[0, 0, 500].item() == pytest.approx(0.5 * (1 - p0), rel=1e-2)  # V is K, rope included
    # length 1 masks the second (valid) index
    out1, _ = sparse_attention_decode(q.bfloat16(), cache, idx, torch.tensor([1], dtype=torch.int32),
                                      torch.full((64,), -math.inf), SCALE)
    assert out1[0, 0, 0].item() == pytest.approx(1.0) and out1[0, 0, 1].item() == 0.0


def test_sink_invariants_and_empty_rows() -> None:
    """The sink lowers weights as specified and a row of only -1 indices gives zeros."""
    k, q = _two_keys()
    cache = _cache_with(k, [0, 1])
    idx = torch.full((2, 64), -1, dtype=torch.int32)
    idx[0, :2] = torch.tensor([0, 1])
    lengths = torch.tensor([2, 5], dtype=torch.int32)  # row 1 has only -1 entries: empty
    q2 = q.expand(2, -1, -1).bfloat16()
    none, lse = sparse_attention_decode(q2, cache, idx, lengths, torch.full((64,), -math.inf), SCALE)
    full, _ = sparse_attention_decode(q2, cache, idx, lengths, torch.full((64,), math.inf), SCALE)
    zero_sink, _ = sparse_attention_decode(q2, cache, idx, lengths, torch.zeros(64), SCALE)
    assert full.eq(0).all()  # sink +inf takes all the mass
    assert none[1].eq(0).all() and math.isinf(lse[1, 0].item()) and lse[1, 0] > 0
    factor = 1.0 / (1.0 + math.exp(0.0 - lse[0, 0].item()))  # sink 0 scales by 1 / (1 + exp(-lse))
    assert zero_sink[0, 0, 0].item() == pytest.approx(none[0, 0, 0].item() * factor, rel=1e-2)


def test_prefill_matches_decode_on_the_same_keys() -> None:
    """Reference prefill equals decode over the same keys."""
    k, q = _two_keys()
    idx = torch.full((1, 128), -1, dtype=torch.int32)
    idx[0, :2] = torch.tensor([1, 0])
    sink = torch.zeros(64)
    out, lse = sparse_attention_prefill(q.bfloat16(), k.bfloat16(), idx, torch.tensor([2], dtype=torch.int32),
                                        sink, SCALE)
    cache = _cache_with(k, [1, 0])
    out2, lse2 = sparse_attention_decode(q.bfloat16(), cache, idx[:, :64], torch.tensor([2], dtype=torch.int32),
                                         sink, SCALE)
    assert torch.equal(out, out2) and torch.allclose(lse, lse2)


def _attn_args() -> dict:
    return dict(q=torch.zeros(2, 64, 512, dtype=torch.bfloat16), swa_cache=V4PagedCache.empty(1, 256),
                swa_indices=torch.zeros(2, 128, dtype=torch.int32), swa_lengths=torch.ones(2, dtype=torch.int32),
                sink=torch.zeros(64), softmax_scale=SCALE)


@pytest.mark.parametrize(("change", "argument"), [
    ({"q": torch.zeros(2, 32, 512, dtype=torch.bfloat16)}, "q"),
    ({"q": torch.zeros(2, 64, 512)}, "q"),
    ({"swa_indices": torch.zeros(2, 100, dtype=torch.int32)}, "swa_indices"),
    ({"swa_indices": torch.zeros(2, 128, dtype=torch.int64)}, "swa_indices"),
    ({"swa_cache": V4PagedCache.empty(1, 64)}, "swa_cache"),
    ({"swa_cache": torch.zeros(1, 10, dtype=torch.uint8)}, "swa_cache"),
    ({"sink": torch.zeros(32)}, "sink"),
    ({"softmax_scale": -1.0}, "softmax_scale"),
    ({"extra_cache": V4PagedCache.empty(1, 64)}, "extra_cache/extra_indices/extra_lengths"),
])
def test_attention_validator(change: dict, argument: str) -> None:
    """Each malformed sparse decode argument is refused by name."""
    with pytest.raises(InvalidArgumentError) as e:
        attn_contract.validate_decode(**{**_attn_args(), **change})
    assert e.value.argument == argument


def test_attention_checked_mode_reads_values() -> None:
    """Checked attention validation refuses out-of-range indices and lengths."""
    args = _attn_args()
    attn_contract.validate_decode(**args, checked=True)
    with pytest.raises(InvalidArgumentError, match="indices in"):
        attn_contract.validate_decode(**{**args, "swa_indices": torch.full((2, 128), 256, dtype=torch.int32)},
                                      checked=True)
    with pytest.raises(InvalidArgumentError, match="lengths in"):
        attn_contract.validate_decode(**{**args, "swa_lengths": torch.full((2,), 129, dtype=torch.int32)},
                                      checked=True)
    nan_q = args["q"].clone()
    nan_q[0, 0, 0] = float("nan")
    with pytest.raises(InvalidArgumentError, match="NaN"):
        attn_contract.validate_decode(**{**args, "q": nan_q}, checked=True)
    attn_contract.validate_decode(**{**args, "q": nan_q})  # unchecked: no read of the values
