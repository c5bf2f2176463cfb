"""FP8 block-scaled routed experts on Hopper through DeepGEMM's m-grouped FP8 GEMM (contiguous layout), behind
dsv4hal's moe_experts contract. DeepGEMM as vLLM 0.24 bundles it (= deepseek-ai/DeepGEMM 891d57b, v2.5.0;
docs/vendor-apis.md 2.2-2.3): `m_grouped_fp8_gemm_nt_contiguous((a, sfa), (b, sfb), d, grouped_layout)`.

Weights (layout "deepgemm-fp8-nt"): the checkpoint's e4m3fn w13 [E, 2I, H] and w2 [E, H, I] are already K-major
(NT), and their 128x128 block scales fp32 [E, ceil(N/128), ceil(K/128)] are SM90's SFB layout: preparing only
views the bytes as float8_e4m3fn and makes the scales fp32 and contiguous.

A call (sizes depend on T, k, E only; no host sync: CUDA-graph safe):
  1. routes grouped by expert in blocks of DeepGEMM's M alignment (128), rows = worst-case capacity; grouped_layout
     gives each row its expert, -1 for padding rows (DeepGEMM skips them);
  2. a Triton kernel gathers each route's token row and quantizes it 1x128 (fp32 scales, written MN-major so
     DeepGEMM does not transform them per call); GEMM1 -> [rows, 2I] bf16;
  3. a Triton kernel applies DSV4's clamped SwiGLU and quantizes 1x128 again; GEMM2 -> [rows, H] bf16;
  4. a Triton kernel sums each token's routes' rows times the routing weights (dropped routes contribute 0).
The masked layout (decode) would size [E, max per-expert count, H]; a bound on that count needs distinct experts
per token, which the contract does not promise, so decode runs the contiguous layout too.

This module imports torch and deep_gemm only inside functions: registering the plugin stays free."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dsv4hal.prepared import ExpertTensors

if TYPE_CHECKING:
    import torch

    from dsv4hal.hardware import PlatformInfo
    from dsv4hal.reference.moe import ExpertWeights
    from dsv4hal.registry import Registry

NAME = "deepgemm_fp8_sm90"
LAYOUT = "deepgemm-fp8-nt"
LIBRARY = "deep_gemm"
BLOCK = 128  # FP8 block of the weights and 1x128 groups of the activations


@dataclass(frozen=True)
class DeepGemmWeights(ExpertTensors):
    """w13 float8_e4m3fn [E, 2I, H], w13_scale fp32 [E, 2I/128, H/128]; w2 float8_e4m3fn [E, H, I],
    w2_scale fp32 [E, H/128, I/128]; alignment: DeepGEMM's M alignment of the contiguous layout when prepared."""

    alignment: int


def shape_reasons(hidden: int, intermediate: int) -> list[str]:
    bad = [f"{n}={v}" for n, v in (("H", hidden), ("I", intermediate)) if v % BLOCK]
    return [f"DeepGEMM FP8 MoE needs H and I multiples of {BLOCK} (1x128 activation groups); got "
            + ", ".join(bad)] if bad else []


def supports(case: Mapping[str, object], info: PlatformInfo) -> list[str]:
    from dsv4hal_cuda_sm90.moe_support import expert_case_reasons

    return expert_case_reasons(case, info, kernel="DeepGEMM", fmt="fp8_block", shape_reasons=shape_reasons,
                               fmt_reason="DeepGEMM's SM90 grouped GEMM takes FP8 weights only (FP4 operands are "
                                          "SM100-only)")


def register_deepgemm(registry: Registry) -> None:
    from dsv4hal.registry import KernelImpl

    registry.add_kernel(KernelImpl(
        op="moe_experts", name=NAME, target="dsv4hal_cuda_sm90.deepgemm_moe:moe_experts",
        prepare="dsv4hal_cuda_sm90.deepgemm_moe:prepare_weights", platforms=("cuda_sm90",),
        priority=290,  # H200 conformance: bench/results/h200/conformance-cuda_sm90-moe.json
        tier="vendor", requires=(LIBRARY,), supports=supports, layout=LAYOUT,
        description="DeepGEMM m_grouped_fp8_gemm_nt_contiguous (FP8 1x128 activations x 128x128-block weights), "
                    "Triton gather+quant and clamped SwiGLU+quant between the GEMMs"))


def _deep_gemm() -> Any:
    import deep_gemm

    return deep_gemm


def prepare_weights(weights: ExpertWeights) -> DeepGemmWeights:
    import torch

    if weights.format != "fp8_block" or weights.fp8 != "e4m3fn":
        raise ValueError(f"{NAME} takes fp8_block e4m3fn expert weights; got {weights.format!r} "
                         f"({weights.fp8!r}): MXFP4 goes to Marlin or the Triton fused MoE")
    reasons = shape_reasons(weights.hidden, weights.intermediate)
    if reasons:
        raise ValueError(f"{NAME}: " + "; ".join(reasons))

    def fp8(t: torch.Tensor) -> torch.Tensor:
        t = t.contiguous()
        return t if t.dtype == torch.float8_e4m3fn else t.view(torch.float8_e4m3fn)

    return DeepGemmWeights(
        w13=fp8(weights.w13), w13_scale=weights.w13_scale.float().contiguous(),
        w2=fp8(weights.w2), w2_scale=weights.w2_scale.float().contiguous(),
        num_experts=weights.num_experts, hidden=weights.hidden, intermediate=weights.intermediate,
        alignment=int(_deep_gemm().get_mk_alignment_for_contiguous_layout()))


def moe_experts(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, weights: DeepGemmWeights,
                swiglu_limit: float = 10.0) -> torch.Tensor:
    """x bf16 [T, H], topk_ids int [T, k], topk_weights fp32 [T, k] -> bf16 [T, H] (routed experts only)."""
    import torch

    from dsv4hal.kernels.moe_align import align_routes
    from dsv4hal.kernels.triton.moe_combine import combine_routes
    from dsv4hal.kernels.triton.moe_quant import quantize_routed_rows

    t, k = topk_ids.shape
    h, i, e = weights.hidden, weights.intermediate, weights.num_experts
    p = t * k
    if p == 0:
        return torch.zeros(t, h, dtype=torch.bfloat16, device=x.device)
    dg = _deep_gemm()
    routes = align_routes(topk_ids, e, weights.alignment)
    sorted_routes = routes.sorted_routes
    rows = sorted_routes.numel()
    layout = torch.where(sorted_routes < p, routes.block_expert.repeat_interleave(weights.alignment), -1)
    layout = layout.to(torch.int32)
    a1, s1 = quantize_routed_rows(x.contiguous(), sorted_routes, p, k, h, gather=True)
    d1 = torch.empty(rows, 2 * i, dtype=torch.bfloat16, device=x.device)
    dg.m_grouped_fp8_gemm_nt_contiguous((a1.view(torch.float8_e4m3fn), s1), (weights.w13, weights.w13_scale), d1,
                                        layout)
    a2, s2 = quantize_routed_rows(d1, sorted_routes, p, k, i, gather=False, swiglu_limit=swiglu_limit)
    d2 = torch.empty(rows, h, dtype=torch.bfloat16, device=x.device)
    dg.m_grouped_fp8_gemm_nt_contiguous((a2.view(torch.float8_e4m3fn), s2), (weights.w2, weights.w2_scale), d2,
                                        layout)
    # dropped routes (row == rows) are skipped, not multiplied by 0: padding rows are never written
    return combine_routes(d2, routes.row_of_route.view(t, k), topk_weights, rows)
