"""MXFP4 routed experts on Hopper through OpenAI's `triton_kernels` as vLLM 0.24 bundles it (`matmul_ogs`, the
legacy routing API: `routing_from_bitmatrix`, `RoutingData`), behind dsv4hal's moe_experts contract.

Sequence (facts from the bundle's triton_kernels: matmul_ogs.py, routing.py, tensor.py, tensor_details/):
1. oai_kernels.padded_routes: a bitmatrix and the top-k padded to a power of two (one launch);
2. routing_from_bitmatrix: the expert-sorted routes (gather and scatter indices, per-expert ranges);
3. matmul_ogs(x, w13) gathering each route's token row, DSV4's clamped SwiGLU fused in its epilogue;
4. matmul_ogs(h, w2) with the routing weights as gammas (applied after the GEMM, in fp32), its rows left in expert
   order; dsv4hal's combine (dsv4hal.kernels.triton.moe_combine) sums each token's rows in fp32 through the
   routing's scatter.src_indx (dropped routes, -1, skipped; a token with every route dropped gets zeros), where the
   library's scatter would launch its grouped reduce (one warp a token; 7.2 us at T = 64 on the H200).

The activation: the library's own swiglu is GPT-OSS's (`s * (clamp(up) + 1)`, alpha 1.702), not DSV4's
`silu(min(gate, L)) * clamp(up, -L, L)`, so a fused activation of our own is passed. matmul_ogs hands it tiles
whose columns alternate gate, up: the prepared w13 interleaves its gate and up rows.

Weights (layout "triton-kernels-hopper-mxfp4"): dsv4hal's MXFP4 bytes (low nibble = even element) and UE8M0 scales
are the library's own encoding; each [E, N, K/2] byte tensor is viewed as the library's logical [E, K, N] (K
contiguous) and converted to HopperMXValueLayout / HopperMXScaleLayout (mx_axis 1, 8 warps), a few experts at a time
so that the conversion's temporaries stay small. The kernel then needs bf16 activations, and H and I multiples of
128 (block_k 128; block_n 256 with 8 warps).

On the H200 (bench-moe.json; its 12 cases in conformance-cuda_sm90-moe.json pass): 1.09-1.96x Marlin from T = 16
up, 1.4-3x slower at T <= 8; ranked first for weights prepared for more than 64 tokens a call
(`prepare_weights(tokens > 64)`), below Marlin and the portable triton_fused_moe for fewer (cuda_sm90's kernels.py
says why).
This module imports torch and triton_kernels only inside functions: registering the plugin stays free."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dsv4hal.prepared import ExpertTensors

if TYPE_CHECKING:
    import torch

    from dsv4hal.formats.experts import ExpertWeights
    from dsv4hal.hardware import PlatformInfo

NAME = "triton_kernels_mxfp4_sm90"
LAYOUT = "triton-kernels-hopper-mxfp4"
LIBRARY = "triton_kernels"
MULTIPLE = 128  # H and I: block_k 128 and block_n 256 (2I, H > 128) with 8 warps on sm90
SCALE_WARPS = 8  # HopperMXScaleLayout's swizzle is for the warps the kernel runs with (opt_flags: 8 for MXFP4)
MAX_EXPERTS = 65535  # routing keys are 16 bits, 0xffff meaning "no expert"
PREPARE_CHUNK = 16  # experts converted at a time


@dataclass(frozen=True)
class OaiTritonWeights(ExpertTensors):
    """MXFP4 expert weights in triton_kernels' Hopper layout.

    w13 / w2: the layouts' swizzled storage tensors (uint8) of the logical [E, H, 2I] (gate and up columns
    interleaved) and [E, I, H]; the scales likewise. `w13_tensor`, `w2_tensor` and the precision configs are the
    triton_kernels objects wrapping them, built once at prepare time."""

    w13_tensor: Any = None
    w2_tensor: Any = None
    w13_precision: Any = None
    w2_precision: Any = None


def shape_reasons(hidden: int, intermediate: int) -> list[str]:
    from dsv4hal.kernels.moe_support import multiple_of_reasons

    return multiple_of_reasons(NAME, hidden, intermediate, MULTIPLE,
                               "triton_kernels' Hopper MXFP4 tiles: block_k 128, block_n 256 with 8 warps")


def supports(case: Mapping[str, object], info: PlatformInfo) -> list[str]:
    from dsv4hal.kernels.moe_support import expert_case_reasons

    reasons = expert_case_reasons(case, info, kernel=NAME, fmt="mxfp4", shape_reasons=shape_reasons,
                                  fmt_reason="triton_kernels' Hopper path here runs MXFP4 weights only (W4A16)")
    e = case.get("E")
    if isinstance(e, int) and e >= MAX_EXPERTS:
        reasons.append(f"triton_kernels routes at most {MAX_EXPERTS - 1} experts (16-bit keys); got E={e}")
    return reasons


# ---------------------------------------------------------------- weights


def interleave_gate_up(t: torch.Tensor) -> torch.Tensor:
    """[E, 2I, ...] with rows [gate; up] -> rows gate_0, up_0, gate_1, up_1, ... (the activation's column pairs)."""
    import torch

    i = t.shape[1] // 2
    return torch.stack((t[:, :i], t[:, i:]), dim=2).reshape(t.shape)


def _stack(parts: list[torch.Tensor]) -> torch.Tensor | None:
    """Chunks of a layout's storage (expert dim first) joined into one tensor with the chunks' own memory order, so
    the result is what converting all experts at once gives. None when the expert dim is not the outermost in
    memory (then chunks cannot be joined that way)."""
    import torch

    first = parts[0]
    if len(parts) == 1:
        return first
    order = sorted(range(first.dim()), key=lambda d: -first.stride(d))  # outermost dim first
    if order[0] != 0:
        return None
    shape = [sum(p.shape[0] for p in parts), *first.shape[1:]]
    buf = torch.empty([shape[d] for d in order], dtype=first.dtype, device=first.device)
    out = buf.permute([order.index(d) for d in range(first.dim())])
    lo = 0
    for p in parts:
        out[lo:lo + p.shape[0]].copy_(p)
        lo += p.shape[0]
    return out


def _to_library(q: torch.Tensor, s: torch.Tensor, chunk: int = PREPARE_CHUNK) -> tuple[Any, Any]:
    """MXFP4 bytes [E, N, K/2] and UE8M0 scales [E, N, K/32] -> the library's Hopper-layout weight and scale
    Tensors of logical shape [E, K, N] and [E, K/32, N], converted `chunk` experts at a time."""
    import torch
    from triton_kernels.tensor import FP4, Storage, Tensor, convert_layout, wrap_torch_tensor
    from triton_kernels.tensor_details.layout import HopperMXScaleLayout, HopperMXValueLayout

    e, n, half_k = q.shape
    values, scales = [], []
    for lo in range(0, e, chunk):
        v = convert_layout(wrap_torch_tensor(q[lo:lo + chunk].transpose(-2, -1), dtype=FP4), HopperMXValueLayout,
                           mx_axis=1)
        sc = convert_layout(wrap_torch_tensor(s[lo:lo + chunk].transpose(-2, -1)), HopperMXScaleLayout, mx_axis=1,
                            num_warps=SCALE_WARPS)
        values.append(v.storage.data)
        scales.append(sc.storage.data)
    value_data, scale_data = _stack(values), _stack(scales)
    if value_data is None or scale_data is None:  # a layout whose expert dim is not outermost: all at once
        return _to_library(q, s, chunk=e)
    k = 2 * half_k
    value_layout = HopperMXValueLayout([e, half_k, n], mx_axis=1)
    scale_layout = HopperMXScaleLayout([e, k // 32, n], mx_axis=1, num_warps=SCALE_WARPS)
    weight = Tensor(Storage(value_data, value_layout), dtype=FP4, shape=[e, k, n])
    scale = Tensor(Storage(scale_data, scale_layout), dtype=torch.uint8, shape=[e, k // 32, n])
    return weight, scale


def prepare_weights(weights: ExpertWeights) -> OaiTritonWeights:
    """ExpertWeights (mxfp4) -> OaiTritonWeights; runs on the weights' device."""
    from dsv4hal.kernels.moe_support import check_prepare

    check_prepare(weights, NAME, "mxfp4", shape_reasons)  # before the library: a refusal needs none
    from triton_kernels.matmul_ogs import PrecisionConfig

    w13, w13_scale = _to_library(interleave_gate_up(weights.w13), interleave_gate_up(weights.w13_scale))
    w2, w2_scale = _to_library(weights.w2, weights.w2_scale)
    return OaiTritonWeights(
        w13=w13.storage.data, w13_scale=w13_scale.storage.data, w2=w2.storage.data, w2_scale=w2_scale.storage.data,
        num_experts=weights.num_experts, hidden=weights.hidden, intermediate=weights.intermediate,
        w13_tensor=w13, w2_tensor=w2, w13_precision=PrecisionConfig(weight_scale=w13_scale),
        w2_precision=PrecisionConfig(weight_scale=w2_scale))


# ---------------------------------------------------------------- the kernel


@functools.cache
def _activation(limit: float) -> Any:
    """DSV4's clamped SwiGLU as a matmul_ogs fused activation (halves N: reduction_n 2). The library caches its
    specialised kernels by the activation's name, so the name is fixed and the limit is an argument."""
    from dsv4hal_cuda_sm90.oai_kernels import dsv4_clamped_swiglu
    from triton_kernels.matmul_ogs import FnSpecs, FusedActivation

    return FusedActivation(FnSpecs("dsv4_clamped_swiglu", dsv4_clamped_swiglu, ("limit",)), (float(limit),), 2)


def moe_experts(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, weights: OaiTritonWeights,
                swiglu_limit: float = 10.0) -> torch.Tensor:
    """x bf16 [T, H], topk_ids int32 [T, k], topk_weights fp32 [T, k] -> bf16 [T, H] (routed experts only)."""
    import torch
    from dsv4hal_cuda_sm90.oai_kernels import padded_routes
    from triton_kernels.matmul_ogs import matmul_ogs
    from triton_kernels.routing import routing_from_bitmatrix
    from triton_kernels.tensor import Bitmatrix

    from dsv4hal.kernels.triton.moe_combine import combine_routes

    t = topk_ids.shape[0]
    e = weights.num_experts
    if t == 0:
        return torch.zeros(0, weights.hidden, dtype=torch.bfloat16, device=x.device)
    bits, sums, ids, w = padded_routes(topk_ids, topk_weights, e)
    bitmatrix = Bitmatrix(bits, shape=[t, bits.shape[1] * 32], shape_max=[t, None], scratchpad=sums)
    routing, gather, scatter = routing_from_bitmatrix(bitmatrix, w, ids, e, ids.shape[1])
    h = matmul_ogs(x.contiguous(), weights.w13_tensor, None, routing, gather_indx=gather,
                   precision_config=weights.w13_precision, fused_activation=_activation(float(swiglu_limit)))
    # the second GEMM's rows stay in expert order, each scaled by its route's weight; dsv4hal's combine sums every
    # token's rows (scatter.src_indx: a route's row, -1 dropped) where the library would launch its grouped reduce
    y = matmul_ogs(h, weights.w2_tensor, None, routing, precision_config=weights.w2_precision,
                   gammas=routing.gate_scal)
    return combine_routes(y, scatter.src_indx.view(t, ids.shape[1]), None, y.shape[0])
