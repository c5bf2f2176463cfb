"""Portable Triton sparse attention over the V4 cache (decode) and over a bf16 workspace (prefill).

Each program takes one query row, a block of heads and one split of the row's key list, which is the SWA indices
followed by the extra (C4/C128) indices. Keys are gathered by index and dequantized in registers as two 256-column
halves (FP8 e4m3fn or e4m3fnuz times the tile's UE8M0 scale, a bf16 product on NVIDIA; rope as bf16), scores (the
sum of the halves' dots) go through an online softmax in the log2 domain, and V is K: with dv_split 2 two programs
share a head block, each accumulating one half of the output (half the accumulator registers, the scores computed
twice). With several splits a combine kernel merges the partial results; the sink is folded in at the end (o *= 1 /
(1 + exp(sink - lse))). -1 and entries past the row's length are skipped, and so are indices that are not slots of
their cache (other negatives, indices past the end: invalid, refused in checked mode), so no input reads outside the
buffers; a row with no key gives 0 and lse = +inf. Fixed grids and buffers, no host sync: CUDA-graph safe."""

from __future__ import annotations

import math
import os

import torch
import triton
import triton.language as tl

from dsv4hal.formats.v4_cache import HEAD_DIM, V4PagedCache
from dsv4hal.kernels.triton.v4_layout import HEAD, NOPE, NTILES, RECORD, SCALES, TILE_W

LOG2E = 1.4426950408889634
# Triton's interpreter computes tl.dot on bf16 operands, and bf16 products, wrongly: fp32 there.
_DOT_F32 = os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def _fp8_half(base_ptr, off, valid, HALF: tl.constexpr, P: tl.constexpr, FNUZ: tl.constexpr, BK: tl.constexpr,
              F32: tl.constexpr):
    """bf16 [BK, 256]: columns HALF * 256 .. + 256 of the keys in the 584-byte records at (page base, offset of each
    key). A half holds four 64-column tiles: the codes times their UE8M0 scale (a power of two, so the bf16 product
    is exact; 4 scale loads a key rather than 256), and in the second half the last tile is the bf16 rope."""
    c = HALF * 256 + tl.arange(0, 256)
    is_nope = c[None, :] < NOPE
    rec = base_ptr[:, None] + off[:, None] * RECORD
    raw = tl.load(rec + c[None, :], mask=valid[:, None] & is_nope, other=0)
    tile = HALF * 4 + tl.arange(0, 4)
    s = tl.load(base_ptr[:, None] + P * RECORD + off[:, None] * SCALES + tile[None, :],
                mask=valid[:, None] & (tile[None, :] < NTILES), other=127)
    if FNUZ or F32:  # fp32 products (the interpreter's bf16 arithmetic is wrong)
        v = raw.to(tl.float8e4nv, bitcast=True).to(tl.float32)
        if FNUZ:  # same bits, half the value; 0x7F/0xFF are +-240 (NaN in e4m3fn)
            v = tl.where((raw & 0x7F) == 0x7F, tl.where(raw >= 0x80, -240.0, 240.0), v * 0.5)
        scale = (s.to(tl.int32) << 23).to(tl.float32, bitcast=True)  # 2**(s - 127)
    else:  # bf16 products: half the registers of fp32 ones
        v = raw.to(tl.float8e4nv, bitcast=True).to(tl.bfloat16)
        scale = (s.to(tl.int32) << 23).to(tl.float32, bitcast=True).to(tl.bfloat16)
    key = v * tl.reshape(tl.broadcast_to(scale[:, :, None], (BK, 4, TILE_W)), (BK, 256))
    key = key.to(tl.bfloat16)
    if HALF == 1:
        rope_ptr = (rec + NOPE).to(tl.pointer_type(tl.bfloat16))
        rope = tl.load(rope_ptr + (c[None, :] - NOPE), mask=valid[:, None] & (c[None, :] >= NOPE), other=0.0)
        key = tl.where(is_nope, key, rope)
    return key


