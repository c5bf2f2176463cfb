"""MXFP4 routed experts on SM100 through FlashInfer's TRTLLM-Gen `trtllm_fp4_block_scale_routed_moe` (MXFP8
activations x MXFP4 weights; FlashInfer 0.6.12 as vLLM 0.24 pins it), behind moe_experts. Facts:
docs/vendor-apis.md section 4.

Weights (layout "trtllm-gen-mxfp4"): GEMM1 rows [w3; w1] interleaved (up_j, gate_j), every matrix shuffled for
epilogue_tile_m 128 and its UE8M0 scales swizzled 128x4 (moe_layouts.to_trtllm); scales are passed as
float8_e4m3fn views of those bytes (the launcher checks the dtype; MXFP4 is inferred from the element count).
Activations: flashinfer.mxfp8_quantize with a linear (unswizzled) scale layout.
Routing is dsv4hal's (moe_route): the routed variant takes (ids int32, weights bf16) and applies the weights;
routed_scaling_factor is not applied there (our weights already carry the x1.5). The clamp is
gemm1_clamp_limit = swiglu_limit per expert with alpha and beta unset: min(gate, L), clamp(up, -L, L), as DSV4.
Dropped routes (-1) are non-local experts to the kernel. Not run here (no Blackwell GPU)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dsv4hal.prepared import ExpertTensors

if TYPE_CHECKING:
    import torch

    from dsv4hal.formats.experts import ExpertWeights
    from dsv4hal.hardware import PlatformInfo

NAME = "flashinfer_trtllm_mxfp4"
LAYOUT = "trtllm-gen-mxfp4"
ROUTING_TOPK = 5  # RoutingMethodType.TopK: ids given, no scoring
ACTIVATION_SWIGLU = 3  # ActivationType.Swiglu (gated SiLU; the clamp comes from gemm1_clamp_limit)


@dataclass(frozen=True)
class TrtllmMoeWeights(ExpertTensors):
    """w13 uint8 [E, 2I, H/2] and w2 uint8 [E, H, I/2] with rows reordered; w13_scale [E, 2I, H/32] and w2_scale
    [E, H, I/32] swizzled UE8M0 bytes viewed as float8_e4m3fn."""


def shape_reasons(hidden: int, intermediate: int) -> list[str]:
    from dsv4hal.kernels.moe_support import multiple_of_reasons

    return multiple_of_reasons("TRTLLM-Gen MXFP4 MoE here", hidden, intermediate, 128,
                               "row shuffle and unpadded 128x4 scale swizzle")


def supports(case: Mapping[str, object], info: PlatformInfo) -> list[str]:
    from dsv4hal.kernels.moe_support import expert_case_reasons

    return expert_case_reasons(case, info, kernel="TRTLLM-Gen", fmt="mxfp4", shape_reasons=shape_reasons,
                               fmt_reason="this TRTLLM-Gen binding runs MXFP4 weights (MXFP8 x MXFP4)")


def prepare_weights(weights: ExpertWeights) -> TrtllmMoeWeights:
    import torch
    from dsv4hal_cuda_sm100.moe_layouts import to_trtllm

    from dsv4hal.kernels.moe_support import check_prepare

    check_prepare(weights, NAME, "mxfp4", shape_reasons)
    w13, s13 = to_trtllm(weights.w13, weights.w13_scale, gated=True)
    w2, s2 = to_trtllm(weights.w2, weights.w2_scale, gated=False)
    return TrtllmMoeWeights(w13=w13, w13_scale=s13.view(torch.float8_e4m3fn), w2=w2,
                            w2_scale=s2.view(torch.float8_e4m3fn), num_experts=weights.num_experts,
                            hidden=weights.hidden, intermediate=weights.intermediate)


def _flashinfer() -> tuple[Any, Any]:
    from flashinfer import mxfp8_quantize
    from flashinfer.fused_moe import trtllm_fp4_block_scale_routed_moe

    return mxfp8_quantize, trtllm_fp4_block_scale_routed_moe


def moe_experts(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, weights: TrtllmMoeWeights,
                swiglu_limit: float = 10.0) -> torch.Tensor:
    """x bf16 [T, H], topk_ids int [T, k], topk_weights fp32 [T, k] -> bf16 [T, H] (routed experts only)."""
    import math

    import torch

    quantize, moe = _flashinfer()
    t, k = topk_ids.shape
    e = weights.num_experts
    if t == 0:
        return torch.zeros(0, weights.hidden, dtype=torch.bfloat16, device=x.device)
    xq, xs = quantize(x.contiguous(), is_sf_swizzled_layout=False)
    clamp = None if math.isinf(swiglu_limit) else torch.full((e,), float(swiglu_limit), device=x.device)
    out = moe((topk_ids.to(torch.int32).contiguous(), topk_weights.to(torch.bfloat16).contiguous()), None,
              xq, xs.view(torch.float8_e4m3fn).reshape(t, -1),
              weights.w13, weights.w13_scale, None, None, None, clamp,
              weights.w2, weights.w2_scale, None,
              None, None, None,  # output scales: not used by MXFP8 x MXFP4
              e, k, None, None, weights.intermediate, 0, e, None,
              routing_method_type=ROUTING_TOPK, do_finalize=True, activation_type=ACTIVATION_SWIGLU)
    return out[0]
