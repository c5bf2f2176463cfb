"""FP8 block-scaled routed experts on Hopper through DeepGEMM's m-grouped FP8 GEMM (contiguous layout), behind
dsv4hal's moe_experts contract. DeepGEMM as vLLM 0.24 bundles it (= deepseek-ai/DeepGEMM 891d57b, v2.5.0;
docs/vendor-apis.md 2.2-2.3): `m_grouped_fp8_gemm_nt_contiguous((a, sfa), (b, sfb), d, grouped_layout)`.

Weights (layout "deepgemm-fp8-nt"): the checkpoint's e4m3fn w13 [E, 2I, H] and w2 [E, H, I] are already K-major
(NT), and their 128x128 block scales fp32 [E, ceil(N/128), ceil(K/128)] are SM90's SFB layout: preparing only
views the bytes as float8_e4m3fn and makes the scales fp32 and contiguous.

A call runs dsv4hal.kernels.grouped_fp8_moe (route alignment, Triton gather+quantize, clamped SwiGLU+quantize,
combine) around DeepGEMM's two grouped GEMMs. The masked layout (decode) would size [E, max per-expert count, H];
a bound on that count needs distinct experts per token, which the contract does not promise, so decode runs the
contiguous layout too.

What padding costs in 2.5.0 (deep_gemm/include/deep_gemm/scheduler/gemm.cuh, impls/sm90_fp8_gemm_1d2d.cuh): BLOCK_M
is the M alignment (128); every block of M = route capacity is scheduled, its A/SFA/B tiles loaded and its D tile
stored, and only the WGMMA of a 64-row half whose first row is -1 is skipped. The tail past the used blocks (~43%
of M at T=4096) thus costs loads and stores. `use_psum_layout=True` (grouped_layout int32 [E]: each expert's
unaligned end, start + count) schedules the used blocks only, on SM90 too; it needs those ends on the device.

Two implementations share this module, the prepared weights' layout and grouped_fp8_moe's one code path:
- deepgemm_fp8_sm90 (moe_experts): the per-row layout, written by the gather pass;
- deepgemm_fp8_psum_sm90 (moe_experts_psum): the psum layout, AlignedRoutes.expert_end from route alignment, and
  expected_m_for_psum_layout = ceil(T*k / E) from shapes. What it rests on, checked in vLLM 0.24's DeepGEMM 2.5.0
  (deep_gemm/_C*.so and headers): the pybind keywords of m_grouped_fp8_fp4_gemm_nt_contiguous (the function that
  m_grouped_fp8_gemm_nt_contiguous aliases) end in use_psum_layout, expected_m_for_psum_layout; on SM90 with fp32 SFA
  use_psum_layout selects GemmType::MGroupedContiguousWithPsumLayout (5) for sm90_fp8_gemm_1d2d, and
  expected_m_for_psum_layout (asserted absent without psum) sizes the config as E groups of expected_m rows;
  SM90ArchSpec::get_layout_candidates gives types 1 and 5 the single BLOCK_M get_mk_alignment_for_contiguous_layout()
  (128) and, for 5, multicast only when N / BLOCK_N is a multiple of the cluster; scheduler/gemm.cuh starts group g
  at align(psum[g-1], BLOCK_M), visits ceil((psum[g] - that) / BLOCK_M) blocks, and skips the WGMMA of a 64-row
  half that starts at or past psum[g]. On the H200 (bench-moe.json) it is faster than the per-row path from T = 8
  (1.07-1.34x, 1.5-3.6x with routes dropped for EP) and slower at T = 1: ranked above it.

This module imports torch and deep_gemm only inside functions: registering the plugin stays free."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dsv4hal.prepared import ExpertTensors

if TYPE_CHECKING:
    import torch

    from dsv4hal.formats.experts import ExpertWeights
    from dsv4hal.hardware import PlatformInfo

NAME = "deepgemm_fp8_sm90"
PSUM_NAME = "deepgemm_fp8_psum_sm90"
LAYOUT = "deepgemm-fp8-nt"
LIBRARY = "deep_gemm"
BLOCK = 128  # FP8 block of the weights and 1x128 groups of the activations
PSUM_MIN_VERSION = (2, 5, 0)  # the release whose SM90 psum layout was checked (earlier ones were not looked at)
# BLOCK_N the psum GEMMs are configured with (None: DeepGEMM's heuristic's own). At V4-Flash shapes the heuristic
# picks 192 for both GEMMs (N = 4096: 21 tiles and a third); set_block_size_multiple_of((1, 128)) leaves it 128 only.
# DeepGEMM keeps that setting process-wide and has no getter: it is set around each GEMM launch and put back to its
# default (1, 1) after. Measured in turns by bench/ab_moe_fp8_prefill.py --block-n
# (bench/results/h200/ab-moe-fp8-block-n.json).
PSUM_BLOCK_N: int | None = 128


@dataclass(frozen=True)
class DeepGemmWeights(ExpertTensors):
    """w13 float8_e4m3fn [E, 2I, H], w13_scale fp32 [E, 2I/128, H/128]; w2 float8_e4m3fn [E, H, I],
    w2_scale fp32 [E, H/128, I/128]; alignment: DeepGEMM's M alignment of the contiguous layout when prepared."""

    alignment: int


