"""The fused MoE's swapped MXFP4 kernels for few tokens (decode): the weight rows are the dot's M (64+ rows fill a
tensor-core tile however few routes an expert has) and the block's tokens its N. The activations (and h between the
GEMMs) are stored split by k mod 4, [rows, 4, K / 4], so each quarter's tile is a contiguous run the loads can
pipeline; mxfp4_decode turns each 16-bit weight element into the four matching operands. For one token the
routes skip the alignment (DIRECT: a block a route), and the down kernel's last program of each column tile can write
it as bf16 (FUSE_CAST: no cast launch)."""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from dsv4hal.kernels.triton.device import sm_count
from dsv4hal.kernels.triton.fused_moe_rows import _block_routes
from dsv4hal.kernels.triton.moe_activation import _swiglu_f32, _to_bf16
from dsv4hal.kernels.triton.mxfp4_decode import _dot_quarters, _mx_quarters, _mx_scale_operand

SWAP_MAX_BLOCK_K = 1024  # the swapped MXFP4 kernels' K tile: 512 bytes of a weight row
SWAP_MIN_BLOCK_K = 64  # each of its four dots needs K >= 16; H and I must be multiples (else: the row kernels)
DOWN_KEYS = ("block_n", "block_k", "num_warps", "num_stages")  # config "down": the swapped down kernel's own tiles
# The swapped down kernel's default tiles for 2 .. 16 tokens: 128 output rows a program instead of 64 (half the
# programs, each streaming twice the rows). On the H200 (V4-Flash, four runs: sweep-mx-moe-decode.json "grid_v5",
# ab-mx-moe-decode.json) 1-5% faster at T = 2 .. 16, and slower at T = 1 (by 2-3 us) and T = 64 (by 1-7%).
DOWN_WIDE = {"block_n": 128}
DOWN_WIDE_TOKENS = range(2, 17)


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
def _mx_act_quarters(base, e0, quarter, BKE: tl.constexpr, DTYPE: tl.constexpr, STEP: tl.constexpr = 1):
    """Activation tiles [BKE, BM] of the four quarters (k mod 4) at elements e0 .. e0 + BKE; base: [1, BM] row
    pointers of a split layout [rows, 4, K / 4] (quarter: K / 4, STEP 1) or of rows as they are (quarter 1,
    STEP 4: element e of quarter j is k = 4 e + j)."""
    e = ((e0 + tl.arange(0, BKE)) * STEP)[:, None]
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
    NARROW: tl.constexpr, PAIR: tl.constexpr, DIRECT: tl.constexpr, DOT_F32: tl.constexpr, X_SPLIT: tl.constexpr,
):
    """h^T tile [BLOCK_N, BLOCK_M] = SwiGLU(W_gate x^T, W_up x^T) for one expert block; x split [T, 4, H / 4] (a
    split in registers instead measured 1.07-1.19x slower on the H200, and layouts that read x unsplit 1.02-1.06x
    at T >= 2, ab-mx-moe-decode-runs8/-runs16.json); h is stored split too, [rows, 4, I / 4]. BLOCK_K (k values a
    step) divides H. PAIR: a program takes BLOCK_N / 2 outputs, their gate and up rows in one tile of BLOCK_N rows
    (twice the programs, for few tokens); else BLOCK_N outputs, a gate and an up tile. DIRECT: block b is route b
    (block_expert_ptr: the routes' expert ids, any in [0, E) taken). Every program first zeroes its share of y
    [T, H] fp32 and the down kernel's counters after it (y_numel values in all), which the down kernel accumulates
    into (one launch fewer). X_SPLIT False: x is read as it is, [T, H] (no split launch before this one). (The
    programs prefetching their expert's down weights into L2 while their own streamed with evict_first measured
    slower at T = 1 on the H100, 42.0 against 40.7 us, h100/sweep-mx-moe-decode-l2.json.)"""
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
    if X_SPLIT:  # where quarter j starts and the step between its elements: the split layout, else x's own
        XQ = H // 4
        XSTEP: tl.constexpr = 1
    else:
        XQ = 1
        XSTEP: tl.constexpr = 4
    BKE: tl.constexpr = BLOCK_K // 4
    DTYPE: tl.constexpr = tl.float32 if DOT_F32 else tl.bfloat16
    if PAIR:
        HALF: tl.constexpr = BLOCK_N // 2
        j = tl.arange(0, BLOCK_N)
        nj = pid_n * HALF + j % HALF
        wrow = nj + (j >= HALF).to(tl.int32) * I  # gate rows, then the same outputs' up rows
        acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
        for e0 in range(0, H // 4, BKE):
            xq = _mx_act_quarters(x_base, e0, XQ, BKE, DTYPE, XSTEP)
            acc = _dot_quarters(acc, _mx_row_tile(w_base, s_base, wrow, e0, nj < I, stride_wn, stride_sn, BKE, EVEN_N,
                                                  ASM, NARROW, DTYPE), xq)
        acc_g, acc_u = tl.split(tl.permute(tl.reshape(acc, [2, HALF, BLOCK_M]), (1, 2, 0)))
        n = pid_n * HALF + tl.arange(0, HALF)
    else:
        n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        acc_g = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
        acc_u = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
        for e0 in range(0, H // 4, BKE):
            xq = _mx_act_quarters(x_base, e0, XQ, BKE, DTYPE, XSTEP)
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
    """Called by every program of a column tile n of y [T, H] once its atomics are launched: the last to arrive at
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


def pow2_divisor(n: int) -> int:
    """The largest power of two dividing n > 0."""
    return n & -n


def launch_swapped(x: torch.Tensor, w13: torch.Tensor, s13: torch.Tensor, w2: torch.Tensor, s2: torch.Tensor,
                   h: torch.Tensor, tw: torch.Tensor, sorted_pairs: torch.Tensor, block_expert: torch.Tensor, k: int,
                   num_experts: int, cfg: dict, tiles: dict, limit: float, clamp: bool) -> torch.Tensor:
    """The swapped MXFP4 kernels' two launches -> bf16 [T, H]; x split [T, 4, H / 4] or as it is, [T, H]. One fp32
    workspace: y [T, H], then a counter a column tile of the down kernel (int32 bits); the gate-up kernel zeroes it
    all. "fuse_cast": the down kernel's last program of each tile writes it as bf16, else a cast after; by default
    for one token only (on the H200 37.0 against 37.8 us at T = 1; from T = 2 no gain beyond the 2% that two equal
    settings differ by, and each down program's release costs its exit, ab-mx-moe-decode.json). "down": the down
    kernel's own tiles (default DOWN_WIDE for DOWN_WIDE_TOKENS). (The down kernel launched as a programmatic dependent
    of the gate-up kernel measured no faster at T = 1 on the H100: 40.0 us with the trigger after the gate-up kernel's
    K loop or at its end, as without it; 44.2-46.1 us with the trigger at its start or the down weights asked of L2
    before the wait, h100/sweep-mx-moe-decode-pdl.json.)"""
    t, hid, inter = x.shape[0], w2.shape[1], h.shape[1]
    nb, bn, dev = block_expert.numel(), tiles["BLOCK_N"], x.device
    down = cfg.get("down")
    if down is None:
        down = DOWN_WIDE if t in DOWN_WIDE_TOKENS else {}
    down_tiles = {**tiles, "BLOCK_N": down.get("block_n", bn), "num_warps": down.get("num_warps", tiles["num_warps"]),
                  "num_stages": down.get("num_stages", tiles["num_stages"]),
                  "BLOCK_K": min(down.get("block_k", cfg["block_k"]), pow2_divisor(math.gcd(hid, inter)))}
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
        w13.stride(0), w13.stride(1), s13.stride(0), s13.stride(1), limit, CLAMP=clamp, EVEN_N=inter % outs == 0,
        PAIR=pair, X_SPLIT=x.dim() == 3, **tiles)
    _mx_down_swapped[(nb, col_tiles)](
        h, w2, s2, y, out, counts, tw, sorted_pairs, block_expert, p, k, num_experts, t, hid, inter,
        w2.stride(0), w2.stride(1), s2.stride(0), s2.stride(1), EVEN_N=hid % dbn == 0, FUSE_CAST=fuse_cast,
        **down_tiles)
    return out if fuse_cast else y.to(torch.bfloat16)
