"""The routed-experts pipeline around an m-grouped FP8-activation GEMM in the contiguous layout (DeepGEMM's
`m_grouped_fp8*_gemm_nt_contiguous` on SM90 with FP8 weights and on SM100 with FP4 weights): one model of the
glue, the GEMM passed in. Sizes depend on T, k, E only and nothing syncs: CUDA-graph safe.

  1. routes grouped by expert in blocks of the GEMM's M alignment;
  2. gather each route's token row and quantize it 1x128 (fp32 scales written MN-major), writing grouped_layout
     on the way (each row's expert, -1 for padding rows: SM90 skips their 64-row halves); GEMM1 -> [rows, 2I];
  3. DSV4's clamped SwiGLU and quantize 1x128 again; GEMM2 -> [rows, H];
  4. each token sums its routes' rows times the routing weights (dropped routes contribute 0).

psum=True uses DeepGEMM's psum layout instead of the per-row one: grouped_layout is AlignedRoutes.expert_end
(int32 [E], each expert's unaligned end; expert e starts at align(end[e-1], alignment)), so the GEMM schedules
ceil(count / alignment) blocks an expert and never visits the padding tail of the route capacity; step 2 then
writes no per-row layout. Rows the GEMM skips are never read: the SwiGLU pass and the combine read the rows of
valid routes only, and those lie inside [start, end) of their expert."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from dsv4hal.kernels.moe_align import align_routes
from dsv4hal.kernels.triton.moe_combine import combine_routes
from dsv4hal.kernels.triton.moe_quant import quantize_routed_rows


def psum_expected_m(num_routes: int, num_experts: int) -> int:
    """DeepGEMM's expected_m_for_psum_layout (the rows an expert is expected to get: its config heuristic then
    sizes the GEMM as E groups of that many rows): ceil(T*k / E), from shapes only (no device read)."""
    return max(1, -(-num_routes // max(num_experts, 1)))


def grouped_fp8_moe(gemm: Callable[..., None], x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
                    weights: Any, swiglu_limit: float, *, pow2_scales: bool = False, psum: bool = False,
                    **gemm_kwargs: Any) -> torch.Tensor:
    """x bf16 [T, H], topk_ids int [T, k], topk_weights fp32 [T, k] -> bf16 [T, H] (routed experts only).

    gemm((a e4m3fn [rows, K], sfa fp32 [rows, K/128] MN-major), (w, w_scale), d bf16 [rows, N], grouped_layout,
    **gemm_kwargs) writes d; grouped_layout: int32 [rows] (each row's expert, -1 for padding), or with psum
    int32 [E] (each expert's unaligned end) and the keywords use_psum_layout=True, expected_m_for_psum_layout.
    weights: an ExpertTensors (w13, w2 and their scales as the GEMM takes them) with an `alignment`.
    pow2_scales: activation scales rounded up to powers of two and padding rows zeroed (SM100 packs UE8M0)."""
    t, k = topk_ids.shape
    h, i = x.shape[1], weights.intermediate
    p = t * k
    if p == 0:
        return torch.zeros(t, h, dtype=torch.bfloat16, device=x.device)
    routes = align_routes(topk_ids, weights.num_experts, weights.alignment)
    sorted_routes = routes.sorted_routes
    rows = sorted_routes.numel()
    layout: torch.Tensor | None = None
    if psum:  # the ends come from route alignment; the gather pass writes no per-row layout
        grouped_layout = routes.expert_end
        gemm_kwargs = {**gemm_kwargs, "use_psum_layout": True,
                       "expected_m_for_psum_layout": psum_expected_m(p, weights.num_experts)}
    else:  # the gather pass writes the per-row layout from block_expert (three torch kernels less a call)
        layout = grouped_layout = torch.empty(rows, dtype=torch.int32, device=x.device)
    a1, s1 = quantize_routed_rows(x.contiguous(), sorted_routes, p, k, h, gather=True, pow2_scales=pow2_scales,
                                  layout=layout, block_expert=routes.block_expert, row_of_route=routes.row_of_route)
    d1 = torch.empty(rows, 2 * i, dtype=torch.bfloat16, device=x.device)
    gemm((a1.view(torch.float8_e4m3fn), s1), (weights.w13, weights.w13_scale), d1, grouped_layout, **gemm_kwargs)
    a2, s2 = quantize_routed_rows(d1, sorted_routes, p, k, i, gather=False, swiglu_limit=swiglu_limit,
                                  pow2_scales=pow2_scales)
    d2 = torch.empty(rows, h, dtype=torch.bfloat16, device=x.device)
    gemm((a2.view(torch.float8_e4m3fn), s2), (weights.w2, weights.w2_scale), d2, grouped_layout, **gemm_kwargs)
    # dropped routes (row == rows) are skipped, not multiplied by 0: padding rows (and with psum the rows past each
    # expert's end) may hold anything
    return combine_routes(d2, routes.row_of_route.view(t, k), topk_weights, rows)
