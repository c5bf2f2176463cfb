"""Portable Triton indexer_q_prep (spec 4.2 steps 2-3): one launch from the indexer's two projections to what
indexer_logits reads.

A program takes BLOCK_H heads of one token, one head at a time as a [128] fp32 vector: RoPE on its last 64 dims at
the token's position (the compressor's function) and the Walsh-Hadamard transform in the reference's butterfly
order, the per-head scale max(amax, 1e-4) / FP8_MAX and the codes (IEEE divisions, as the reference's tensor
divisions), and the head's weight times 128^-0.5 * 64^-0.5 * scale. Every fp32 rounding is the reference's, in its
order (the launch turns off FMA contraction, which would fuse RoPE's products into its sums): the outputs equal the
reference's bit for bit. Fixed grid, no host sync: CUDA-graph safe. As the reference: a position outside the RoPE
table is clamped into it, the rotated head saturates at +-Q_PREP_SATURATION (the Hadamard sums stay finite) and the
folded weight at the fp32 max."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dsv4hal.formats.fp8 import FP8_MAX, fp8_dtype
from dsv4hal.kernels.triton.compress import rope_last64, rope_table, table_row
from dsv4hal.kernels.triton.fp8_codec import fp8_bits, hardware_fp8
from dsv4hal.ops.indexer_logits import F32_MAX, INDEX_DIM, INDEX_HEADS, Q_PREP_SATURATION, WEIGHT_FOLD

BLOCK_H = 4  # heads a program prepares, one after another
# globals a kernel reads must be constexpr (compiled Triton refuses other globals)
_SAT = tl.constexpr(Q_PREP_SATURATION)
_F32_MAX = tl.constexpr(F32_MAX)
_NAN_ALL = tl.constexpr(tl.PropagateNan.ALL)  # a NaN stays NaN through the clamps, as torch.clamp's


@triton.jit
def _butterfly(y, H: tl.constexpr):
    """One Hadamard stage: each pair (a, b) = (y[i], y[i + H]) of a 2H-wide block becomes (a + b, a - b)."""
    a, b = tl.split(tl.permute(tl.reshape(y, [64 // H, 2, H]), (0, 2, 1)))  # [blocks, H] halves
    return tl.reshape(tl.permute(tl.join(a + b, a - b), (0, 2, 1)), [128])


@triton.jit
def hadamard128_exact(y):
    """Orthonormal Walsh-Hadamard of a [128] fp32 vector in the reference's butterfly order (reference.compress.
    hadamard_transform): stages H = 1, 2, ..., 64 (seven calls: a constexpr assigned in a loop compiles only under
    the interpreter), then the scale 128^-0.5; the reference's fp32 roundings in its order (896 adds). The
    compressor keeps its H_8 x H_16 form (compress.hadamard128), compared within its tolerance."""
    y = _butterfly(_butterfly(_butterfly(_butterfly(y, 1), 2), 4), 8)
    y = _butterfly(_butterfly(_butterfly(y, 16), 32), 64)
    return y * 0.08838834764831845  # 128 ** -0.5


@triton.jit
def _clamp(x, bound):
    return tl.minimum(tl.maximum(x, -bound, propagate_nan=_NAN_ALL), bound, propagate_nan=_NAN_ALL)


@triton.jit
def _q_prep_kernel(q_ptr, w_ptr, stride_w, cos_ptr, stride_cos, sin_ptr, stride_sin, max_pos, pos_ptr, q8_ptr,
                   w_out_ptr, fp8_max, fold, BLOCK_H: tl.constexpr, FNUZ: tl.constexpr, HW: tl.constexpr):
    t = tl.program_id(0)
    pos = table_row(tl.load(pos_ptr + t).to(tl.int64), max_pos)
    d = tl.arange(0, 128)
    for i in tl.static_range(BLOCK_H):
        h = tl.program_id(1) * BLOCK_H + i
        row = (t * 64 + h).to(tl.int64) * 128
        y = tl.load(q_ptr + row + d).to(tl.float32)
        y = _clamp(rope_last64(y, cos_ptr + pos * stride_cos, sin_ptr + pos * stride_sin, 128), _SAT)
        y = hadamard128_exact(y)
        qs = tl.math.div_rn(tl.maximum(tl.max(tl.abs(y), axis=0), 1e-4), fp8_max)
        v = tl.minimum(tl.maximum(tl.math.div_rn(y, qs), -fp8_max), fp8_max)
        tl.store(q8_ptr + row + d, fp8_bits(v, FNUZ, HW))
        w = tl.load(w_ptr + t.to(tl.int64) * stride_w + h).to(tl.float32)
        tl.store(w_out_ptr + t * 64 + h, _clamp(w * fold * qs, _F32_MAX))


def indexer_q_prep(q: torch.Tensor, weights: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                   positions: torch.Tensor, fp8: str = "e4m3fn") -> tuple[torch.Tensor, torch.Tensor]:
    """The contract's indexer_q_prep (dsv4hal.ops.indexer_logits)."""
    t = q.shape[0]
    q8 = torch.empty(t, INDEX_HEADS, INDEX_DIM, dtype=torch.uint8, device=q.device)
    w_out = torch.empty(t, INDEX_HEADS, dtype=torch.float32, device=q.device)
    if t:
        cos, sin = rope_table(cos, sin)
        _q_prep_kernel[(t, INDEX_HEADS // BLOCK_H)](
            q, weights, weights.stride(0), cos, cos.stride(0), sin, sin.stride(0), cos.shape[0], positions, q8, w_out,
            FP8_MAX[fp8], WEIGHT_FOLD, BLOCK_H=BLOCK_H, FNUZ=fp8 == "e4m3fnuz", HW=hardware_fp8(q.device), num_warps=2,
            enable_fp_fusion=False)  # no FMA contraction: RoPE's products rounded apart, as the reference's
    return q8.view(fp8_dtype(fp8)), w_out
