"""Triton kernels that write and read the 584-byte V4 cache record (formats.v4_cache), bit-identical to
the reference quantizer. A program handles BLOCK_T tokens (see DEFAULT_TOKENS_PER_PROGRAM), each
to or from its own slot; no host sync and no allocation beyond the output, so both are CUDA-graph safe. FP8 bits
are decoded with integer arithmetic, and encoded by fp8_codec.fp8_bits (the hardware conversion where it rounds to
nearest even, else integer arithmetic), so e4m3fn and e4m3fnuz come out identical on NVIDIA, ROCm and the
interpreter (whose fp8 cast does not round to nearest even).

A program's tile is [BLOCK_T * SCALES, TILE_W]: row r is tile r % SCALES of token r // SCALES (the pad tile, index
NTILES, is masked), so the amax per 64-group is a row reduction whatever BLOCK_T is, and BLOCK_T = 1 is the
one-token-per-program kernel. The same rows carry the rope: row r moves rope values [8 * tile, 8 * tile + 8)."""

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
from dsv4hal.kernels.triton.fp8_codec import _decode_fp8, _pow2, fp8_bits, hardware_fp8
from dsv4hal.kernels.triton.v4_layout import HEAD, NOPE, NTILES, RECORD, SCALES, TILE_W

ROPE_W = tl.constexpr(TILE_W // SCALES)  # rope values per tile row: the 64 rope values over a token's 8 rows
assert ROPE_W * SCALES == TILE_W

# Tokens per program and warps, set by bench/tune_triton.py --ops cache on the H200 (tune-triton-cache.json): 8 tokens
# a program with 2 warps was the fastest of 19 configurations at 32768 tokens for both ops and both slot layouts
# (pack_store 0.84 / 0.68 of copy bandwidth contiguous / random, against 0.57 / 0.56 at one token a program).
# Compiled for sm_90 (Triton 3.6), tiles of 2+ tokens a warp issue about half the instructions per token (16-byte
# stores, per-row work shared) without spilling.
DEFAULT_TOKENS_PER_PROGRAM = 8
DEFAULT_NUM_WARPS = 2


@triton.jit
def _tile_rows(loc_ptr, n, cache_ptr, page_bytes, num_slots, P: tl.constexpr, BLOCK_T: tl.constexpr):
    """The program's BLOCK_T * SCALES tile rows: token row index, tile index, whether the token is one of the n,
    page base pointer and in-page offset of its slot, and whether the row moves nope bytes (a tile < NTILES) and
    rope values (any tile) of the slot. A token past n, or whose location is not a slot of the cache (-1, or an
    invalid one unchecked mode let through), masks its slot's rows: nothing outside the cache is touched."""
    r = tl.arange(0, BLOCK_T * SCALES)
    tile = r % SCALES
    row = tl.program_id(0).to(tl.int64) * BLOCK_T + r // SCALES  # row * stride_k passes 2**31 past 4M tokens
    # a token's SCALES rows read the same loc: one transaction per token, served from L1
    in_range = row < n
    loc = tl.load(loc_ptr + row, mask=in_range, other=-1).to(tl.int64)
    ok = (loc >= 0) & (loc < num_slots)
    loc = tl.where(ok, loc, 0)
    return row, tile, in_range, cache_ptr + (loc // P) * page_bytes, loc % P, ok & (tile < NTILES), ok


@triton.jit
def _pack_store_kernel(k_ptr, loc_ptr, cache_ptr, n, stride_k, page_bytes, num_slots, P: tl.constexpr,
                       FP8_MAX_C: tl.constexpr, AMAX_FLOOR_C: tl.constexpr, FNUZ: tl.constexpr,
                       BLOCK_T: tl.constexpr, HW_FP8: tl.constexpr):
    row, tile, in_range, base, off, nope_ok, rope_ok = _tile_rows(loc_ptr, n, cache_ptr, page_bytes, num_slots, P,
                                                                  BLOCK_T)
    c = tl.arange(0, TILE_W)
    k_row = k_ptr + row * stride_k
    # K is read whatever the slot (masks from loc would make these loads wait for it); only the stores skip
    x = tl.load(k_row[:, None] + tile[:, None] * TILE_W + c[None, :], mask=(in_range & (tile < NTILES))[:, None],
                other=0.0)
    # every load before the first store: the compiler cannot move a load across a store that may alias it
    w = tl.arange(0, ROPE_W)
    rope = tile[:, None] * ROPE_W + w[None, :]
    r = tl.load(k_row[:, None] + NOPE + rope, mask=in_range[:, None])
    x = x.to(tl.float32)
    amax = tl.maximum(tl.max(tl.abs(x), axis=1), AMAX_FLOOR_C)
    q = tl.math.div_rn(amax, FP8_MAX_C)  # IEEE division, as the reference's fp32 amax / FP8_MAX
    bits = q.to(tl.int32, bitcast=True)
    e = ((bits >> 23) & 0xFF) - 127 + ((bits & 0x7FFFFF) != 0).to(tl.int32)  # ceil(log2 q)
    inv = _pow2(-e)
    y = tl.minimum(tl.maximum(x * inv[:, None], -FP8_MAX_C), FP8_MAX_C)
    record = base + off * RECORD
    tl.store(record[:, None] + tile[:, None] * TILE_W + c[None, :], fp8_bits(y, FNUZ, HW_FP8), mask=nope_ok[:, None])
    tl.store((record + NOPE).to(tl.pointer_type(tl.bfloat16))[:, None] + rope, r, mask=rope_ok[:, None])
    tl.store(base + P * RECORD + off * SCALES + tile, (e + 127).to(tl.uint8), mask=nope_ok)


@triton.jit
def _dequant_gather_kernel(cache_ptr, loc_ptr, out_ptr, m, page_bytes, num_slots, P: tl.constexpr,
                           FNUZ: tl.constexpr, BLOCK_T: tl.constexpr):
    row, tile, in_range, base, off, nope_ok, rope_ok = _tile_rows(loc_ptr, m, cache_ptr, page_bytes, num_slots, P,
                                                                  BLOCK_T)
    c = tl.arange(0, TILE_W)
    record = base + off * RECORD
    b = tl.load(record[:, None] + tile[:, None] * TILE_W + c[None, :], mask=nope_ok[:, None], other=0)
    s = tl.load(base + P * RECORD + off * SCALES + tile, mask=nope_ok, other=127).to(tl.int32)
    w = tl.arange(0, ROPE_W)
    rope = tile[:, None] * ROPE_W + w[None, :]
    r = tl.load((record + NOPE).to(tl.pointer_type(tl.bfloat16))[:, None] + rope, mask=rope_ok[:, None], other=0.0)
    v = _decode_fp8(b, FNUZ) * _pow2(s - 127)[:, None]
    # every row < m is written, zeros for a skipped token (the masked loads above read 0 and scale 2**0)
    out_row = out_ptr + row * HEAD
    tl.store(out_row[:, None] + tile[:, None] * TILE_W + c[None, :], v.to(tl.bfloat16),
             mask=(in_range & (tile < NTILES))[:, None])
    tl.store(out_row[:, None] + NOPE + rope, r, mask=in_range[:, None])


def _tokens_per_program(n: int, block_t: int) -> int:
    """BLOCK_T for n tokens: the wanted power of two, but no larger than n needs (fewer masked rows, and no
    compilation of a wide variant for a single token)."""
    return min(block_t, triton.next_power_of_2(n))


def pack_store(k: torch.Tensor, loc: torch.Tensor, cache: V4PagedCache, config: dict | None = None) -> None:
    """config (tuning only): {"block_t": tokens per program, a power of two; "num_warps": warps}."""
    n = k.shape[0]
    if n == 0 or cache.num_slots == 0:
        return
    cfg = config or {}
    block_t = _tokens_per_program(n, cfg.get("block_t", DEFAULT_TOKENS_PER_PROGRAM))
    _pack_store_kernel[(triton.cdiv(n, block_t),)](
        k, loc, cache.data, n, k.stride(0), cache.data.stride(0), cache.num_slots, P=cache.page_size,
        FP8_MAX_C=FP8_MAX[cache.fp8], AMAX_FLOOR_C=AMAX_FLOOR, FNUZ=cache.fp8 == "e4m3fnuz", BLOCK_T=block_t,
        HW_FP8=hardware_fp8(k.device), num_warps=cfg.get("num_warps", DEFAULT_NUM_WARPS))


def dequant_gather(cache: V4PagedCache, loc: torch.Tensor, config: dict | None = None) -> torch.Tensor:
    """config (tuning only): as pack_store's."""
    m = loc.shape[0]
    out = torch.empty(m, HEAD_DIM, dtype=torch.bfloat16, device=cache.data.device)
    if m and cache.num_slots == 0:  # nothing to read: every row is zero
        out.zero_()
    elif m:
        cfg = config or {}
        block_t = _tokens_per_program(m, cfg.get("block_t", DEFAULT_TOKENS_PER_PROGRAM))
        _dequant_gather_kernel[(triton.cdiv(m, block_t),)](
            cache.data, loc, out, m, cache.data.stride(0), cache.num_slots, P=cache.page_size,
            FNUZ=cache.fp8 == "e4m3fnuz", BLOCK_T=block_t, num_warps=cfg.get("num_warps", DEFAULT_NUM_WARPS))
    return out
