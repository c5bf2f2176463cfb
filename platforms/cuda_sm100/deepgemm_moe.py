"""MXFP4 routed experts on SM100 through DeepGEMM's m-grouped FP8 x FP4 GEMM (`m_grouped_fp8_fp4_gemm_nt_contiguous`,
recipe_a (1, 128), recipe_b (1, 32)), behind moe_experts: dsv4hal.kernels.grouped_fp8_moe's pipeline (the one the
Hopper FP8 binding runs) with FP4 weights. Facts: docs/vendor-apis.md section 2, DeepGEMM 54e2261 / 891d57b.

Weights (layout "deepgemm-fp4-sm100"): the packed nibbles as they are (low nibble = even k, K-major), viewed as
int8; UE8M0 scales packed four k-groups an int32, MN-major and TMA-aligned (moe_layouts.pack_ue8m0_for_deepgemm),
the layout DeepGEMM would otherwise build on every call. SM100 packs activation scales to UE8M0 too, so the
activations are quantized with power-of-two scales (a non-power-of-two would be truncated or trap) and padding
rows, which SM100 computes, are zeroed with scale 1. Not run here (no Blackwell GPU)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dsv4hal.prepared import ExpertTensors

if TYPE_CHECKING:
    import torch

    from dsv4hal.formats.experts import ExpertWeights
    from dsv4hal.hardware import PlatformInfo

NAME = "deepgemm_fp8_fp4_sm100"
LAYOUT = "deepgemm-fp4-sm100"
RECIPE_A, RECIPE_B = (1, 128), (1, 32)


@dataclass(frozen=True)
class DeepGemmFp4Weights(ExpertTensors):
    """w13 int8 [E, 2I, H/2], w2 int8 [E, H, I/2]; w13_scale int32 [E, 2I, H/128] and w2_scale int32 [E, H, I/128]
    (packed UE8M0, MN-major); alignment: DeepGEMM's M alignment of the contiguous layout."""

    alignment: int


def shape_reasons(hidden: int, intermediate: int) -> list[str]:
    from dsv4hal.kernels.moe_support import multiple_of_reasons

    return multiple_of_reasons("DeepGEMM FP8 x FP4", hidden, intermediate, 128, "the FP4 TMA asserts K % 128")


def supports(case: Mapping[str, object], info: PlatformInfo) -> list[str]:
    from dsv4hal.kernels.moe_support import expert_case_reasons

    return expert_case_reasons(case, info, kernel="DeepGEMM", fmt="mxfp4", shape_reasons=shape_reasons,
                               fmt_reason="this DeepGEMM SM100 binding runs MXFP4 weights (FP8 x FP4)")


def _deep_gemm() -> Any:
    import deep_gemm

    return deep_gemm


def prepare_weights(weights: ExpertWeights) -> DeepGemmFp4Weights:
    import torch
    from dsv4hal_cuda_sm100.moe_layouts import pack_ue8m0_for_deepgemm

    from dsv4hal.kernels.moe_support import check_prepare

    check_prepare(weights, NAME, "mxfp4", shape_reasons)
    return DeepGemmFp4Weights(
        w13=weights.w13.contiguous().view(torch.int8), w13_scale=pack_ue8m0_for_deepgemm(weights.w13_scale),
        w2=weights.w2.contiguous().view(torch.int8), w2_scale=pack_ue8m0_for_deepgemm(weights.w2_scale),
        num_experts=weights.num_experts, hidden=weights.hidden, intermediate=weights.intermediate,
        alignment=int(_deep_gemm().get_mk_alignment_for_contiguous_layout()))


def moe_experts(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, weights: DeepGemmFp4Weights,
                swiglu_limit: float = 10.0) -> torch.Tensor:
    """x bf16 [T, H], topk_ids int [T, k], topk_weights fp32 [T, k] -> bf16 [T, H] (routed experts only)."""
    from dsv4hal.kernels.grouped_fp8_moe import grouped_fp8_moe

    return grouped_fp8_moe(_deep_gemm().m_grouped_fp8_fp4_gemm_nt_contiguous, x, topk_ids, topk_weights, weights,
                           swiglu_limit, pow2_scales=True, recipe_a=RECIPE_A, recipe_b=RECIPE_B)
