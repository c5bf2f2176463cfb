"""MXFP4 routed experts on gfx950 through aiter's `fused_moe` (ROCm/aiter e4048607), a8w4: FP8 activations (aiter
quantizes them, 1x32 e8m0) x MXFP4 weights in the gate/up-interleaved FlyDSL layout, behind moe_experts.

Call: fused_moe(x, w13, w2, topk_weight fp32, topk_ids int32, activation=ActivationType.Silu,
quant_type=QuantType.per_1x32, doweight_stage1=False, w1_scale, w2_scale, dtype=bf16, swiglu_limit=10,
gate_mode="interleave"): with Silu aiter computes silu(min(g, L)) * clamp(u, -L, L), DSV4's clamped SwiGLU
(Swiglu is gpt-oss's form); the output is already weighted by topk_weight. Weights are float4_e2m1fn_x2 views
marked is_shuffled (aiter picks its shuffled-weight kernels by that attribute), laid out by moe_layouts.

Two facts of aiter 's dispatch make this binding refuse to run rather than silently differ:
  * below AITER_BF16_FP8_MOE_BOUND tokens (default 256) the interleaved path runs bf16 activations on kernels
    that drop the SwiGLU clamp, so the variable must be 0 (every batch on the FP8-activation FlyDSL kernels);
  * MXFP4 MoE kernels exist for gfx950 only (gfx942 has neither the CK instances nor the scaled MFMA).
Not run here (no AMD GPU): its conformance cells are reported not-run."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dsv4hal.prepared import ExpertTensors

if TYPE_CHECKING:
    import torch

    from dsv4hal.formats.experts import ExpertWeights
    from dsv4hal.hardware import PlatformInfo

NAME = "aiter_fused_moe_mxfp4"
LAYOUT = "aiter-a8w4-gugu"
ARCHS = ("gfx950",)
BOUND_ENV = "AITER_BF16_FP8_MOE_BOUND"
ALL_TOKENS_FP8 = "aiter-fp8-moe-all-tokens"  # dsv4hal.hardware.ENV_CAPABILITIES: aiter with BOUND_ENV=0
GATE_MODE = "interleave"


@dataclass(frozen=True)
class AiterMoeWeights(ExpertTensors):
    """w13 float4_e2m1fn_x2 [E, 2I, H/2] and w2 [E, H, I/2] (a8w4 order, is_shuffled set), w13_scale uint8
    [E*2I, Kg(H)] and w2_scale uint8 [E*H, Kg(I)] (a8w4 order, K/32 padded to 8)."""


def shape_reasons(hidden: int, intermediate: int) -> list[str]:
    bad = [f"H={hidden} (a multiple of 256: FlyDSL's K tile)"] if hidden % 256 else []
    bad += [f"I={intermediate} (a multiple of 128)"] if intermediate % 128 else []
    return ["aiter's a8w4 MoE needs " + ", ".join(bad)] if bad else []


def supports(case: Mapping[str, object], info: PlatformInfo) -> list[str]:
    from dsv4hal.kernels.moe_support import expert_case_reasons

    reasons = expert_case_reasons(case, info, kernel="aiter fused_moe", fmt="mxfp4", shape_reasons=shape_reasons,
                                  fmt_reason="this aiter binding runs MXFP4 weights (a8w4)", fp8_check=False)
    if info.arch not in ARCHS:
        reasons.append(f"aiter's MXFP4 MoE kernels are built for {', '.join(ARCHS)} only; this GPU is {info.arch}")
    if not info.has(ALL_TOKENS_FP8):
        reasons.append(f"{BOUND_ENV} must be 0: below that many tokens aiter runs bf16 activations on kernels "
                       f"that drop the SwiGLU clamp (set it before the process starts; detection records it as "
                       f"the library key {ALL_TOKENS_FP8})")
    return reasons


def _fp4(t: torch.Tensor) -> torch.Tensor:
    import torch

    return t.view(torch.float4_e2m1fn_x2) if hasattr(torch, "float4_e2m1fn_x2") else t


def prepare_weights(weights: ExpertWeights) -> AiterMoeWeights:
    from dsv4hal_rocm.moe_layouts import shuffle_scales, shuffle_weights

    from dsv4hal.kernels.moe_support import check_prepare

    check_prepare(weights, NAME, "mxfp4", shape_reasons)
    return AiterMoeWeights(
        w13=shuffle_weights(weights.w13, gate_up=True), w13_scale=shuffle_scales(weights.w13_scale, gate_up=True),
        w2=shuffle_weights(weights.w2, gate_up=False), w2_scale=shuffle_scales(weights.w2_scale, gate_up=False),
        num_experts=weights.num_experts, hidden=weights.hidden, intermediate=weights.intermediate)


def _aiter() -> tuple[Any, Any, Any]:
    from aiter import ActivationType, QuantType
    from aiter.fused_moe import fused_moe

    return fused_moe, ActivationType, QuantType


def moe_experts(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, weights: AiterMoeWeights,
                swiglu_limit: float = 10.0) -> torch.Tensor:
    """x bf16 [T, H], topk_ids int [T, k], topk_weights fp32 [T, k] -> bf16 [T, H] (routed experts only)."""
    import math

    import torch

    fused_moe, activation, quant = _aiter()
    w13, w2 = _fp4(weights.w13), _fp4(weights.w2)
    w13.is_shuffled = True  # views lose the attribute: set it on the tensors passed
    w2.is_shuffled = True
    ids = topk_ids.to(torch.int32)
    # aiter has no "drop this route" id: a dropped route (-1, another rank's expert) keeps expert 0 with weight 0
    valid = (ids >= 0) & (ids < weights.num_experts)
    ids = torch.where(valid, ids, 0).contiguous()
    tw = torch.where(valid, topk_weights.float(), 0.0).contiguous()
    limit = None if math.isinf(swiglu_limit) else float(swiglu_limit)
    return fused_moe(x.contiguous(), w13, w2, tw, ids, activation=activation.Silu, quant_type=quant.per_1x32,
                     doweight_stage1=False, w1_scale=weights.w13_scale, w2_scale=weights.w2_scale,
                     dtype=torch.bfloat16, swiglu_limit=limit, gate_mode=GATE_MODE)