@triton.jit
def _keys(idx, pos, limit, ptr, page_bytes, n_kv, P: tl.constexpr, FP8: tl.constexpr, FNUZ: tl.constexpr,
          BK: tl.constexpr, F32: tl.constexpr):
    """(valid, k0, k1): which of the BK listed keys count (within the row's length, a slot of the cache) and their
    two halves, bf16 [BK, 256] each (invalid keys are zero rows, never read)."""
    valid = (pos < limit) & (idx >= 0) & (idx < n_kv)
    safe = tl.where(valid, idx, 0).to(tl.int64)
    if FP8:
        base = ptr + (safe // P) * page_bytes
        k0 = _fp8_half(base, safe % P, valid, 0, P, FNUZ, BK, F32)
        k1 = _fp8_half(base, safe % P, valid, 1, P, FNUZ, BK, F32)
    else:  # the prefill's bf16 workspace [n_kv, 512]
        c = tl.arange(0, 256)
        row = ptr + safe[:, None] * HEAD + c[None, :]
        k0 = tl.load(row, mask=valid[:, None], other=0.0)
        k1 = tl.load(row + 256, mask=valid[:, None], other=0.0)
    return valid, k0, k1


@triton.jit
def _dot(a, b, DOT_F32: tl.constexpr):
    if DOT_F32:
        return tl.dot(a.to(tl.float32), b.to(tl.float32))
    return tl.dot(a, b)


@triton.jit
def _sparse_attn_kernel(
    q_ptr, sink_ptr, out_ptr, lse_ptr, part_o_ptr, part_ml_ptr,
    a_ptr, a_idx_ptr, a_len_ptr, a_page_bytes, a_stride_idx, W_A,
    b_ptr, b_idx_ptr, b_len_ptr, b_page_bytes, b_stride_idx, W_B,
    H, n_kv, n_kv_b, qk_scale, keys_per_split,
    P_A: tl.constexpr, P_B: tl.constexpr, FP8: tl.constexpr, FNUZ: tl.constexpr, HAS_B: tl.constexpr,
    BLOCK_H: tl.constexpr, BK: tl.constexpr, DIRECT: tl.constexpr, DOT_F32: tl.constexpr, DV_SPLIT: tl.constexpr,
):
    """Scores from both halves of q and k; values from both halves (DV_SPLIT 1) or from the program's half
    (DV_SPLIT 2: two programs share a head block, each keeping half the output in registers)."""
    t = tl.program_id(0).to(tl.int64)
    hb = tl.program_id(1) // DV_SPLIT
    dv = tl.program_id(1) % DV_SPLIT
    split = tl.program_id(2)
    nsplit = tl.num_programs(2)
    h = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    c = tl.arange(0, 256)
    q_row = q_ptr + (t * H + h[:, None]) * HEAD + c[None, :]
    q0 = tl.load(q_row)
    q1 = tl.load(q_row + 256)
    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc0 = tl.zeros([BLOCK_H, 256], tl.float32)
    acc1 = tl.zeros([BLOCK_H, 256], tl.float32)  # DV_SPLIT 1 only (dead, and dropped, otherwise)
    a_len = tl.load(a_len_ptr + t)
    wa_pad = tl.cdiv(W_A, BK) * BK  # the extra keys' first position: no block straddles the two lists
    total = wa_pad
    b_len = 0
    if HAS_B:
        b_len = tl.load(b_len_ptr + t)
        total += W_B
    lo = split * keys_per_split
    hi = tl.minimum(lo + keys_per_split, total)
    j = tl.arange(0, BK)
    for start in range(lo, hi, BK):
        pos = start + j
        if start < wa_pad:
            idx = tl.load(a_idx_ptr + t * a_stride_idx + pos, mask=pos < W_A, other=-1)
            valid, k0, k1 = _keys(idx, pos, a_len, a_ptr, a_page_bytes, n_kv, P_A, FP8, FNUZ, BK, DOT_F32)
        else:
            pb = pos - wa_pad
            idx = tl.load(b_idx_ptr + t * b_stride_idx + pb, mask=pb < W_B, other=-1)
            valid, k0, k1 = _keys(idx, pb, b_len, b_ptr, b_page_bytes, n_kv_b, P_B, True, FNUZ, BK, DOT_F32)
        s = _dot(q0, tl.trans(k0), DOT_F32) + _dot(q1, tl.trans(k1), DOT_F32)
        s = tl.where(valid[None, :], s * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.math.exp2(m_i - m_safe)
        p = tl.math.exp2(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        m_i = m_new
        pb16 = p.to(tl.bfloat16)
        if DV_SPLIT == 1:
            acc0 = acc0 * alpha[:, None] + _dot(pb16, k0, DOT_F32)
            acc1 = acc1 * alpha[:, None] + _dot(pb16, k1, DOT_F32)
        elif dv == 0:
            acc0 = acc0 * alpha[:, None] + _dot(pb16, k0, DOT_F32)
        else:
            acc0 = acc0 * alpha[:, None] + _dot(pb16, k1, DOT_F32)
    col0 = dv * 256 + c  # acc0's columns; acc1's are 256 + c
    first = (h * 0 + dv) == 0  # [BLOCK_H]: the program that writes the row statistics
    if DIRECT:
        lse2 = m_i + tl.math.log2(l_i)
        sink = tl.load(sink_ptr + h) * 1.4426950408889634
        empty = l_i == 0.0
        factor = tl.where(empty, 0.0, 1.0 / (l_i * (1.0 + tl.math.exp2(sink - lse2))))
        o_row = out_ptr + (t * H + h[:, None]) * HEAD
        tl.store(o_row + col0[None, :], (acc0 * factor[:, None]).to(tl.bfloat16))
        if DV_SPLIT == 1:
            tl.store(o_row + 256 + c[None, :], (acc1 * factor[:, None]).to(tl.bfloat16))
        tl.store(lse_ptr + t * H + h, tl.where(empty, float("inf"), lse2 * 0.6931471805599453), mask=first)
    else:
        row = (t * H + h) * nsplit + split
        o_row = part_o_ptr + row[:, None] * HEAD
        tl.store(o_row + col0[None, :], acc0)
        if DV_SPLIT == 1:
            tl.store(o_row + 256 + c[None, :], acc1)
        tl.store(part_ml_ptr + row * 2, m_i, mask=first)
        tl.store(part_ml_ptr + row * 2 + 1, l_i, mask=first)


@triton.jit
def _combine_kernel(part_o_ptr, part_ml_ptr, sink_ptr, out_ptr, lse_ptr, H, NSPLIT: tl.constexpr,
                    SPLIT_P2: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)  # t * H + h
    h = row % H
    s = tl.arange(0, SPLIT_P2)
    ms = s < NSPLIT
    m = tl.load(part_ml_ptr + (row * NSPLIT + s) * 2, mask=ms, other=float("-inf"))
    l = tl.load(part_ml_ptr + (row * NSPLIT + s) * 2 + 1, mask=ms, other=0.0)
    m_max = tl.max(m, axis=0)
    m_safe = tl.where(m_max == float("-inf"), 0.0, m_max)
    w = tl.math.exp2(m - m_safe)
    l_tot = tl.sum(l * w, axis=0)
    d = tl.arange(0, HEAD)
    o = tl.load(part_o_ptr + (row * NSPLIT + s[:, None]) * HEAD + d[None, :], mask=ms[:, None], other=0.0)
    o = tl.sum(o * w[:, None], axis=0)
    lse2 = m_safe + tl.math.log2(l_tot)
    sink = tl.load(sink_ptr + h) * 1.4426950408889634
    empty = l_tot == 0.0
    factor = tl.where(empty, 0.0, 1.0 / (l_tot * (1.0 + tl.math.exp2(sink - lse2))))
    tl.store(out_ptr + row * HEAD + d, (o * factor).to(tl.bfloat16))
    tl.store(lse_ptr + row, tl.where(empty, float("inf"), lse2 * 0.6931471805599453))


# Launch configurations (heads per program, keys per block, warps, pipeline stages, the program count the split-K
# count aims at, programs sharing a head block), from `python3 bench/tune_triton.py --ops attention` on the H100
# (bench/results/h100/tune-triton-attention.json, random keys over a 4M-slot pool, us at 64 query rows): key lists of
# up to SHORT_KEYS take SHORT_CONFIG (SWA alone 20.1 where CONFIG takes 30.3 and FlashMLA 38.5; SWA + 64 C128 keys
# 27.9 / 34.2 / 42.3), longer lists CONFIG (SWA + top-512: 68.4 where SHORT_CONFIG takes 92.1 and FlashMLA 75.1; at
# 256 rows 217.1, FlashMLA 138.9). Loading each block's indices two blocks ahead and asking L2 for its keys one block
# ahead measured slower with each launch (C4 69.6 -> 74.7 us, C128 at 8K 27.7 -> 37.2 us:
# h100/tune-triton-attention-prefetch.json, at commit 120746c) and is not an option.
CONFIG = {"block_h": 64, "bk": 32, "num_warps": 8, "num_stages": 2, "programs": 132, "dv_split": 1}
SHORT_CONFIG = {"block_h": 16, "bk": 64, "num_warps": 4, "num_stages": 2, "programs": 264, "dv_split": 1}
SHORT_KEYS = 256


def _launch(q, sink, softmax_scale, a, a_idx, a_len, b=None, b_idx=None, b_len=None, *, fp8_source: bool,  # noqa: ANN001, ANN202
            config: dict | None = None):
    w_a = a_idx.shape[1]
    w_b = 0 if b_idx is None else b_idx.shape[1]
    cfg = {**(SHORT_CONFIG if w_a + w_b <= SHORT_KEYS else CONFIG), **(config or {})}
    BLOCK_H, BK = cfg["block_h"], cfg["bk"]  # noqa: N806
    t, h, _ = q.shape
    dev = q.device
    out = torch.empty(t, h, HEAD_DIM, dtype=torch.bfloat16, device=dev)
    lse = torch.empty(t, h, dtype=torch.float32, device=dev)
    if t == 0:
        return out, lse
    # the extra keys start at the block after the SWA ones; width 0: one split whose loop is empty
    total_blocks = max(1, triton.cdiv(w_a, BK) + triton.cdiv(w_b, BK))
    heads = triton.cdiv(h, BLOCK_H)
    dv_split = cfg["dv_split"]
    nsplit = max(1, min(total_blocks, cfg["programs"] // max(1, t * heads * dv_split)))
    keys_per_split = triton.cdiv(total_blocks, nsplit) * BK
    nsplit = max(1, triton.cdiv(total_blocks * BK, keys_per_split))
    direct = nsplit == 1
    part_o = part_ml = out  # unused when direct
    if not direct:
        part_o = torch.empty(t * h * nsplit, HEAD_DIM, dtype=torch.float32, device=dev)
        part_ml = torch.empty(t * h * nsplit, 2, dtype=torch.float32, device=dev)
    if fp8_source:
        a_data, a_page, p_a, fnuz = a.data, a.data.stride(0), a.page_size, a.fp8 == "e4m3fnuz"
        n_kv = a.num_slots
    else:
        a_data, a_page, p_a, fnuz, n_kv = a, 0, 1, False, a.shape[0]
    has_b = b is not None
    # without an extra cache the (never taken) extra branch still compiles: give it a byte pointer
    b_data = b.data if has_b else torch.empty(1, dtype=torch.uint8, device=dev)
    _sparse_attn_kernel[(t, heads * dv_split, nsplit)](
        q, sink, out, lse, part_o, part_ml,
        a_data, a_idx, a_len, a_page, a_idx.stride(0), w_a,
        b_data, b_idx if has_b else a_idx, b_len if has_b else a_len, b.data.stride(0) if has_b else 0,
        b_idx.stride(0) if has_b else 0, w_b,
        h, n_kv, b.num_slots if has_b else 0, softmax_scale * LOG2E, keys_per_split,
        P_A=p_a, P_B=b.page_size if has_b else 1, FP8=fp8_source, FNUZ=fnuz, HAS_B=has_b,
        BLOCK_H=BLOCK_H, BK=BK, DIRECT=direct, DOT_F32=_DOT_F32, DV_SPLIT=dv_split, num_warps=cfg["num_warps"],
        num_stages=cfg["num_stages"])
    if not direct:
        _combine_kernel[(t * h,)](part_o, part_ml, sink, out, lse, h, NSPLIT=nsplit,
                                  SPLIT_P2=triton.next_power_of_2(nsplit), num_warps=4)
    return out, lse


def sparse_attention_decode(q: torch.Tensor, swa_cache: V4PagedCache, swa_indices: torch.Tensor,
                            swa_lengths: torch.Tensor, sink: torch.Tensor, softmax_scale: float,
                            extra_cache: V4PagedCache | None = None, extra_indices: torch.Tensor | None = None,
                            extra_lengths: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    return _launch(q, sink, softmax_scale, swa_cache, swa_indices, swa_lengths, extra_cache, extra_indices,
                   extra_lengths, fp8_source=True)


def sparse_attention_prefill(q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor, lengths: torch.Tensor,
                             sink: torch.Tensor, softmax_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    return _launch(q, sink, softmax_scale, kv, indices, lengths, fp8_source=False)


assert math.isclose(LOG2E, 1 / math.log(2))
