"""The routed-experts pipeline around an m-grouped FP8-activation GEMM in the contiguous layout (DeepGEMM's
`m_grouped_fp8*_gemm_nt_contiguous` on SM90 with FP8 weights and on SM100 with FP4 weights): one model of the
glue, the GEMM passed in. Sizes depend on T, k, E only and nothing syncs: CUDA-graph safe.

  1. routes grouped by expert in blocks of the GEMM's M alignment; grouped_layout gives each row its expert,
     -1 for padding rows (the GEMM skips them);
  2. gather each route's token row and quantize it 1x128 (fp32 scales written MN-major); GEMM1 -> [rows, 2I];
  3. DSV4's clamped SwiGLU and quantize 1x128 again; GEMM2 -> [rows, H];
  4. each token sums its routes' rows times the routing weights (dropped routes contribute 0)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from dsv4hal.kernels.moe_align import align_routes
from dsv4hal.kernels.triton.moe_combine import combine_routes
from dsv4hal.kernels.triton.moe_quant import quantize_routed_rows

# gemm(a e4m3fn [rows, K], sfa fp32 [rows, K/128] MN-major, d bf16 [rows, N] written, grouped_layout int32 [rows])
GroupedGemm = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], None]


def grouped_fp8_moe(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, *, num_experts: int,
                    intermediate: int, alignment: int, gemm1: GroupedGemm, gemm2: GroupedGemm,
                    swiglu_limit: float, pow2_scales: bool = False) -> torch.Tensor:
    """x bf16 [T, H], topk_ids int [T, k], topk_weights fp32 [T, k] -> bf16 [T, H] (routed experts only).
    pow2_scales: activation scales rounded up to powers of two and padding rows zeroed (SM100 packs UE8M0)."""
    t, k = topk_ids.shape
    h, i = x.shape[1], intermediate
    p = t * k
    if p == 0:
        return torch.zeros(t, h, dtype=torch.bfloat16, device=x.device)
    routes = align_routes(topk_ids, num_experts, alignment)
    sorted_routes = routes.sorted_routes
    rows = sorted_routes.numel()
    layout = torch.where(sorted_routes < p, routes.block_expert.repeat_interleave(alignment), -1).to(torch.int32)
    a1, s1 = quantize_routed_rows(x.contiguous(), sorted_routes, p, k, h, gather=True, pow2_scales=pow2_scales)
    d1 = torch.empty(rows, 2 * i, dtype=torch.bfloat16, device=x.device)
    gemm1(a1.view(torch.float8_e4m3fn), s1, d1, layout)
    a2, s2 = quantize_routed_rows(d1, sorted_routes, p, k, i, gather=False, swiglu_limit=swiglu_limit,
                                  pow2_scales=pow2_scales)
    d2 = torch.empty(rows, h, dtype=torch.bfloat16, device=x.device)
    gemm2(a2.view(torch.float8_e4m3fn), s2, d2, layout)
    # dropped routes (row == rows) are skipped, not multiplied by 0: padding rows are never written
    return combine_routes(d2, routes.row_of_route.view(t, k), topk_weights, rows)


def grouped_moe_with(gemm: Callable[..., None], x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
                     weights: Any, swiglu_limit: float, *, pow2_scales: bool = False,
                     **gemm_kwargs: Any) -> torch.Tensor:
    """grouped_fp8_moe with a DeepGEMM-style gemm((a, sfa), (w, sfw), d, layout, **gemm_kwargs) over the prepared
    weights' w13 / w2 (an ExpertTensors with an `alignment`)."""

    def gemm1(a: torch.Tensor, sfa: torch.Tensor, d: torch.Tensor, layout: torch.Tensor) -> None:
        gemm((a, sfa), (weights.w13, weights.w13_scale), d, layout, **gemm_kwargs)

    def gemm2(a: torch.Tensor, sfa: torch.Tensor, d: torch.Tensor, layout: torch.Tensor) -> None:
        gemm((a, sfa), (weights.w2, weights.w2_scale), d, layout, **gemm_kwargs)

    return grouped_fp8_moe(x, topk_ids, topk_weights, num_experts=weights.num_experts,
                           intermediate=weights.intermediate, alignment=weights.alignment, gemm1=gemm1, gemm2=gemm2,
                           swiglu_limit=swiglu_limit, pow2_scales=pow2_scales)
