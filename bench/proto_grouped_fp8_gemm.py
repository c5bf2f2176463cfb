"""A measurement, not a kernel dsv4hal binds: how close a plain Triton grouped FP8 GEMM gets to DeepGEMM's
m_grouped_fp8_gemm_nt_contiguous in the FP8 routed-experts call (dsv4hal.kernels.grouped_fp8_moe) on the H200, where
DeepGEMM's two GEMMs take ~1.9 ms of the 2.06 ms that issue 16's 600 TFLOP/s goal allows at T = 4096 and stream the
V4-Flash expert weights at ~0.88 of copy bandwidth whether the experts' blocks are full (T = 4096) or nearly empty
(T = 512).

    d[r, :] = (a[r, :] * sa[r, k // 128]) @ (b[e] * sb[e, n // 128, k // 128])^T    for the rows r of block m,
                                                                                    e = block_expert[m] >= 0

a: e4m3fn [rows, K] with 1x128 scales sa fp32 [rows, K/128] (strides (1, rows): MN-major, as the quantizers
write them); b: e4m3fn [E, N, K] (K-major) with 128x128 block scales sb fp32 [E, N/128, K/128]; d: bf16 [rows, N].
Blocks whose expert is -1 are skipped. A program computes one [128, BLOCK_N] tile: an FP8 dot (wgmma on sm_90) a K
step of 128, scaled by the step's row scales times the weight block's scales and summed in fp32; with tma=True the
codes come through host-made TMA descriptors.

Measured (bench/ab_moe_fp8_prefill.py --triton-gemm; bench/results/h200/ab-moe-fp8-triton-gemm-*.json), GEMM1 at
T = 4096 in turns with DeepGEMM's 1147-1283 us: 1840-1907 us (BLOCK_N 128, 8 warps, 4 stages), 1779-1879 with TMA;
4 warps ~3x slower; BLOCK_N 256 and 64 slower; keeping the sum in units of the current step's scales (one fp32 tile
of registers instead of two) slower still and less exact. At T = 512 the same times: the kernel streams the
weights at ~0.6 of DeepGEMM's rate. Outputs within 1.7e-5 relative L2 of DeepGEMM's. Not bound.

    python3 bench/ab_moe_fp8_prefill.py --json out.json --triton-gemm 4096,512
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

GROUP = 128  # the K step and the weights' block: one scale a (row, step) and one a (weight block, step)
BLOCK_M = 128  # the route alignment's block: one expert a tile
_DOT_F32 = os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def _tile_start(block_expert_ptr, N, BLOCK_N: tl.constexpr):
    """(this program's block of rows, its block of columns, the block's expert; -1: nothing to do)."""
    pid = tl.program_id(0)
    num_n = N // BLOCK_N
    m_blk = pid // num_n  # consecutive programs share a block of rows (its codes stay in L2) and read other weights
    return m_blk, pid % num_n, tl.load(block_expert_ptr + m_blk)


@triton.jit
def _scaled_step(acc, a, b, sa_ptr, sb_ptrs, kb, rows, rm, DOT_F32: tl.constexpr):
    """acc + (a @ b^T) * row scales * weight-block scales of K step kb."""
    sa = tl.load(sa_ptr + kb * rows + rm)
    sb = tl.load(sb_ptrs + kb)
    if DOT_F32:
        part = tl.dot(a.to(tl.float32), tl.trans(b.to(tl.float32)))
    else:
        part = tl.dot(a, tl.trans(b))
    return acc + part * sa[:, None] * sb[None, :]


@triton.jit(do_not_specialize=["rows"])
def _grouped_fp8_gemm_kernel(a_ptr, sa_ptr, b_ptr, sb_ptr, d_ptr, block_expert_ptr, rows, N, K, stride_sb_e,
                             stride_sb_n, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                             DOT_F32: tl.constexpr):
    m_blk, n_blk, e = _tile_start(block_expert_ptr, N, BLOCK_N)
    if e < 0:
        return
    rm = m_blk * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = n_blk * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + rm.to(tl.int64)[:, None] * K + rk[None, :]
    b_ptrs = b_ptr + e.to(tl.int64) * N * K + rn.to(tl.int64)[:, None] * K + rk[None, :]
    sb_ptrs = sb_ptr + e.to(tl.int64) * stride_sb_e + (rn // 128) * stride_sb_n
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for kb in range(0, K // BLOCK_K):
        acc = _scaled_step(acc, tl.load(a_ptrs), tl.load(b_ptrs), sa_ptr, sb_ptrs, kb, rows, rm, DOT_F32)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K
    tl.store(d_ptr + rm.to(tl.int64)[:, None] * N + rn[None, :], acc.to(tl.bfloat16))


@triton.jit(do_not_specialize=["rows"])
def _grouped_fp8_gemm_tma_kernel(a_desc, sa_ptr, b_desc, sb_ptr, d_ptr, block_expert_ptr, rows, N, K, stride_sb_e,
                                 stride_sb_n, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """_grouped_fp8_gemm_kernel with the codes loaded by TMA (a_desc over a [rows, K], b_desc over b as [E*N, K])."""
    m_blk, n_blk, e = _tile_start(block_expert_ptr, N, BLOCK_N)
    if e < 0:
        return
    rm = m_blk * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = n_blk * BLOCK_N + tl.arange(0, BLOCK_N)
    b_row = e * N + n_blk * BLOCK_N
    sb_ptrs = sb_ptr + e.to(tl.int64) * stride_sb_e + (rn // 128) * stride_sb_n
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for kb in range(0, K // BLOCK_K):
        a = a_desc.load([m_blk * BLOCK_M, kb * BLOCK_K])
        b = b_desc.load([b_row, kb * BLOCK_K])
        acc = _scaled_step(acc, a, b, sa_ptr, sb_ptrs, kb, rows, rm, False)
    tl.store(d_ptr + rm.to(tl.int64)[:, None] * N + rn[None, :], acc.to(tl.bfloat16))


def grouped_fp8_gemm(a: tuple[torch.Tensor, torch.Tensor], b: tuple[torch.Tensor, torch.Tensor], d: torch.Tensor,
                     block_expert: torch.Tensor, *, block_n: int = 128, warps: int = 8, stages: int = 4,
                     tma: bool = False) -> None:
    """d <- the grouped GEMM of (a codes, a scales) and (b codes, b scales) over block_expert int32 [rows / 128]
    (AlignedRoutes.block_expert of blocks of 128 rows). Shapes as the module says; K and N multiples of 128."""
    (aq, sa), (bq, sb) = a, b
    rows, k = aq.shape
    g, n, kb = bq.shape
    if kb != k or k % GROUP or n % GROUP or rows % BLOCK_M or n % block_n:
        raise ValueError(f"grouped_fp8_gemm: a [{rows}, {k}], b [{g}, {n}, {kb}], BLOCK_N {block_n}: K and N must be "
                         f"multiples of {GROUP}, rows of {BLOCK_M}, N of BLOCK_N")
    if not (aq.is_contiguous() and bq.is_contiguous() and sb.is_contiguous()):
        raise ValueError("grouped_fp8_gemm: a, b and b's scales must be contiguous")
    if sa.shape != (rows, k // GROUP) or sa.stride() != (1, rows) or sb.shape != (g, n // GROUP, k // GROUP):
        raise ValueError("grouped_fp8_gemm: sa must be [rows, K/128] MN-major, sb [E, N/128, K/128]")
    if block_expert.shape != (rows // BLOCK_M,) or block_expert.dtype != torch.int32:
        raise ValueError(f"grouped_fp8_gemm: block_expert must be int32 [{rows // BLOCK_M}]")
    if d.shape != (rows, n) or d.dtype != torch.bfloat16 or not d.is_contiguous():
        raise ValueError(f"grouped_fp8_gemm: d must be contiguous bf16 [{rows}, {n}]")
    if rows == 0:
        return
    grid = (rows // BLOCK_M * (n // block_n),)
    if tma:  # Hopper's tensor memory accelerator loads the codes (host-made descriptors: no device allocator)
        from triton.tools.tensor_descriptor import TensorDescriptor

        _grouped_fp8_gemm_tma_kernel[grid](
            TensorDescriptor.from_tensor(aq, [BLOCK_M, GROUP]), sa,
            TensorDescriptor.from_tensor(bq.view(g * n, k), [block_n, GROUP]), sb, d, block_expert, rows, n, k,
            sb.stride(0), sb.stride(1), BLOCK_M=BLOCK_M, BLOCK_N=block_n, BLOCK_K=GROUP, num_warps=warps,
            num_stages=stages)
        return
    _grouped_fp8_gemm_kernel[grid](
        aq, sa, bq, sb, d, block_expert, rows, n, k, sb.stride(0), sb.stride(1), BLOCK_M=BLOCK_M, BLOCK_N=block_n,
        BLOCK_K=GROUP, DOT_F32=_DOT_F32, num_warps=warps, num_stages=stages)
