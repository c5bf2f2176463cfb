"""The fused MoE's row kernels: tokens are the dot's M (BLOCK_M routes of one expert a block), weight tiles loaded
along K and dequantized in registers; FP8 128x128 block-scaled weights at every token count, MXFP4 for prefill and
for shapes the swapped kernels do not take. Gate-up: two fp32 accumulators, the clamped SwiGLU, h stored bf16 at the
route's sorted row (MXFP4: split by k mod 4). Down: h times w2, scaled by the route weight, fp32 atomics into y."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dsv4hal.kernels.triton.fp8_codec import _decode_fp8
from dsv4hal.kernels.triton.moe_activation import _swiglu_f32, _to_bf16
from dsv4hal.kernels.triton.mxfp4_decode import _dot_quarters, _mx_quarters, _mx_scale_operand


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


@triton.jit
def _mx_col_tiles(w_base, s_base, n, e, mask, stride_wn, stride_sn, ASM: tl.constexpr, NARROW: tl.constexpr,
                  DTYPE: tl.constexpr):
    """Row kernels: weight rows n, 16-bit elements e (8 to a 32-group) -> the four operands [BKE, BN], k = 4e + j."""
    q = tl.load(w_base + n[None, :] * stride_wn + e[:, None], mask=mask, other=0)
    s = tl.load(s_base + n[None, :] * stride_sn + e[:, None] // 8, mask=mask, other=127)
    return _mx_quarters(q, _mx_scale_operand(s, ASM, NARROW), ASM, NARROW, DTYPE)


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


def launch_rows(x: torch.Tensor, w13: torch.Tensor, s13: torch.Tensor, w2: torch.Tensor, s2: torch.Tensor,
                h: torch.Tensor, tw: torch.Tensor, sorted_pairs: torch.Tensor, block_expert: torch.Tensor, top_k: int,
                limit: float, clamp: bool, meta: dict) -> torch.Tensor:
    """The row kernels' two launches -> bf16 [T, H]: y fp32 [T, H] zeroed, the down kernel's atomics, a cast after.
    x bf16 [T, H] (MXFP4: split [T, 4, H / 4]); h [blocks * BLOCK_M, I]; meta: the kernels' constexprs (MXFP4,
    FNUZ, ASM, NARROW, BLOCK_M/N/K, DOT_F32) and num_warps / num_stages."""
    t, hid, inter = x.shape[0], w2.shape[1], h.shape[1]
    nb, bn, mx = block_expert.numel(), meta["BLOCK_N"], meta["MXFP4"]
    p = tw.numel()
    y = torch.zeros(t, hid, dtype=torch.float32, device=x.device)
    sk13 = 0 if mx else s13.stride(2)
    sk2 = 0 if mx else s2.stride(2)
    _gate_up_kernel[(nb, triton.cdiv(inter, bn))](
        x, w13, s13, h, sorted_pairs, block_expert,
        p, top_k, hid, inter, x.stride(0),
        w13.stride(0), w13.stride(1), s13.stride(0), s13.stride(1), sk13,
        limit, CLAMP=clamp, **meta)
    _down_kernel[(nb, triton.cdiv(hid, bn))](
        h, w2, s2, y, tw, sorted_pairs, block_expert,
        p, top_k, hid, inter,
        w2.stride(0), w2.stride(1), s2.stride(0), s2.stride(1), sk2, **meta)
    return y.to(torch.bfloat16)
