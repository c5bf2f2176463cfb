"""DSV4's clamped SwiGLU, one piece of code for every MoE path that applies it between its GEMMs: in a GEMM's
epilogue (fused_moe), before quantizing rows (moe_quant), or as its own pass over a GEMM's output (`swiglu`,
the Marlin path).

  act = bf16(silu(min(gate, limit)) * clamp(up, -limit, limit)), in fp32,

rounded as torch's fp32 expression `(F.silu(g.clamp(max=l)) * u.clamp(-l, l)).to(bfloat16)`: silu is
g / (1 + exp(-g)) with one IEEE division (torch's formula; g * sigmoid(g) rounds twice), exp is libdevice's expf
(the CUDA expf torch's kernel calls; Triton's tl.exp is ex2.approx) and the product is rounded once to bf16 to
nearest even. NaNs propagate through the clamps as in torch. limit None or inf: no clamp.

Under the interpreter (no libdevice there) exp is numpy's, which differs from torch's CPU exp (Sleef) in the last
fp32 bit now and then: there a few elements in a million land one bf16 ulp away from torch; the interpreter's
fp32 -> bf16 cast truncates, so the bits are rounded to nearest even first."""

from __future__ import annotations

import math
import os

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
BLOCK = 1024  # columns per program: 8 bf16 per thread at 4 warps, 16-byte accesses

if _INTERPRET:
    @triton.jit
    def _exp(x):
        return tl.exp(x)  # numpy's; the interpreter cannot call libdevice

    @triton.jit
    def _to_bf16(v):
        """fp32 -> bf16 to nearest even: the interpreter's cast truncates, so round the bits first (a NaN keeps a
        quiet-NaN mantissa bit, so truncating it stays NaN)."""
        u = v.to(tl.uint32, bitcast=True)
        r = (u + (((u >> 16) & 1) + 0x7FFF)) & 0xFFFF0000
        r = tl.where(v != v, u | 0x400000, r)
        return r.to(tl.float32, bitcast=True).to(tl.bfloat16)
else:
    @triton.jit
    def _exp(x):
        return libdevice.exp(x)  # CUDA's expf (HIP: ocml's), as torch's silu kernel

    @triton.jit
    def _to_bf16(v):
        """fp32 -> bf16 to nearest even (cvt.rn)."""
        return v.to(tl.bfloat16)


@triton.jit
def _swiglu_f32(gate, up, limit, CLAMP: tl.constexpr):
    """fp32 gate, up -> fp32 silu(min(gate, limit)) * clamp(up, -limit, limit), with torch's fp32 roundings."""
    if CLAMP:
        gate = tl.minimum(gate, limit, propagate_nan=tl.PropagateNan.ALL)
        up = tl.minimum(tl.maximum(up, -limit, propagate_nan=tl.PropagateNan.ALL), limit,
                        propagate_nan=tl.PropagateNan.ALL)
    return tl.math.div_rn(gate, 1.0 + _exp(-gate)) * up


@triton.jit
def _swiglu_f32_fast(gate, up, limit, CLAMP: tl.constexpr):
    """_swiglu_f32 with the hardware's approximate exp (ex2.approx) and division (div.full), ~2 ulp each in fp32, so
    after rounding to bf16 an element may land one bf16 ulp from torch's (on the H200, GEMM1's real output at T =
    4096 gave none: moe_quant.FAST_SWIGLU). For the FP8 quantizers, whose 1x128 groups round to 3 mantissa bits
    anyway, and triton_kernels' fused activation; the exact form costs a pass its instruction budget (libdevice
    expf and an IEEE division an element). NaNs propagate through the clamps, as in _swiglu_f32."""
    if CLAMP:
        gate = tl.minimum(gate, limit, propagate_nan=tl.PropagateNan.ALL)
        up = tl.minimum(tl.maximum(up, -limit, propagate_nan=tl.PropagateNan.ALL), limit,
                        propagate_nan=tl.PropagateNan.ALL)
    return gate / (1.0 + tl.exp(-gate)) * up


@triton.jit
def _swiglu_kernel(x_ptr, out_ptr, stride_x, stride_out, I, limit, CLAMP: tl.constexpr, BLOCK: tl.constexpr):
    r = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = c < I
    row = x_ptr + r * stride_x
    gate = tl.load(row + c, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(row + I + c, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + r * stride_out + c, _to_bf16(_swiglu_f32(gate, up, limit, CLAMP)), mask=mask)


def swiglu_limit_args(limit: float | None) -> tuple[float, bool]:
    """-> (limit, CLAMP) for the kernels: None or inf disable the clamp (and keep inf out of kernel arguments)."""
    if limit is None or math.isinf(limit):
        return 0.0, False
    return float(limit), True


def swiglu(h13: torch.Tensor, limit: float | None) -> torch.Tensor:
    """h13 [R, 2I] (rows [gate | up], any float dtype) -> bf16 [R, I] = the clamped SwiGLU; one launch."""
    r, two_i = h13.shape
    if two_i % 2:
        raise ValueError(f"swiglu: the last dimension ({two_i}) is [gate | up], so it must be even")
    i = two_i // 2
    out = torch.empty(r, i, dtype=torch.bfloat16, device=h13.device)
    if r == 0 or i == 0:
        return out
    if h13.stride(1) != 1:
        h13 = h13.contiguous()
    lim, clamp = swiglu_limit_args(limit)
    block = min(BLOCK, triton.next_power_of_2(i))
    _swiglu_kernel[(r, triton.cdiv(i, block))](h13, out, h13.stride(0), out.stride(0), i, lim, CLAMP=clamp,
                                               BLOCK=block)
    return out
