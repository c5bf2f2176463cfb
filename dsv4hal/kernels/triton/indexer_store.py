"""indexer_store (dsv4hal.ops.indexer_store) in Triton: quantize [N, 128] rows to FP8 with one fp32 scale each
and scatter them into the 132-byte indexer cache, bit-identical to the reference. ROWS rows a program; the scale
is an IEEE division (div_rn) as the reference's fp32 amax / FP8_MAX, rounded up to a power of two from its bits
for scale="pow2"; values are k / s (div_rn) clamped to +-FP8_MAX and encoded with the integer codec (fp8_codec),
so e4m3fn and e4m3fnuz come out the same on NVIDIA, ROCm and the interpreter. Rows whose location is not a slot
of the cache (-1 and the invalid ones) are masked: no host sync, fixed grid, CUDA-graph safe."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dsv4hal.formats.fp8 import FP8_MAX
from dsv4hal.formats.indexer_cache import AMAX_FLOOR, INDEX_DIM, PAGE_SIZE, IndexerPagedCache
from dsv4hal.kernels.triton.fp8_codec import _pow2, fp8_bits, hardware_fp8

ROWS = 8


@triton.jit
def _indexer_store_kernel(k_ptr, loc_ptr, cache_ptr, n, stride_k, stride_loc, page_bytes, num_slots,
                          ROWS: tl.constexpr, D: tl.constexpr, P: tl.constexpr, FP8_MAX_C: tl.constexpr,
                          AMAX_FLOOR_C: tl.constexpr, POW2: tl.constexpr, FNUZ: tl.constexpr,
                          HW_FP8: tl.constexpr):
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    d = tl.arange(0, D)
    in_n = r < n
    loc = tl.load(loc_ptr + r.to(tl.int64) * stride_loc, mask=in_n, other=-1).to(tl.int64)
    keep = in_n & (loc >= 0) & (loc < num_slots)
    x = tl.load(k_ptr + r.to(tl.int64)[:, None] * stride_k + d[None, :], mask=keep[:, None], other=0.0)
    x = x.to(tl.float32)
    amax = tl.maximum(tl.max(tl.abs(x), axis=1), AMAX_FLOOR_C)
    s = tl.math.div_rn(amax, tl.full([ROWS], FP8_MAX_C, tl.float32))
    if POW2:  # 2**ceil(log2 s): the exponent, plus one unless the mantissa is zero
        bits = s.to(tl.int32, bitcast=True)
        s = _pow2(((bits >> 23) & 0xFF) - 127 + ((bits & 0x7FFFFF) != 0).to(tl.int32))
    y = tl.math.div_rn(x, tl.broadcast_to(s[:, None], (ROWS, D)))
    y = tl.minimum(tl.maximum(y, -FP8_MAX_C), FP8_MAX_C)
    slot = tl.maximum(loc, 0)
    base = cache_ptr + (slot // P) * page_bytes
    off = slot % P
    tl.store(base[:, None] + off[:, None] * D + d[None, :], fp8_bits(y, FNUZ, HW_FP8), mask=keep[:, None])
    tl.store((base + P * D + off * 4).to(tl.pointer_type(tl.float32)), s, mask=keep)


def indexer_store(k: torch.Tensor, loc: torch.Tensor, cache: IndexerPagedCache, scale: str = "amax") -> None:
    n = k.shape[0]
    if n == 0 or cache.num_pages == 0:
        return
    if k.stride(1) != 1:
        k = k.contiguous()
    _indexer_store_kernel[(triton.cdiv(n, ROWS),)](
        k, loc, cache.data, n, k.stride(0), loc.stride(0), cache.data.stride(0), cache.num_slots, ROWS=ROWS,
        D=INDEX_DIM, P=PAGE_SIZE, FP8_MAX_C=FP8_MAX[cache.fp8], AMAX_FLOOR_C=AMAX_FLOOR, POW2=scale == "pow2",
        FNUZ=cache.fp8 == "e4m3fnuz", HW_FP8=hardware_fp8(k.device), num_warps=4)
