"""fp8_grouped_linear on Hopper through DeepGEMM's `fp8_einsum("bhr,hdr->bhd", (a, sfa), (b, sfb), d)`, behind
dsv4hal's contract. DeepGEMM as vLLM 0.24 bundles it (deepseek-ai/DeepGEMM 891d57b, 2.5.0; docs/vendor-apis.md
2.2b): fp8_einsum(expr, a, b, d, c=None, recipe=(1, 128, 128)) computes D[b, h, d] = sum_r A[b, h, r] * B[h, d, r],
here b = T, h = G, r = K, d = N. On SM90 it permutes A, SFA and D to [G, T, ...] and runs the batched 1D2D kernel
(one launch for every group): A and B e4m3fn and K-major, D bf16 with unit stride along N, no C; SFA fp32 [T, G,
K/128] per token and 128-group, SFB fp32 [G, ceil(N/128), K/128] contiguous. SM90 takes only this expression
("bhd,hdr->bhr" and "bhd,bhr->hdr" are SM100-only) and only from DeepGEMM 2.3.0 (2.2.0's fp8_einsum runs on SM100
alone).

Mapping: x [T, G, K] is quantized as T*G rows of K (a view when x's token stride is G*K, as for a view of the
attention output; another layout is copied first) by the MoE's 1x128 quantizer
(dsv4hal.kernels.triton.moe_quant.quantize_grouped_tokens, one Triton launch, IEEE divisions: the contract's codes
and scales), so a decode call has T*G rows to spread over programs. It stores the scale of block b of row (t, g) at
(g * K/128 + b) * align(T, 4) + t: the [G, T, K/128] MN-major TMA-aligned layout fp8_einsum permutes SFA to
(csrc/jit_kernels/impls/smxx_layout.hpp, get_mn_major_tma_aligned_tensor returns it as it is: no copy a call). The
weight passes as stored (K-major [G, N, K] e4m3fn), its scales as the contiguous fp32 [G, N/128, K/128] SM90 reads
without transform. D is a fresh [T, G, N] bf16 tensor. Nothing syncs and every size follows from the shape: CUDA-
graph safe. T = 0 launches nothing.

Limits, each a reason in `supports`: those of deepgemm_linear (e4m3fn; N a multiple of 128) and DeepGEMM >= 2.3.0.
Not on SM100 (fp32 scales become UE8M0 there, as for fp8_linear). This module imports torch and deep_gemm only
inside functions: registering the plugin stays free."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from dsv4hal_cuda_sm90.deepgemm_linear import operand_reasons

from dsv4hal.kernels import vendor_versions

if TYPE_CHECKING:
    import torch

    from dsv4hal.hardware import PlatformInfo

NAME = "deepgemm_fp8_grouped_linear_sm90"
EXPR = "bhr,hdr->bhd"  # x [T, G, K] . weight [G, N, K] -> [T, G, N]; the one expression fp8_einsum runs on SM90
MINIMUM = vendor_versions.deep_gemm((2, 3, 0), f'whose fp8_einsum("{EXPR}") runs on SM90')


def supports(case: Mapping[str, object], info: PlatformInfo) -> list[str]:
    """Reasons DeepGEMM's SM90 fp8_einsum cannot serve this fp8_grouped_linear case."""
    return operand_reasons(case, NAME, "triton_fp8_grouped_linear")


def _entry() -> Any:
    import deep_gemm

    return deep_gemm.fp8_einsum


def _a_pair(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, G, K] -> fp8_einsum's A pair: (codes float8_e4m3fn [T, G, K], scales fp32 [T, G, K/128] in the
    TMA-aligned layout) from one quantizer launch over the T*G rows (module docstring)."""
    import torch

    from dsv4hal.kernels.triton.moe_quant import quantize_grouped_tokens

    codes, sx = quantize_grouped_tokens(x)
    return codes.view(torch.float8_e4m3fn), sx


def fp8_grouped_linear(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor) -> torch.Tensor:
    """bf16 [T, G, N] per dsv4hal.ops.linear."""
    import torch

    t, g, n = x.shape[0], x.shape[1], weight.shape[1]
    out = torch.empty(t, g, n, dtype=torch.bfloat16, device=x.device)
    if t:
        _entry()(EXPR, _a_pair(x), (weight, weight_scale.contiguous()), out)
    return out
