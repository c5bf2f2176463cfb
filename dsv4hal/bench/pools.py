"""Large V4 caches filled with valid random records (finite FP8 and bf16, plausible scales), built on
the device without the quantizer, so benchmarks can gather from pools of millions of entries."""

from __future__ import annotations

from dsv4hal.formats.v4_cache import NOPE_DIM, RECORD_BYTES, TOKEN_BYTES, V4PagedCache


def random_pool(num_slots: int, page_size: int, fp8: str = "e4m3fn", device: str = "cuda") -> V4PagedCache:
    pages = -(-num_slots // page_size)
    cache = V4PagedCache.empty(pages, page_size, fp8, device)
    d = cache.data
    d.random_(0, 256)
    rec = d[:, : page_size * RECORD_BYTES].view(pages, page_size, RECORD_BYTES)
    rec[:, :, :NOPE_DIM].bitwise_and_(0x77)  # exponent < 15: finite e4m3 in either flavour
    rec[:, :, NOPE_DIM + 1::2].bitwise_and_(0xBF)  # bf16 high bytes: exponent < 128, finite and < 2
    scales = d[:, page_size * RECORD_BYTES: page_size * TOKEN_BYTES].view(pages, page_size, 8)
    scales.bitwise_and_(3).add_(120)
    return cache
