"""fp8_linear on Hopper through DeepGEMM's `fp8_gemm_nt((a, sfa), (b, sfb), d)`, behind dsv4hal's contract.
DeepGEMM as vLLM 0.24 bundles it (deepseek-ai/DeepGEMM 891d57b, 2.5.0; docs/vendor-apis.md 2.2-2.3): D[M, N] =
A[M, K] @ B[N, K]^T; on SM90 both operands K-major e4m3fn, D bf16 N-major, scales fp32 with the default recipe
(1, 128, 128): SFA [M, K/128] per token and 128-group (the 1D2D kernel), SFB [ceil(N/128), K/128] per 128x128 block.

Mapping: x is quantized by the MoE's 1x128 quantizer (dsv4hal.kernels.triton.moe_quant.quantize_tokens, one Triton
launch, IEEE divisions: the contract's codes and scales), whose scales come MN-major with the row pitch T rounded up
to 4, what csrc/apis/layout.hpp's get_mn_major_tma_aligned_tensor returns unchanged (no transform kernel a call);
the weight passes as it is stored (a K-major [N, K] e4m3fn view) and its scales as the contiguous fp32 [N/128, K/128]
SM90 reads without transform (sm90_sfb_check). D is a fresh [T, N] bf16 tensor. Nothing syncs and every size
follows from the shape: CUDA-graph safe. T = 0 launches nothing.

Limits, each a reason in `supports`: e4m3fn only (SM90 FP8 operands; gfx942's e4m3fnuz never reaches this
platform); N a multiple of 128, vLLM's rule for DeepGEMM's FP8 linear, so every weight block row is whole (the DSV4
projections all are); DeepGEMM >= 2.0.0, the first release with fp8_gemm_nt (1.x named it
gemm_fp8_fp8_bf16_nt). Not on SM100: there DeepGEMM converts fp32 scales to UE8M0 by dropping their mantissa
(csrc/apis/layout.hpp, get_mn_major_tma_aligned_packed_ue8m0_tensor), which changes the contract's amax / 448
scales; cuda_sm100 keeps the Triton kernel.

This module imports torch and deep_gemm only inside functions: registering the plugin stays free."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from dsv4hal.kernels import vendor_versions

if TYPE_CHECKING:
    import torch

    from dsv4hal.hardware import PlatformInfo

NAME = "deepgemm_fp8_linear_sm90"
LIBRARY = "deep_gemm"
MINIMUM = vendor_versions.deep_gemm((2, 0, 0), "with fp8_gemm_nt")
BLOCK = 128


def operand_reasons(case: Mapping[str, object], name: str, fallback: str) -> list[str]:
    """Reasons DeepGEMM's SM90 FP8 GEMMs (fp8_gemm_nt, fp8_einsum) cannot take this case's weight, `fallback`
    being the kernel that takes it instead."""
    reasons = []
    if case.get("fp8") != "e4m3fn":
        reasons.append(f"DeepGEMM's SM90 FP8 GEMM takes e4m3fn weights; this weight is {case.get('fp8')} "
                       f"({fallback} takes it)")
    if case.get("partial_block"):
        reasons.append(f"{name} takes N a multiple of {BLOCK} (whole 128x128 weight blocks, vLLM's rule for DeepGEMM's "
                       f"FP8 linear); pad the weight's rows with zeros, or {fallback} takes it")
    return reasons


def supports(case: Mapping[str, object], info: PlatformInfo) -> list[str]:
    """Reasons DeepGEMM's SM90 fp8_gemm_nt cannot serve this fp8_linear case."""
    return operand_reasons(case, NAME, "triton_fp8_linear")


def _entry() -> Any:
    import deep_gemm

    return deep_gemm.fp8_gemm_nt


def fp8_linear(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor) -> torch.Tensor:
    """bf16 [T, N] per dsv4hal.ops.linear."""
    import torch

    from dsv4hal.kernels.triton.moe_quant import quantize_tokens

    t, n = x.shape[0], weight.shape[0]
    out = torch.empty(t, n, dtype=torch.bfloat16, device=x.device)
    if t:
        codes, sx = quantize_tokens(x)
        _entry()((codes.view(torch.float8_e4m3fn), sx), (weight, weight_scale.contiguous()), out)
    return out