def shape_reasons(hidden: int, intermediate: int) -> list[str]:
    from dsv4hal.kernels.moe_support import multiple_of_reasons

    return multiple_of_reasons("DeepGEMM FP8 MoE", hidden, intermediate, 128, "1x128 activation groups")


def supports(case: Mapping[str, object], info: PlatformInfo) -> list[str]:
    from dsv4hal.kernels.moe_support import expert_case_reasons

    return expert_case_reasons(case, info, kernel="DeepGEMM", fmt="fp8_block", shape_reasons=shape_reasons,
                               fmt_reason="DeepGEMM's SM90 grouped GEMM takes FP8 weights only (FP4 operands are "
                                          "SM100-only)")


def _deep_gemm() -> Any:
    import deep_gemm

    return deep_gemm


def prepare_weights(weights: ExpertWeights) -> DeepGemmWeights:
    import torch

    from dsv4hal.kernels.moe_support import check_prepare

    check_prepare(weights, NAME, "fp8_block", shape_reasons)
    if weights.fp8 != "e4m3fn":
        raise ValueError(f"{NAME} takes e4m3fn FP8 weights; got {weights.fp8!r} (convert them to e4m3fn)")

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
    from dsv4hal.kernels.grouped_fp8_moe import grouped_fp8_moe

    return grouped_fp8_moe(_deep_gemm().m_grouped_fp8_gemm_nt_contiguous, x, topk_ids, topk_weights, weights,
                           swiglu_limit)


def moe_experts_psum(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, weights: DeepGemmWeights,
                     swiglu_limit: float = 10.0) -> torch.Tensor:
    """moe_experts with DeepGEMM's psum layout: the GEMMs visit each expert's used blocks only."""
    from dsv4hal.kernels.grouped_fp8_moe import grouped_fp8_moe

    return grouped_fp8_moe(_psum_gemm(PSUM_BLOCK_N), x, topk_ids, topk_weights, weights, swiglu_limit, psum=True)


def _psum_gemm(block_n: int | None) -> Callable[..., None]:
    """DeepGEMM's grouped GEMM with its config's BLOCK_N restricted to multiples of block_n when given (SM90's
    candidates end at 192, so 128 leaves 128 alone)."""
    dg = _deep_gemm()
    gemm = dg.m_grouped_fp8_gemm_nt_contiguous
    if block_n is None:
        return gemm

    def with_block_n(*args: Any, **kwargs: Any) -> None:
        dg.set_block_size_multiple_of((1, block_n))
        try:
            gemm(*args, **kwargs)
        finally:
            dg.set_block_size_multiple_of((1, 1))  # DeepGEMM's default

    return with_block_n
