"""Triton kernels that write and read the 584-byte V4 cache record (formats.v4_cache), bit-identical to
the reference quantizer. One program per token; no host sync and no allocation beyond the output, so
both are CUDA-graph safe. FP8 bits are encoded and decoded with integer arithmetic rather than the
hardware conversion, so e4m3fn and e4m3fnuz come out identical on NVIDIA, ROCm and the interpreter
(whose fp8 cast does not round to nearest even)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dsv4hal.formats.fp8 import FP8_MAX
from dsv4hal.formats.v4_cache import (
    AMAX_FLOOR,
    HEAD_DIM,
    V4PagedCache,
)
from dsv4hal.kernels.triton.fp8_codec import _decode_fp8, _encode_fp8, _pow2
from dsv4hal.kernels.triton.v4_layout import HEAD, NOPE, NTILES, RECORD, SCALES, TILE_W


@triton.jit
def _slot(loc_ptr, row, cache_ptr, page_bytes, num_slots, P: tl.constexpr):
    """Page base pointer and in-page offset of row's slot, with masks: [8, 64] over the 7 nope tiles, [64]
    over rope values, [8] over the 7 scale bytes. A location that is not a slot of the cache (-1, or an invalid
    one unchecked mode let through) masks everything: the row is skipped, nothing outside the cache is touched."""
    loc = tl.load(loc_ptr + row).to(tl.int64)
    # validity as tensors: the interpreter rejects scalar-and-tensor masks
    ok = (loc >= 0) & (loc < num_slots)
    valid = (tl.zeros([SCALES, TILE_W], dtype=tl.int32) + ok.to(tl.int32)) != 0
    valid_c = (tl.zeros([TILE_W], dtype=tl.int32) + ok.to(tl.int32)) != 0
    valid_t = (tl.zeros([SCALES], dtype=tl.int32) + ok.to(tl.int32)) != 0
    loc = tl.where(ok, loc, 0)
    t = tl.arange(0, SCALES)
    return (cache_ptr + (loc // P) * page_bytes, loc % P, (t[:, None] < NTILES) & valid, valid_c,
            (t < NTILES) & valid_t)


@triton.jit
def _pack_store_kernel(k_ptr, loc_ptr, cache_ptr, stride_k, page_bytes, num_slots, P: tl.constexpr,
                       FP8_MAX_C: tl.constexpr, AMAX_FLOOR_C: tl.constexpr, FNUZ: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)  # row * stride_k passes 2**31 past 4M tokens
    base, off, m2, valid_c, valid_t = _slot(loc_ptr, row, cache_ptr, page_bytes, num_slots, P)
    t = tl.arange(0, SCALES)
    c = tl.arange(0, TILE_W)
    x = tl.load(k_ptr + row * stride_k + t[:, None] * TILE_W + c[None, :], mask=m2, other=0.0).to(tl.float32)
    amax = tl.maximum(tl.max(tl.abs(x), axis=1), AMAX_FLOOR_C)
    q = tl.math.div_rn(amax, FP8_MAX_C)  # IEEE division, as the reference's fp32 amax / FP8_MAX
    bits = q.to(tl.int32, bitcast=True)
    e = ((bits >> 23) & 0xFF) - 127 + ((bits & 0x7FFFFF) != 0).to(tl.int32)  # ceil(log2 q)
    inv = _pow2(-e)
    y = tl.minimum(tl.maximum(x * inv[:, None], -FP8_MAX_C), FP8_MAX_C)
    tl.store(base + off * RECORD + t[:, None] * TILE_W + c[None, :], _encode_fp8(y, FNUZ), mask=m2)
    r = tl.load(k_ptr + row * stride_k + NOPE + c, mask=valid_c)
    rope_ptr = (base + off * RECORD + NOPE).to(tl.pointer_type(tl.bfloat16))
    tl.store(rope_ptr + c, r, mask=valid_c)
    tl.store(base + P * RECORD + off * SCALES + t, (e + 127).to(tl.uint8), mask=valid_t)


@triton.jit
def _dequant_gather_kernel(cache_ptr, loc_ptr, out_ptr, page_bytes, num_slots, P: tl.constexpr,
                           FNUZ: tl.constexpr):
    row = tl.program_id(0)
    base, off, m2, valid_c, valid_t = _slot(loc_ptr, row, cache_ptr, page_bytes, num_slots, P)
    t = tl.arange(0, SCALES)
    c = tl.arange(0, TILE_W)
    b = tl.load(base + off * RECORD + t[:, None] * TILE_W + c[None, :], mask=m2, other=0)
    s = tl.load(base + P * RECORD + off * SCALES + t, mask=valid_t, other=127).to(tl.int32)
    scale = _pow2(s - 127)
    v = _decode_fp8(b, FNUZ) * scale[:, None]
    out_row = out_ptr + row.to(tl.int64) * HEAD
    tl.store(out_row + t[:, None] * TILE_W + c[None, :], v.to(tl.bfloat16),
             mask=(t[:, None] < NTILES) & (c[None, :] < TILE_W))
    rope_ptr = (base + off * RECORD + NOPE).to(tl.pointer_type(tl.bfloat16))
    r = tl.load(rope_ptr + c, mask=valid_c, other=0.0)
    tl.store(out_row + NOPE + c, r)


def pack_store(k: torch.Tensor, loc: torch.Tensor, cache: V4PagedCache) -> None:
    n = k.shape[0]
    if n == 0 or cache.num_slots == 0:
        return
    _pack_store_kernel[(n,)](k, loc, cache.data, k.stride(0), cache.data.stride(0), cache.num_slots,
                             P=cache.page_size,
                             FP8_MAX_C=FP8_MAX[cache.fp8], AMAX_FLOOR_C=AMAX_FLOOR, FNUZ=cache.fp8 == "e4m3fnuz",
                             num_warps=2)


def dequant_gather(cache: V4PagedCache, loc: torch.Tensor) -> torch.Tensor:
    m = loc.shape[0]
    out = torch.empty(m, HEAD_DIM, dtype=torch.bfloat16, device=cache.data.device)
    if m and cache.num_slots == 0:  # nothing to read: every row is zero
        out.zero_()
    elif m:
        _dequant_gather_kernel[(m,)](cache.data, loc, out, cache.data.stride(0), cache.num_slots, P=cache.page_size,
                                     FNUZ=cache.fp8 == "e4m3fnuz", num_warps=2)
    return out

