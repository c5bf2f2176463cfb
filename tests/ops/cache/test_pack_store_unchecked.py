"""Unchecked pack_store and dequant_gather with locations past the cache or invalid negatives: nothing outside the
cache is written, the in-cache rows are the reference's, and the skipped rows gather as zeros."""

from __future__ import annotations

import pytest
import torch
from op_args import DEV, I32_MIN

from dsv4hal.formats.v4_cache import V4PagedCache, page_bytes
from dsv4hal.kernels.triton import v4_cache_kernels as tri_cache
from dsv4hal.reference import pack_store as ref_cache

pytest.importorskip("triton")


@pytest.mark.parametrize("impl", ["reference", "triton"])
def test_unchecked_pack_store_never_writes_outside(impl) -> None:  # noqa: ANN001
    """Locations past the cache or invalid negatives write nothing outside it, on the reference and Triton alike."""
    p = 64
    big = torch.zeros(3, page_bytes(p), dtype=torch.uint8, device=DEV)
    cache = V4PagedCache(big[:2], p)
    k = torch.randn(6, 512).bfloat16().to(DEV)
    loc = torch.tensor([0, 2 * p + 5, 1, -2, I32_MIN, 3 * p], device=DEV)
    store = ref_cache.pack_store if impl == "reference" else tri_cache.pack_store
    store(k, loc, cache)
    assert bool((big[2] == 0).all())  # the page past the cache is untouched
    want = V4PagedCache.empty(2, p, device=DEV)
    ref_cache.pack_store(k, torch.tensor([0, -1, 1, -1, -1, -1], device=DEV), want)
    assert torch.equal(cache.data, want.data)
    gather = ref_cache.dequant_gather if impl == "reference" else tri_cache.dequant_gather
    rows = gather(cache, loc)
    assert bool((rows[[1, 3, 4, 5]] == 0).all())
    assert torch.equal(rows[[0, 2]], ref_cache.dequant_gather(want, torch.tensor([0, 1], device=DEV)))
