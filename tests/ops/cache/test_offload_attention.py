"""Attention over an offloaded C4 pool (fetch into a working set of a quarter of the pool, then sparse attention
over the working set with the remapped indices) equals attention over the resident pool bit for bit, step after
step with LRU evictions, for the reference and the Triton kernels."""

from __future__ import annotations

import pytest
import torch
from op_args import DEV, REFERENCE, TRITON, cache, forced

from dsv4hal.offload.pool import OffloadedPool

POOL_PAGES, WORKING, T, K, STEPS = 16, 4, 2, 64, 5


def _step_inputs(step: int) -> dict:
    g = torch.Generator().manual_seed(100 + step)
    # row 0 reads 3 pages (of 16), row 1 two, one of them shared: 4 distinct pages, the working set
    pages = torch.randperm(POOL_PAGES, generator=g)[:4]
    rows = torch.stack([pages[:3][torch.randint(0, 3, (K,), generator=g)],
                        pages[[0, 3]][torch.randint(0, 2, (K,), generator=g)]])
    idx = rows * 64 + torch.randint(0, 64, (T, K), generator=g)
    idx[:, -5:] = -1
    return dict(q=torch.randn(T, 64, 512, generator=g).bfloat16().to(DEV), extra_indices=idx.int().to(DEV),
                extra_lengths=torch.tensor([K, K - 9], dtype=torch.int32, device=DEV))


@pytest.mark.parametrize("kernels", ["reference", "triton"])
def test_attention_over_offloaded_pool_equals_resident_pool_bit_for_bit(kernels: str) -> None:
    """Five steps over a pool offloaded to a working set of a quarter of its pages give the resident outputs."""
    if kernels == "triton":
        pytest.importorskip("triton")
    platform = (forced({**TRITON, "offload_fetch": "triton_offload_fetch"}, checked=True) if kernels == "triton"
                else forced(REFERENCE, checked=True))
    swa, pool = cache(1), cache(POOL_PAGES, 64, seed=5)
    off = OffloadedPool(platform, 0, WORKING, host=pool, device=DEV)
    g = torch.Generator().manual_seed(7)
    swa_idx = torch.randint(0, 256, (T, 64), generator=g, dtype=torch.int32).to(DEV)
    common = dict(swa_cache=swa, swa_indices=swa_idx, swa_lengths=torch.full((T,), 64, dtype=torch.int32, device=DEV),
                  sink=torch.randn(64, generator=g).to(DEV), softmax_scale=512**-0.5)
    attend = platform.ops.sparse_attention_decode
    for step in range(STEPS):
        inp = _step_inputs(step)
        want = attend(inp["q"], extra_cache=pool, extra_indices=inp["extra_indices"],
                      extra_lengths=inp["extra_lengths"], **common)
        remapped = off.fetch(inp["extra_indices"])
        got = attend(inp["q"], extra_cache=off.working, extra_indices=remapped, extra_lengths=inp["extra_lengths"],
                     **common)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), f"step {step}"
    stats = off.stats()
    assert stats["misses"] > WORKING  # evictions happened: more pages loaded than the working set holds
    assert stats["hits"] > 0 and stats["bytes_in"] == stats["misses"] * pool.data.shape[1]
    assert stats["working_bytes"] * 4 <= stats["pool_bytes"]
