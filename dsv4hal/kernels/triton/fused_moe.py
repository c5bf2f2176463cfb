"""Portable Triton fused MoE (routed experts) for MXFP4 and FP8 128x128 block-scaled weights.

Layout "triton-moe-v2" (prepare_weights): the logical ExpertWeights tensors in a TritonMoeWeights: w13 [E, 2I,
H(/2)] and w2 [E, H, I(/2)] are K-contiguous rows, which is what a weight tile loaded along K wants (each row's K run
is coalesced). FP8 values are kept as raw uint8 bytes, uncopied (decoded in registers with integer arithmetic, so
e4m3fn and e4m3fnuz decode identically on NVIDIA, ROCm and the interpreter); FP8 block scales stay fp32
[E, ceil(N/128), ceil(K/128)]. MXFP4 keeps its UE8M0 bytes; its packed nibbles are copied with the bits of each
16-bit element (the four e2m1 codes of k = 4e .. 4e + 3) reordered so that the decode takes few instructions (see
MX_BITS below).

Algorithm (no host sync, fixed-size buffers: CUDA-graph safe):
  1. align (torch ops on the device): the T*k (token, slot) pairs are sorted by expert (stable), each
     expert's run is padded up to a multiple of BLOCK_M, and every BLOCK_M block gets its expert (-1 for
     unused blocks). The buffers are sized for the worst case, T*k + min(E, T*k) * (BLOCK_M - 1) rows,
     so nothing depends on the routing's values. Ids < 0 (and >= E) go to no block: they contribute 0.
  2. kernel 1, grid (blocks, I / BLOCK_N): gathered x rows [BLOCK_M, H] times the expert's gate (w1) and
     up (w3) tiles, dequantized in registers, two fp32 accumulators; then the clamped SwiGLU of
     moe_activation, h = silu(min(g, limit)) * clamp(u, -limit, limit), stored bf16 at the pair's sorted row.
  3. kernel 2, grid (blocks, H / BLOCK_N): h rows [BLOCK_M, I] times the expert's w2 tiles, scaled by the
     pair's routing weight and atomically added (fp32) into y [T, H]; y is cast to bf16 at the end.

MXFP4 decode (T <= 64) runs two other kernels with the same algorithm and buffers: the weight rows are the
dot's M and the tokens its N, the activations and h are split by k mod 4 (see "MXFP4, weights as the M operand"
below); for one token they skip the alignment (a block a route), and the down kernel's last program of each column
tile writes it as bf16 (no cast launch). Shapes whose H or I is not a multiple of 64 run the row kernels.

Dequantization: MXFP4 weights are read as 16-bit elements, decoded into four operands (one per k mod 4) that are
dotted against the matching activations, exactly in bf16 (by inline PTX on NVIDIA GPUs, in plain Triton elsewhere:
_mx_quarters). FP8 codes are exact in bf16;
the 128x128 block scale is constant along K inside a tile (BLOCK_K divides 128) and is applied per output
column after the dot, as DeepGEMM does. Activations stay bf16 (W4A16 / W8A16); accumulation is fp32.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from dsv4hal.formats.experts import ExpertWeights
from dsv4hal.kernels.moe_align import align_routes
from dsv4hal.kernels.triton.device import sm_count
from dsv4hal.kernels.triton.fp8_codec import _decode_fp8
from dsv4hal.kernels.triton.moe_activation import _swiglu_f32, _to_bf16, swiglu_limit_args
from dsv4hal.ops.moe import DECODE_MAX_TOKENS
from dsv4hal.prepared import ExpertTensors

LAYOUT = "triton-moe-v2"
# Triton's interpreter computes tl.dot on bf16 operands wrongly: upcast them to fp32 there.
_DOT_F32 = os.environ.get("TRITON_INTERPRET") == "1"
# The swapped MXFP4 kernels decode with inline PTX on NVIDIA GPUs, in plain Triton elsewhere (same values).
_MX_ASM = not _DOT_F32 and torch.version.hip is None

# Tile sizes per (format, token class), the fastest of nine each on an H200 with V4-Flash experts at T = 64 and
# 4096 (bench/results/h200/tune-moe.json; every one checked against the float64 oracle there). BLOCK_M is the
# rows of one expert block: 16 for decode (a few pairs per expert), 64-128 for prefill. MXFP4 decode runs the
# swapped kernels (below) with blocks of 8 routes, the fastest of 43 settings at T = 1 .. 64 on the H200 and
# 4.7-5.5x the row kernels (bench/results/h200/sweep-mx-moe-decode.json); "swap" (MXFP4 only): False selects the
# row kernels. "pair" (swapped kernels): gate and up rows of the same outputs in one tile, twice the gate-up programs;
# None (the default) pairs when the unpaired grid would give each SM fewer than two programs: on the H200 V4-Flash
# at T = 1 (192 programs for 132 SMs) 47.1 -> 42.8 us, and slower from T = 2 (sweep-mx-moe-decode.json, "grid_v3").
CONFIGS = {
    ("mxfp4", "decode"): {"block_m": 8, "block_n": 64, "block_k": 256, "num_warps": 4, "num_stages": 3,
                          "swap": True},
    ("mxfp4", "prefill"): {"block_m": 64, "block_n": 64, "block_k": 128, "num_warps": 4, "num_stages": 3},
    ("fp8_block", "decode"): {"block_m": 16, "block_n": 32, "block_k": 128, "num_warps": 4, "num_stages": 3},
    ("fp8_block", "prefill"): {"block_m": 128, "block_n": 64, "block_k": 64, "num_warps": 4, "num_stages": 3},
}
FP8_BLOCK = 128
SWAP_MAX_BLOCK_K = 1024  # the swapped MXFP4 kernels' K tile: 512 bytes of a weight row
SWAP_MIN_BLOCK_K = 64  # each of its four dots needs K >= 16; H and I must be multiples (else: the row kernels)
DOWN_KEYS = ("block_n", "block_k", "num_warps", "num_stages")  # config "down": the swapped down kernel's own tiles
# The swapped down kernel's default tiles for 2 .. 16 tokens: 128 output rows a program instead of 64 (half the
# programs, each streaming twice the rows). On the H200 (V4-Flash, four runs: sweep-mx-moe-decode.json "grid_v5",
# ab-mx-moe-decode.json) 1-5% faster at T = 2 .. 16, and slower at T = 1 (by 2-3 us) and T = 64 (by 1-7%).
DOWN_WIDE = {"block_n": 128}
DOWN_WIDE_TOKENS = range(2, 17)
ROW_DECODE_TILES = {"block_m": 16, "block_n": 64, "block_k": 64}  # the row kernels' decode tiles (the former default)


# The MXFP4 element layout: a 16-bit element holds the e2m1 codes of k = 4e + j (j = 0..3), code j's magnitude
# bits (e1 e0 m) at MX_BITS[j][0] .. + 2 and its sign at MX_BITS[j][1]. The decode places them at bf16 bits 6..8 and
# 15 with one shift when the two offsets agree (j = 0: none, j = 1: 3), two shifts else: 11 integer instructions for
# four bf16x2 registers on sm_90a (5 shifts, 6 LOP3), the fewest of any such order (the byte order, nibble j at bits
# 4j, needs 15; tests/ops/moe/test_triton_mx_decode.py searches them all).
MX_BITS = ((6, 15), (3, 12), (0, 13), (9, 14))
# Scale bytes up to this value let the PTX multiply once, by 2**(s - 1) (a normal bf16); larger bytes (scales above
# 2, and NaN) take a second multiply. prepare_weights records which.
MX_NARROW_SCALE_MAX = 128


@dataclass(frozen=True)
class TritonMoeWeights(ExpertTensors):
    """Payload of weights prepared for triton_fused_moe (layout triton-moe-v2, see the module doc): w13 uint8
    [E, 2I, H/2] (mxfp4, elements reordered: MX_BITS) or [E, 2I, H] FP8 bytes, w13_scale uint8 [E, 2I, H/32] or
    fp32 [E, ceil(2I/128), ceil(H/128)]; w2 uint8 [E, H, I/2] or [E, H, I], w2_scale uint8 [E, H, I/32] or fp32
    [E, ceil(H/128), ceil(I/128)]."""

    format: str  # "mxfp4" or "fp8_block"
    fnuz: bool  # fp8_block only: e4m3fnuz codes (bias 8) rather than e4m3fn
    narrow_scales: bool = False  # mxfp4 only: every scale byte <= MX_NARROW_SCALE_MAX


def reorder_mxfp4(packed: torch.Tensor) -> torch.Tensor:
    """Packed e2m1 bytes [..., K/2] (two codes a byte, low nibble first) -> the same shape with each 16-bit element's
    bits in the MX_BITS order, a new tensor. One expert at a time, so the int32 scratch stays small."""
    out = torch.empty_like(packed)
    src = packed.view(torch.int16)
    src = src.reshape(-1, *src.shape[-2:])  # [experts, rows, elements]
    dst = out.view(torch.int16).reshape(src.shape)
    for i in range(src.shape[0]):
        u = src[i].to(torch.int32) & 0xFFFF
        v = torch.zeros_like(u)
        for j, (magnitude, sign) in enumerate(MX_BITS):
            code = u >> (4 * j)
            v |= ((code & 7) << magnitude) | (((code >> 3) & 1) << sign)
        dst[i] = (v - ((v & 0x8000) << 1)).to(torch.int16)
    return out


def prepare_weights(w: ExpertWeights) -> TritonMoeWeights:
    """Logical ExpertWeights -> TritonMoeWeights: FP8 uncopied (made contiguous), MXFP4 nibbles reordered. The MXFP4
    scale bytes are read once here (a host sync at load time) to record whether all are narrow."""
    def raw(t: torch.Tensor) -> torch.Tensor:
        t = t.contiguous()
        return t if t.dtype == torch.uint8 or t.dtype == torch.float32 else t.view(torch.uint8)

    mx = w.format == "mxfp4"
    if mx:
        s13, s2 = raw(w.w13_scale), raw(w.w2_scale)
        narrow = max(int(s13.max()), int(s2.max())) <= MX_NARROW_SCALE_MAX if s13.numel() and s2.numel() else True
        return TritonMoeWeights(
            format=w.format, fnuz=False, narrow_scales=narrow, w13=reorder_mxfp4(raw(w.w13)), w13_scale=s13,
            w2=reorder_mxfp4(raw(w.w2)), w2_scale=s2, num_experts=w.num_experts, hidden=w.hidden,
            intermediate=w.intermediate)
    return TritonMoeWeights(
        format=w.format, fnuz=w.fp8 == "e4m3fnuz", w13=raw(w.w13), w13_scale=w.w13_scale.float().contiguous(),
        w2=raw(w.w2), w2_scale=w.w2_scale.float().contiguous(), num_experts=w.num_experts, hidden=w.hidden,
        intermediate=w.intermediate)


# ----------------------------------------------------------------------------- in-register dequant

@triton.jit
def _e2m1(c):
    """4-bit e2m1 codes (int32) -> fp32: magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6; bit 3 is the sign. In integer
    bits, so that -0 stays -0 (a float negation compiles to 0 - v on NVIDIA, which gives +0)."""
    m = c & 7
    ex = m >> 1
    mant = m & 1
    magnitude = tl.where(ex == 0, mant * 0x3F000000, ((ex + 126) << 23) | (mant << 22))  # 0x3F000000: 0.5
    return (magnitude | ((c & 8) << 28)).to(tl.float32, bitcast=True)


@triton.jit
def _ue8m0(s):
    """UE8M0 bytes (int32) -> 2**(s - 127) from the exponent bits, exactly (0 is the subnormal 2**-127, which a GPU
    that flushes fp32 subnormals multiplies as 0); 0xFF is NaN (OCP MX)."""
    bits = tl.where(s == 0, 0x400000, tl.where(s == 255, 0x7FC00000, s << 23))
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _dot_quarters(acc, a, b):
    """acc + the sum over j of a[j] @ b[j]: the four operands of k mod 4 (tuples of four tiles)."""
    acc = tl.dot(a[0], b[0], acc)
    acc = tl.dot(a[1], b[1], acc)
    acc = tl.dot(a[2], b[2], acc)
    return tl.dot(a[3], b[3], acc)


@triton.jit
def _mx_x_quarters(rows, e, mask, quarter, DTYPE: tl.constexpr):
    """Row kernels: rows [BM, 1] (pointers) of activations split by k mod 4 ([rows, 4, K / 4], quarter: K / 4), at
    k = 4e + j -> the four tiles [BM, BKE], j = 0..3 (contiguous runs, as the swapped kernels load them)."""
    k = e[None, :]
    x0 = tl.load(rows + k, mask=mask, other=0.0).to(DTYPE)
    x1 = tl.load(rows + quarter + k, mask=mask, other=0.0).to(DTYPE)
    x2 = tl.load(rows + 2 * quarter + k, mask=mask, other=0.0).to(DTYPE)
    x3 = tl.load(rows + 3 * quarter + k, mask=mask, other=0.0).to(DTYPE)
    return x0, x1, x2, x3


@triton.jit
def _fp8_tile(w_base, n, k, mask, stride_wn, FNUZ: tl.constexpr, DTYPE: tl.constexpr):
    """Weight rows n, columns k -> unscaled FP8 values [BLOCK_K, BLOCK_N] (exact in bf16)."""
    b = tl.load(w_base + n[None, :] * stride_wn + k[:, None], mask=mask, other=0)
    return _decode_fp8(b, FNUZ).to(DTYPE)


@triton.jit
def _fp8_col_scale(s_base, n, nmask, k0, stride_sn, stride_sk):
    """Per output column n, the 128x128 block scale of the K tile starting at k0 (BLOCK_K divides 128)."""
    return tl.load(s_base + (n // 128) * stride_sn + (k0 // 128) * stride_sk, mask=nmask, other=0.0)


# ----------------------------------------------------------------------------- kernels

@triton.jit
def _block_routes(sorted_ptr, pid_m, num_pairs, top_k, BLOCK_M: tl.constexpr, DIRECT: tl.constexpr = False):
    """Expert block pid_m's rows of the aligned routes -> (rows, valid, route (0 where padding), token (0 where
    padding: a padding row reads token 0 and is never stored)). DIRECT: no alignment, block pid_m is route pid_m
    alone (its first row)."""
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    if DIRECT:
        pair = tl.where(tl.arange(0, BLOCK_M) == 0, pid_m, num_pairs)
    else:
        pair = tl.load(sorted_ptr + rows)
    valid = pair < num_pairs
    safe_pair = tl.where(valid, pair, 0)
    return rows, valid, safe_pair, (safe_pair // top_k).to(tl.int64)


@triton.jit
def _gate_up_kernel(
    x_ptr, w_ptr, s_ptr, h_ptr, sorted_ptr, block_expert_ptr,
    num_pairs, top_k, H, I, stride_xt,
    stride_we, stride_wn, stride_se, stride_sn, stride_sk,
    limit, CLAMP: tl.constexpr,
    MXFP4: tl.constexpr, FNUZ: tl.constexpr, ASM: tl.constexpr, NARROW: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT_F32: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    e = tl.load(block_expert_ptr + pid_m)
    if e < 0:
        return
    DTYPE: tl.constexpr = tl.float32 if DOT_F32 else tl.bfloat16
    rows, valid, _, tok = _block_routes(sorted_ptr, pid_m, num_pairs, top_k, BLOCK_M)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = n < I
    w_base = w_ptr + e.to(tl.int64) * stride_we
    s_base = s_ptr + e.to(tl.int64) * stride_se
    x_rows = x_ptr + tok[:, None] * stride_xt
    acc_g = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_u = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    if MXFP4:  # 16-bit elements: four dots a step, one per k mod 4
        BKE: tl.constexpr = BLOCK_K // 4
        for e0 in range(0, H // 4, BKE):
            ke = e0 + tl.arange(0, BKE)  # (e is the expert)
            emask = ke < H // 4
            xq = _mx_x_quarters(x_rows, ke, valid[:, None] & emask[None, :], H // 4, DTYPE)
            wm = emask[:, None] & nmask[None, :]
            acc_g = _dot_quarters(acc_g, xq, _mx_col_tiles(w_base, s_base, n, ke, wm, stride_wn, stride_sn, ASM, NARROW,
                                                           DTYPE))
            acc_u = _dot_quarters(acc_u, xq, _mx_col_tiles(w_base, s_base, n + I, ke, wm, stride_wn, stride_sn, ASM,
                                                           NARROW, DTYPE))
    else:
        for k0 in range(0, H, BLOCK_K):
            k = k0 + tl.arange(0, BLOCK_K)
            kmask = k < H
            xk = tl.load(x_rows + k[None, :], mask=valid[:, None] & kmask[None, :], other=0.0).to(DTYPE)
            wm = kmask[:, None] & nmask[None, :]
            qg = _fp8_tile(w_base, n, k, wm, stride_wn, FNUZ, DTYPE)
            sg = _fp8_col_scale(s_base, n, nmask, k0, stride_sn, stride_sk)
            acc_g += tl.dot(xk, qg) * sg[None, :]
            qu = _fp8_tile(w_base, n + I, k, wm, stride_wn, FNUZ, DTYPE)
            su = _fp8_col_scale(s_base, n + I, nmask, k0, stride_sn, stride_sk)
            acc_u += tl.dot(xk, qu) * su[None, :]
    h = _swiglu_f32(acc_g, acc_u, limit, CLAMP)
    if MXFP4:  # h split by k mod 4, as the down kernel reads it
        col = (n % 4) * (I // 4) + n // 4
    else:
        col = n
    tl.store(h_ptr + rows.to(tl.int64)[:, None] * I + col[None, :], _to_bf16(h), mask=valid[:, None] & nmask[None, :])


@triton.jit
def _down_kernel(
    h_ptr, w_ptr, s_ptr, y_ptr, tw_ptr, sorted_ptr, block_expert_ptr,
    num_pairs, top_k, H, I,
    stride_we, stride_wn, stride_se, stride_sn, stride_sk,
    MXFP4: tl.constexpr, FNUZ: tl.constexpr, ASM: tl.constexpr, NARROW: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT_F32: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    e = tl.load(block_expert_ptr + pid_m)
    if e < 0:
        return
    DTYPE: tl.constexpr = tl.float32 if DOT_F32 else tl.bfloat16
    rows, valid, safe_pair, tok = _block_routes(sorted_ptr, pid_m, num_pairs, top_k, BLOCK_M)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = n < H
    w_base = w_ptr + e.to(tl.int64) * stride_we
    s_base = s_ptr + e.to(tl.int64) * stride_se
    h_rows = h_ptr + rows.to(tl.int64)[:, None] * I
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    if MXFP4:
        BKE: tl.constexpr = BLOCK_K // 4
        for e0 in range(0, I // 4, BKE):
            ke = e0 + tl.arange(0, BKE)  # (e is the expert)
            emask = ke < I // 4
            hq = _mx_x_quarters(h_rows, ke, valid[:, None] & emask[None, :], I // 4, DTYPE)
            wm = emask[:, None] & nmask[None, :]
            acc = _dot_quarters(acc, hq, _mx_col_tiles(w_base, s_base, n, ke, wm, stride_wn, stride_sn, ASM, NARROW,
                                                       DTYPE))
    else:
        for k0 in range(0, I, BLOCK_K):
            k = k0 + tl.arange(0, BLOCK_K)
            kmask = k < I
            hk = tl.load(h_rows + k[None, :], mask=valid[:, None] & kmask[None, :], other=0.0).to(DTYPE)
            q = _fp8_tile(w_base, n, k, kmask[:, None] & nmask[None, :], stride_wn, FNUZ, DTYPE)
            s = _fp8_col_scale(s_base, n, nmask, k0, stride_sn, stride_sk)
            acc += tl.dot(hk, q) * s[None, :]
    wgt = tl.load(tw_ptr + safe_pair, mask=valid, other=0.0)
    acc = acc * wgt[:, None]
    tl.atomic_add(y_ptr + tok[:, None] * H + n[None, :], acc, mask=valid[:, None] & nmask[None, :], sem="relaxed")


# ----------------------------------------------------------------------------- MXFP4, weights as the M operand
# Few-token (decode) kernels: the weight rows are the dot's M (64+ rows fill a tensor-core tile however few routes
# an expert has) and the block's tokens its N. The packed bytes are read as 16-bit elements: element e of a row
# holds k = 4e .. 4e + 3 (byte 2e: k 4e in its low nibble, 4e + 1 in its high one; byte 2e + 1: 4e + 2, 4e + 3).
# It decodes into four bf16 operands, one per k mod 4, each dotted with the activations' matching quarter: the
# activations (and h between the GEMMs) are stored split by k mod 4, [rows, 4, K / 4], so each quarter's tile is
# a contiguous run the loads can pipeline. On NVIDIA GPUs inline PTX decodes two elements a register; each output
# depends on its own element and scale only, so it holds in whatever register layout the compiler chooses.

def _mx_decode_ptx(narrow: bool) -> str:
    """Inline PTX for _mx_quarters, built from MX_BITS: $4 holds two 16-bit elements, one per bf16 lane; output j
    (a bf16x2 register) is code j of each, placed as bf16 bits (sign 15, e1 e0 m 8..6) by shifting the whole
    register (no lane's bits cross into the other's kept bits) and masking. Those bits read as the bf16 2**-126
    times the e2m1 value (e > 0: 2**(e - 127) * (1 + m / 2); e = 0: the subnormal m * 2**-127). Narrow multiplies
    once, by $5 = 2**(s - 1) (each lane's, a normal bf16 for scale bytes s <= 128); else by 2**126, then by $5 = the
    scale 2**(s - 127). Every product is exact (subnormals kept); fma with -0 added keeps the sign of a zero
    (fma.bf16x2 needs sm_80, mul.bf16x2 sm_90)."""
    lines = ["{", ".reg .b32 t, u, f, nz;", "mov.b32 nz, 0x80008000;", "mov.b32 f, 0x7E807E80;"]  # f: 2**126

    def shifted(dst: str, shift: int) -> str:  # dst = $4 moved left by shift (right if negative)
        if shift == 0:
            return f"mov.b32 {dst}, $4;"
        return f"shl.b32 {dst}, $4, {shift};" if shift > 0 else f"shr.b32 {dst}, $4, {-shift};"

    for j, (magnitude, sign) in enumerate(MX_BITS):
        body, sgn = 6 - magnitude, 15 - sign
        if body == sgn:
            lines += [shifted("t", body), "and.b32 t, t, 0x81C081C0;"]
        else:
            lines += [shifted("t", body), "and.b32 t, t, 0x01C001C0;", shifted("u", sgn),
                      "and.b32 u, u, 0x80008000;", "or.b32 t, t, u;"]
        if narrow:
            lines.append(f"fma.rn.bf16x2 ${j}, t, $5, nz;")
        else:
            lines += ["fma.rn.bf16x2 t, t, f, nz;", f"fma.rn.bf16x2 ${j}, t, $5, nz;"]
    return "\n".join(lines + ["}"])


_MX_PTX_NARROW = tl.constexpr(_mx_decode_ptx(True))
_MX_PTX_WIDE = tl.constexpr(_mx_decode_ptx(False))
_MX_MAG0, _MX_SIGN0 = tl.constexpr(MX_BITS[0][0]), tl.constexpr(MX_BITS[0][1])
_MX_MAG1, _MX_SIGN1 = tl.constexpr(MX_BITS[1][0]), tl.constexpr(MX_BITS[1][1])
_MX_MAG2, _MX_SIGN2 = tl.constexpr(MX_BITS[2][0]), tl.constexpr(MX_BITS[2][1])
_MX_MAG3, _MX_SIGN3 = tl.constexpr(MX_BITS[3][0]), tl.constexpr(MX_BITS[3][1])


@triton.jit
def _mx_scale_bf16(s):
    """UE8M0 bytes -> 2**(s - 127) as bf16 (exact: 0 is the subnormal 2**-127, 255 NaN)."""
    s = s.to(tl.int32)
    bits = tl.where(s == 0, 0x40, tl.where(s == 255, 0x7FC0, s << 7))
    return bits.to(tl.int16).to(tl.bfloat16, bitcast=True)


@triton.jit
def _mx_scale_operand(s, ASM: tl.constexpr, NARROW: tl.constexpr):
    """UE8M0 bytes -> the scale operand _mx_quarters takes: bf16 2**(s - 1) (narrow PTX: s <= 128, its exponent
    field s + 126), bf16 2**(s - 127) (wide PTX) or the fp32 2**(s - 127) (plain)."""
    if ASM:
        if NARROW:
            m = ((s.to(tl.int32) + 126) << 7).to(tl.int16).to(tl.bfloat16, bitcast=True)
        else:
            m = _mx_scale_bf16(s)
    else:
        m = _ue8m0(s.to(tl.int32))
    return m


@triton.jit
def _mx_code(b, MAG: tl.constexpr, SIGN: tl.constexpr):
    """The e2m1 code (sign at bit 3) stored at magnitude bits MAG .. MAG + 2 and sign bit SIGN of elements b."""
    return ((b >> MAG) & 7) | (((b >> SIGN) & 1) << 3)


@triton.jit
def _mx_quarters(q, m, ASM: tl.constexpr, NARROW: tl.constexpr, DTYPE: tl.constexpr):
    """16-bit elements q (four e2m1 codes each, MX_BITS order) and their scale operands m (_mx_scale_operand), any
    shape and layout -> the four codes' values times the scale, exact in bf16 (DTYPE: bf16, or fp32 for the
    interpreter's dot)."""
    if ASM:
        v0, v1, v2, v3 = tl.inline_asm_elementwise(
            _MX_PTX_NARROW if NARROW else _MX_PTX_WIDE, "=r,=r,=r,=r,r,r", [q, m],
            dtype=(tl.bfloat16, tl.bfloat16, tl.bfloat16, tl.bfloat16), is_pure=True, pack=2)
    else:  # the same values in plain Triton (the interpreter, ROCm)
        b = q.to(tl.int32) & 0xFFFF
        v0 = (_e2m1(_mx_code(b, _MX_MAG0, _MX_SIGN0)) * m).to(DTYPE)
        v1 = (_e2m1(_mx_code(b, _MX_MAG1, _MX_SIGN1)) * m).to(DTYPE)
        v2 = (_e2m1(_mx_code(b, _MX_MAG2, _MX_SIGN2)) * m).to(DTYPE)
        v3 = (_e2m1(_mx_code(b, _MX_MAG3, _MX_SIGN3)) * m).to(DTYPE)
    return v0, v1, v2, v3


@triton.jit
def _mx_col_tiles(w_base, s_base, n, e, mask, stride_wn, stride_sn, ASM: tl.constexpr, NARROW: tl.constexpr,
                  DTYPE: tl.constexpr):
    """Row kernels: weight rows n, 16-bit elements e (8 to a 32-group) -> the four operands [BKE, BN], k = 4e + j."""
    q = tl.load(w_base + n[None, :] * stride_wn + e[:, None], mask=mask, other=0)
    s = tl.load(s_base + n[None, :] * stride_sn + e[:, None] // 8, mask=mask, other=127)
    return _mx_quarters(q, _mx_scale_operand(s, ASM, NARROW), ASM, NARROW, DTYPE)


@triton.jit
def _mx_row_tile(w_base, s_base, n, e0, nmask, stride_wn, stride_sn, BKE: tl.constexpr, EVEN: tl.constexpr,
                 ASM: tl.constexpr, NARROW: tl.constexpr, DTYPE: tl.constexpr):
    """Weight rows n, 16-bit elements e0 .. e0 + BKE (8 to a 32-group) -> the four operands [BN, BKE]."""
    BN: tl.constexpr = n.shape[0]
    e = e0 + tl.arange(0, BKE)
    g = e0 // 8 + tl.arange(0, BKE // 8)
    if EVEN:
        q = tl.load(w_base + n[:, None] * stride_wn + e[None, :])
        s = tl.load(s_base + n[:, None] * stride_sn + g[None, :])
    else:
        q = tl.load(w_base + n[:, None] * stride_wn + e[None, :], mask=nmask[:, None], other=0)
        s = tl.load(s_base + n[:, None] * stride_sn + g[None, :], mask=nmask[:, None], other=127)
    m = _mx_scale_operand(s, ASM, NARROW)  # once a group, then broadcast to its 8 elements
    m = tl.reshape(tl.broadcast_to(m[:, :, None], [BN, BKE // 8, 8]), [BN, BKE])
    return _mx_quarters(q, m, ASM, NARROW, DTYPE)


@triton.jit
def _mx_act_quarters(base, e0, quarter, BKE: tl.constexpr, DTYPE: tl.constexpr):
    """Activation tiles [BKE, BM] of the four quarters (k mod 4) at elements e0 .. e0 + BKE; base: [1, BM] row
    pointers of a split layout [rows, 4, K / 4] (quarter: K / 4)."""
    e = (e0 + tl.arange(0, BKE))[:, None]
    a0 = tl.load(base + e).to(DTYPE)
    a1 = tl.load(base + quarter + e).to(DTYPE)
    a2 = tl.load(base + 2 * quarter + e).to(DTYPE)
    a3 = tl.load(base + 3 * quarter + e).to(DTYPE)
    return a0, a1, a2, a3


@triton.jit
def _zero_share(y_ptr, y_numel, ZB: tl.constexpr):
    """This program's share of zeroing y (fp32, y_numel values) in blocks of ZB, grid-strided over all programs."""
    num = tl.num_programs(0) * tl.num_programs(1)
    pid = tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)
    for off in range(pid * ZB, y_numel, num * ZB):
        z = off + tl.arange(0, ZB)
        tl.store(y_ptr + z, tl.zeros([ZB], dtype=tl.float32), mask=z < y_numel)


@triton.jit
def _mx_gate_up_swapped(
    x_ptr, w_ptr, s_ptr, h_ptr, y_ptr, sorted_ptr, block_expert_ptr,
    num_pairs, top_k, E, H, I, y_numel, stride_we, stride_wn, stride_se, stride_sn,
    limit, CLAMP: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_N: tl.constexpr, ASM: tl.constexpr,
    NARROW: tl.constexpr, PAIR: tl.constexpr, DIRECT: tl.constexpr, DOT_F32: tl.constexpr,
):
    """h^T tile [BLOCK_N, BLOCK_M] = SwiGLU(W_gate x^T, W_up x^T) for one expert block; x split [T, 4, H / 4] (a
    split in registers instead measured 1.07-1.19x slower on the H200, and layouts that read x unsplit 1.02-1.06x
    at T >= 2, ab-mx-moe-decode-runs8/-runs16.json); h is stored split too, [rows, 4, I / 4]. BLOCK_K (k values a
    step) divides H. PAIR: a program takes BLOCK_N / 2 outputs, their gate and up rows in one tile of BLOCK_N rows
    (twice the programs, for few tokens); else BLOCK_N outputs, a gate and an up tile. DIRECT: block b is route b
    (block_expert_ptr: the routes' expert ids, any in [0, E) taken). Every program first zeroes its share of y
    [T, H] fp32 and the down kernel's counters after it (y_numel values in all), which the down kernel accumulates
    into (one launch fewer)."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    _zero_share(y_ptr, y_numel, 1024)
    e = tl.load(block_expert_ptr + pid_m)
    if (e < 0) | (e >= E):
        return
    rows, valid, _, tok = _block_routes(sorted_ptr, pid_m, num_pairs, top_k, BLOCK_M, DIRECT)
    w_base = w_ptr + e.to(tl.int64) * stride_we
    s_base = s_ptr + e.to(tl.int64) * stride_se
    x_base = x_ptr + tok[None, :] * H
    BKE: tl.constexpr = BLOCK_K // 4
    DTYPE: tl.constexpr = tl.float32 if DOT_F32 else tl.bfloat16
    if PAIR:
        HALF: tl.constexpr = BLOCK_N // 2
        j = tl.arange(0, BLOCK_N)
        nj = pid_n * HALF + j % HALF
        wrow = nj + (j >= HALF).to(tl.int32) * I  # gate rows, then the same outputs' up rows
        acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
        for e0 in range(0, H // 4, BKE):
            xq = _mx_act_quarters(x_base, e0, H // 4, BKE, DTYPE)
            acc = _dot_quarters(acc, _mx_row_tile(w_base, s_base, wrow, e0, nj < I, stride_wn, stride_sn, BKE, EVEN_N,
                                                  ASM, NARROW, DTYPE), xq)
        acc_g, acc_u = tl.split(tl.permute(tl.reshape(acc, [2, HALF, BLOCK_M]), (1, 2, 0)))
        n = pid_n * HALF + tl.arange(0, HALF)
    else:
        n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        acc_g = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
        acc_u = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
        for e0 in range(0, H // 4, BKE):
            xq = _mx_act_quarters(x_base, e0, H // 4, BKE, DTYPE)
            acc_g = _dot_quarters(acc_g, _mx_row_tile(w_base, s_base, n, e0, n < I, stride_wn, stride_sn, BKE, EVEN_N,
                                                      ASM, NARROW, DTYPE), xq)
            acc_u = _dot_quarters(acc_u, _mx_row_tile(w_base, s_base, n + I, e0, n < I, stride_wn, stride_sn, BKE,
                                                      EVEN_N, ASM, NARROW, DTYPE), xq)
    nmask = n < I
    h = _swiglu_f32(acc_g, acc_u, limit, CLAMP)
    col = (n % 4) * (I // 4) + n // 4  # the split layout of h
    tl.store(h_ptr + rows.to(tl.int64)[None, :] * I + col[:, None], _to_bf16(h), mask=valid[None, :] & nmask[:, None])


@triton.jit
def _cast_when_last(y_ptr, out_ptr, count_ptr, n, nmask, T, H, BT: tl.constexpr):
    """Called by every program of a column tile n of y [T, H] once its atomics are issued: the last to arrive at
    count_ptr (one counter a tile, zeroed before the launch) writes the tile's bf16 out [T, H]. The barrier orders
    the program's atomics before its arrival (release); the last one's acquire orders them before its loads, which
    bypass L1 (.cg: y's lines may sit in an SM's L1 from an earlier call)."""
    tl.debug_barrier()
    arrived = tl.atomic_add(count_ptr, 1, sem="acq_rel", scope="gpu")
    if arrived == tl.num_programs(0) - 1:
        for t0 in range(0, T, BT):
            t = t0 + tl.arange(0, BT)
            mask = (t < T)[None, :] & nmask[:, None]
            at = t.to(tl.int64)[None, :] * H + n[:, None]
            tl.store(out_ptr + at, _to_bf16(tl.load(y_ptr + at, mask=mask, other=0.0, cache_modifier=".cg")),
                     mask=mask)


@triton.jit
def _mx_down_swapped(
    h_ptr, w_ptr, s_ptr, y_ptr, out_ptr, count_ptr, tw_ptr, sorted_ptr, block_expert_ptr,
    num_pairs, top_k, E, T, H, I, stride_we, stride_wn, stride_se, stride_sn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_N: tl.constexpr, ASM: tl.constexpr,
    NARROW: tl.constexpr, DIRECT: tl.constexpr, FUSE_CAST: tl.constexpr, DOT_F32: tl.constexpr,
):
    """y^T tile [BLOCK_N, BLOCK_M] += route weight * W2 h^T for one expert block (fp32 atomics into y [T, H]); h
    split [rows, 4, I / 4]. BLOCK_K divides I. FUSE_CAST: the last program of each column tile writes it to out bf16
    [T, H] (_cast_when_last; else the caller casts y). (Splitting K over more programs for few tokens measured slower
    on the H200 at every T, sweep-mx-moe-decode.json "grid_v3".)"""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    e = tl.load(block_expert_ptr + pid_m)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = n < H
    if (e >= 0) & (e < E):
        rows, valid, safe_pair, tok = _block_routes(sorted_ptr, pid_m, num_pairs, top_k, BLOCK_M, DIRECT)
        w_base = w_ptr + e.to(tl.int64) * stride_we
        s_base = s_ptr + e.to(tl.int64) * stride_se
        h_base = h_ptr + rows.to(tl.int64)[None, :] * I  # a padding row's h is never written nor its column stored
        BKE: tl.constexpr = BLOCK_K // 4
        DTYPE: tl.constexpr = tl.float32 if DOT_F32 else tl.bfloat16
        acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
        for e0 in range(0, I // 4, BKE):
            acc = _dot_quarters(acc, _mx_row_tile(w_base, s_base, n, e0, nmask, stride_wn, stride_sn, BKE, EVEN_N,
                                                  ASM, NARROW, DTYPE), _mx_act_quarters(h_base, e0, I // 4, BKE, DTYPE))
        wgt = tl.load(tw_ptr + safe_pair, mask=valid, other=0.0)
        acc = acc * wgt[None, :]
        tl.atomic_add(y_ptr + tok[None, :] * H + n[:, None], acc, mask=valid[None, :] & nmask[:, None],
                      sem="relaxed")
    if FUSE_CAST:
        _cast_when_last(y_ptr, out_ptr, count_ptr + pid_n, n, nmask, T, H, BLOCK_M)


# ----------------------------------------------------------------------------- host side

def _pow2_divisor(n: int) -> int:
    """The largest power of two dividing n > 0."""
    return n & -n


def _config(fmt: str, num_tokens: int, config: dict | None) -> dict:
    base = CONFIGS[(fmt, "decode" if num_tokens <= DECODE_MAX_TOKENS else "prefill")]
    cfg = {**base, **(config or {})}
    bk, bn, bm = cfg["block_k"], cfg["block_n"], cfg["block_m"]
    if fmt == "mxfp4" and cfg.get("swap"):
        if bk & (bk - 1) or not SWAP_MIN_BLOCK_K <= bk <= SWAP_MAX_BLOCK_K:
            raise ValueError(f"block_k of the swapped MXFP4 kernels must be a power of two in [{SWAP_MIN_BLOCK_K}, "
                             f"{SWAP_MAX_BLOCK_K}] (four dots of K >= 16 a step); got {bk}")
    elif bk & (bk - 1) or not (64 if fmt == "mxfp4" else 32) <= bk <= FP8_BLOCK:
        raise ValueError(f"block_k must be a power of two in [32, {FP8_BLOCK}] (it divides the 128 FP8 block), for "
                         f"MXFP4 in [64, {FP8_BLOCK}] (four dots of K >= 16 a step); got {bk}")
    min_m = 8 if fmt == "mxfp4" and cfg.get("swap") else 16  # the swapped kernels' tokens are the dot's N
    if cfg.get("pair") not in (None, True, False):
        raise ValueError(f"pair (the swapped gate-up kernel's gate and up rows in one tile) must be True, False or "
                         f"None (auto); got {cfg['pair']!r}")
    if bn & (bn - 1) or bn < 16 or bm & (bm - 1) or bm < min_m:
        raise ValueError(f"block_m and block_n must be powers of two >= {min_m} and 16; got {bm}, {bn}")
    down = cfg.get("down") or {}
    dbn, dbk = down.get("block_n", bn), down.get("block_k", bk)
    if down and (set(down) - set(DOWN_KEYS) or dbn & (dbn - 1) or dbn < 16 or dbk & (dbk - 1) or not (
            SWAP_MIN_BLOCK_K <= dbk <= SWAP_MAX_BLOCK_K)):
        raise ValueError(f"down (the swapped down kernel's own tiles) takes {', '.join(DOWN_KEYS)}: block_n a power "
                         f"of two >= 16, block_k one in [{SWAP_MIN_BLOCK_K}, {SWAP_MAX_BLOCK_K}]; got {down!r}")
    return cfg


def _swapped(x: torch.Tensor, w13: torch.Tensor, s13: torch.Tensor, w2: torch.Tensor, s2: torch.Tensor,
             h: torch.Tensor, tw: torch.Tensor, sorted_pairs: torch.Tensor, block_expert: torch.Tensor, t: int, k: int,
             num_experts: int, cfg: dict, tiles: dict, limit: float, clamp: bool) -> torch.Tensor:
    """The swapped MXFP4 kernels' two launches -> bf16 [T, H]. One fp32 workspace: y [T, H], then a counter a
    column tile of the down kernel (int32 bits); the gate-up kernel zeroes it all. "fuse_cast": the down kernel's
    last program of each tile writes it as bf16, else a cast after; by default for one token only (on the H200 37.0
    against 37.8 us at T = 1; from T = 2 no gain beyond the 2% that two equal settings differ by, and each down
    program's release costs its exit, ab-mx-moe-decode.json). "down": the down kernel's own tiles (default
    DOWN_WIDE for DOWN_WIDE_TOKENS)."""
    hid, inter = w2.shape[1], h.shape[1]  # (x is split: [T, 4, H / 4])
    nb, bn, dev = block_expert.numel(), tiles["BLOCK_N"], x.device
    down = cfg.get("down")
    if down is None:
        down = DOWN_WIDE if t in DOWN_WIDE_TOKENS else {}
    down_tiles = {**tiles, "BLOCK_N": down.get("block_n", bn), "num_warps": down.get("num_warps", tiles["num_warps"]),
                  "num_stages": down.get("num_stages", tiles["num_stages"]),
                  "BLOCK_K": min(down.get("block_k", cfg["block_k"]), _pow2_divisor(math.gcd(hid, inter)))}
    dbn = down_tiles["BLOCK_N"]
    col_tiles = triton.cdiv(hid, dbn)
    work = torch.empty(t * hid + col_tiles, dtype=torch.float32, device=dev)
    y, counts = work[:t * hid].view(t, hid), work[t * hid:].view(torch.int32)
    fuse_cast = cfg.get("fuse_cast", tiles["DIRECT"])
    out = torch.empty(t, hid, dtype=torch.bfloat16, device=dev) if fuse_cast else y
    pair = cfg.get("pair")
    if pair is None:  # "auto": pair when the gate-up grid would give each SM fewer than two programs
        pair = nb * triton.cdiv(inter, bn) < 2 * sm_count(dev)
    outs = bn // 2 if pair else bn  # outputs of h a gate-up program
    p = tw.numel()
    _mx_gate_up_swapped[(nb, triton.cdiv(inter, outs))](
        x, w13, s13, h, work, sorted_pairs, block_expert, p, k, num_experts, hid, inter, work.numel(),
        w13.stride(0), w13.stride(1), s13.stride(0), s13.stride(1), limit, CLAMP=clamp,
        EVEN_N=inter % outs == 0, PAIR=pair, **tiles)
    _mx_down_swapped[(nb, col_tiles)](
        h, w2, s2, y, out, counts, tw, sorted_pairs, block_expert, p, k, num_experts, t, hid, inter,
        w2.stride(0), w2.stride(1), s2.stride(0), s2.stride(1), EVEN_N=hid % dbn == 0, FUSE_CAST=fuse_cast,
        **down_tiles)
    return out if fuse_cast else y.to(torch.bfloat16)


def fused_moe(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, weights: TritonMoeWeights,
              swiglu_limit: float = 10.0, *, config: dict | None = None) -> torch.Tensor:
    """moe_experts on prepared weights with an optional tile config (block_m/n/k, num_warps, num_stages)."""
    t, hid = x.shape
    k = topk_ids.shape[1]
    e, inter = weights.num_experts, weights.intermediate
    dev = x.device
    p = t * k
    cfg = _config(weights.format, t, config)
    mx = weights.format == "mxfp4"
    swapped = mx and bool(cfg.get("swap")) and hid % SWAP_MIN_BLOCK_K == 0 and inter % SWAP_MIN_BLOCK_K == 0
    if mx and cfg.get("swap") and not swapped:  # shapes the swapped kernels do not take: the row kernels and tiles
        cfg = {**cfg, **ROW_DECODE_TILES}
    bm, bn, bk = cfg["block_m"], cfg["block_n"], cfg["block_k"]
    if p == 0:
        return torch.zeros(t, hid, dtype=torch.bfloat16, device=dev)
    # "direct" (swapped kernels, one token): no alignment, block b is route b (a token's routes rarely share an
    # expert, and one that does is read twice, still correct)
    direct = swapped and t == 1 and cfg.get("direct", True)
    if direct:
        block_expert = sorted_pairs = topk_ids.reshape(-1).contiguous()  # (sorted_pairs is not read)
    else:
        routes = align_routes(topk_ids, e, bm)
        sorted_pairs, block_expert = routes.sorted_routes, routes.block_expert
    nb = block_expert.numel()
    x = x.contiguous()
    tw = topk_weights.reshape(-1).float().contiguous()
    h = torch.empty(nb * bm, inter, dtype=torch.bfloat16, device=dev)
    limit, clamp = swiglu_limit_args(swiglu_limit)
    w13, s13, w2, s2 = weights.w13, weights.w13_scale, weights.w2, weights.w2_scale
    if mx:  # 16-bit elements of four codes each; the activations split by k mod 4: [T, 4, H / 4]
        w13, w2 = w13.view(torch.int16), w2.view(torch.int16)
        x = x.view(t, hid // 4, 4).transpose(1, 2).contiguous()
    # "ptx": False runs the plain Triton decode on an NVIDIA GPU too (to measure what ROCm runs)
    asm = dict(ASM=mx and _MX_ASM and cfg.get("ptx", True), NARROW=weights.narrow_scales)
    if swapped:
        return _swapped(x, w13, s13, w2, s2, h, tw, sorted_pairs, block_expert, t, k, e, cfg, dict(
            BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=min(bk, _pow2_divisor(math.gcd(hid, inter))),  # K tiles end at K
            DIRECT=direct, DOT_F32=_DOT_F32, num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], **asm),
            limit, clamp)
    y = torch.zeros(t, hid, dtype=torch.float32, device=dev)
    launch = dict(MXFP4=mx, FNUZ=weights.fnuz, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, DOT_F32=_DOT_F32,
                  num_warps=cfg["num_warps"], num_stages=cfg["num_stages"], **asm)
    sk13 = 0 if mx else s13.stride(2)
    sk2 = 0 if mx else s2.stride(2)
    _gate_up_kernel[(nb, triton.cdiv(inter, bn))](
        x, w13, s13, h, sorted_pairs, block_expert,
        p, k, hid, inter, x.stride(0),
        w13.stride(0), w13.stride(1), s13.stride(0), s13.stride(1), sk13,
        limit, CLAMP=clamp, **launch)
    _down_kernel[(nb, triton.cdiv(hid, bn))](
        h, w2, s2, y, tw, sorted_pairs, block_expert,
        p, k, hid, inter,
        w2.stride(0), w2.stride(1), s2.stride(0), s2.stride(1), sk2, **launch)
    return y.to(torch.bfloat16)


def moe_experts(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, weights: TritonMoeWeights,
                swiglu_limit: float = 10.0) -> torch.Tensor:
    """x bf16 [T, H], topk_ids int32 [T, k], topk_weights fp32 [T, k], weights from prepare_weights ->
    bf16 [T, H]: sum over slots of weight * clamped-SwiGLU expert (ids < 0 contribute nothing)."""
    if not isinstance(weights, TritonMoeWeights):
        raise TypeError(f"triton_fused_moe needs weights from its prepare_weights (layout {LAYOUT}); "
                        f"got {type(weights).__name__}")
    return fused_moe(x, topk_ids, topk_weights, weights, swiglu_limit)
