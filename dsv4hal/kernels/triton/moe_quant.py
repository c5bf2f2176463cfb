"""Per-token 1x128 FP8 quantization of routed rows, the activations of FP8 grouped GEMMs (DeepGEMM's contiguous
layout): one program per sorted row, skipping padding rows, writing e4m3fn codes and fp32 scales.

Two sources: GATHER (row r takes x[token of route r], the input of GEMM1) or SWIGLU (row r is GEMM1's output
[gate | up] at row r; it becomes min(g, limit) -> silu times clamp(u, -limit, limit), the input of GEMM2).
Scales are amax / 448 (amax floored at 1e-4, as DeepGEMM's per_token_cast_to_fp8) and are written MN-major,
sf[g, r], so the [rows, K/128] view DeepGEMM wants on SM90 needs no per-call transform. The FP8 codes are
made with integer arithmetic (fp8_codec), so the interpreter gives the GPU's bytes."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dsv4hal.kernels.triton.fp8_codec import _encode_fp8
from dsv4hal.kernels.triton.moe_activation import _swiglu_f32, _to_bf16, swiglu_limit_args

GROUP = 128


@triton.jit
def _quant_rows_kernel(src_ptr, stride_src, sorted_ptr, q_ptr, sf_ptr, stride_sf_g, num_routes, top_k, K, limit,
                       GATHER: tl.constexpr, SWIGLU: tl.constexpr, CLAMP: tl.constexpr, POW2: tl.constexpr):
    r = tl.program_id(0)
    route = tl.load(sorted_ptr + r)
    cols = tl.arange(0, 128)
    if route >= num_routes:
        if POW2:  # padding rows get zero codes and scale 1: the GEMM may read (and pack) every row
            for g in range(0, K // 128):
                tl.store(q_ptr + r.to(tl.int64) * K + g * 128 + cols, tl.zeros([128], dtype=tl.uint8))
                tl.store(sf_ptr + g * stride_sf_g + r, 1.0)
        return
    src_row = (route // top_k) if GATHER else r
    base = src_ptr + src_row.to(tl.int64) * stride_src
    for g in range(0, K // 128):
        c = g * 128 + cols
        if SWIGLU:  # bf16 activations, as the other paths
            act = _swiglu_f32(tl.load(base + c).to(tl.float32), tl.load(base + K + c).to(tl.float32), limit, CLAMP)
            v = _to_bf16(act).to(tl.float32)
        else:
            v = tl.load(base + c).to(tl.float32)
        amax = tl.maximum(tl.max(tl.abs(v), axis=0), 1e-4)
        scale = amax / 448.0
        if POW2:  # rounded up to a power of two (UE8M0), exactly representable: SM100 packs scales to UE8M0
            bits = scale.to(tl.int32, bitcast=True)
            up = (bits & 0x7FFFFF) != 0
            scale = ((bits & 0x7F800000) + tl.where(up, 0x800000, 0)).to(tl.float32, bitcast=True)
        y = tl.minimum(tl.maximum(v / scale, -448.0), 448.0)
        tl.store(q_ptr + r.to(tl.int64) * K + c, _encode_fp8(y, False))
        tl.store(sf_ptr + g * stride_sf_g + r, scale)


def quantize_routed_rows(src: torch.Tensor, sorted_routes: torch.Tensor, num_routes: int, top_k: int, k_dim: int,
                         *, gather: bool, swiglu_limit: float | None = None,
                         pow2_scales: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (codes uint8 [rows, K] (view as float8_e4m3fn), scales fp32 [rows, K/128] with strides (1, rows)).

    rows = sorted_routes.numel() (a multiple of 4, so the MN-major scales are TMA-aligned); padding rows
    (sorted_routes >= num_routes) are left unwritten, or with pow2_scales (scales rounded up to powers of two,
    as SM100's UE8M0 packing needs) written as zeros with scale 1. src: x [T, K] (gather) or GEMM1's output
    [rows, 2K]."""
    if k_dim % GROUP:
        raise ValueError(f"quantize_routed_rows: K={k_dim} is not a multiple of {GROUP}")
    rows = sorted_routes.numel()
    q = torch.empty(rows, k_dim, dtype=torch.uint8, device=src.device)
    sf = torch.empty(k_dim // GROUP, rows, dtype=torch.float32, device=src.device)
    if rows:
        limit, clamp = swiglu_limit_args(swiglu_limit)
        _quant_rows_kernel[(rows,)](src, src.stride(0), sorted_routes, q, sf, sf.stride(0), num_routes, top_k, k_dim,
                                    limit, GATHER=gather, SWIGLU=swiglu_limit is not None, CLAMP=clamp,
                                    POW2=pow2_scales)
    return q, sf.t()
