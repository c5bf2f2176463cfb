"""MXFP4 routed experts on Hopper through vLLM 0.24's Marlin MoE kernel (`torch.ops._moe_C.moe_wna16_marlin_gemm`,
W4A16: bf16 activations, MXFP4 weights with e8m0 group-32 scales), behind dsv4hal's moe_experts contract.

The kernel library is vLLM's `_moe_C_stable_libtorch.abi3.so` (stable ABI, no dependency on vLLM's `_C`), loaded
with torch.ops.load_library from the path in VLLM_MOE_LIB when first used; if the op is already registered in the
process (vLLM imported), that one is used. The weight repack is dsv4hal's own (marlin_layout), since vLLM's
gptq_marlin_repack lives in `_C`.

Sequence (docs/vendor-apis.md 3.5): align routes to experts in blocks; GEMM1 x @ w13^T per route without the routing
weights -> [M*k, 2I]; DSV4's clamped SwiGLU (one Triton kernel, moe_activation.swiglu); GEMM2 with top_k=1 over the
M*k routes, routing weights multiplied in -> [M*k, H]; one Triton kernel sums each token's k rows (route t*k + j is
row t*k + j), skipping routes with ids outside [0, E). Between and after the GEMMs: two launches (in a CUDA-graph
decode step each small kernel costs ~2 us).

Availability (registered with requires=(), since a shared library named by an environment variable is not an
importable module that hardware.detect could find): on a detected machine supports() reads VLLM_MOE_LIB at selection
time (set, and an existing file) or finds the op already registered; on a simulated machine it reads the library
key "vllm_moe" of PlatformInfo.libraries, so selection there stays a function of the PlatformInfo.

This module imports torch only inside functions, so registering the plugin stays free of torch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dsv4hal_cuda_sm90 import vllm_moe_lib as lib

from dsv4hal.prepared import ExpertTensors

if TYPE_CHECKING:
    import torch

    from dsv4hal.formats.experts import ExpertWeights
    from dsv4hal.hardware import PlatformInfo

ENV_LIB, LIBRARY_KEY, OP_NAMESPACE = lib.ENV_LIB, lib.LIBRARY_KEY, lib.NAMESPACE
OP_NAME = "moe_wna16_marlin_gemm"
NAME = "marlin_mxfp4_sm90"
LAYOUT = "marlin-mxfp4-w4a16"

# vllm.scalar_type: exponent 2 | mantissa 1 << 8 | signed << 16 | bias 0 << 17 | finite_only << 49 | NanRepr.NONE << 50
FLOAT4_E2M1F_ID = 2 | (1 << 8) | (1 << 16) | (0 << 17) | (1 << 49) | (0 << 50)
assert FLOAT4_E2M1F_ID == 562949953487106

# Tile constraints of one Marlin GEMM of size_n x size_k: K % 16 and N % 64 for the layouts, and a thread tile
# (thread_k, thread_n) dividing the problem: (128, 64) or (64, 128) (marlin_padded_nk; the kernel's configs).
MIN_THREAD_N, MIN_THREAD_K = 64, 64
BLOCK_SIZES = (8, 16, 32, 48, 64)
# (thread_k, thread_n, blocks_per_sm) of every GEMM: -1 lets the kernel choose (what vLLM passes). A module setting,
# not an argument, so that bench/sweep_moe_launch.py can time other launches through the same code path.
LAUNCH = (-1, -1, -1)
DEFAULT_SM_COUNT = 132  # H100/H200; used only where no CUDA device can be asked (fakes)


@dataclass(frozen=True)
class MarlinWeights(ExpertTensors):
    """MXFP4 expert weights in Marlin's layout.

    w13 int32 [E, H/16, 4I] (GEMM1: size_n = 2I, size_k = H), w13_scale float8_e8m0fnu [E, H/32, 2I];
    w2 int32 [E, I/16, 2H] (GEMM2: size_n = H, size_k = I), w2_scale float8_e8m0fnu [E, I/32, H]."""


def gemm_shape_reasons(what: str, size_n: int, size_k: int) -> list[str]:
    ok = (size_n % 64 == 0 and size_k % 128 == 0) or (size_n % 128 == 0 and size_k % 64 == 0)
    if ok:
        return []
    return [f"Marlin needs {what} (size_n={size_n}, size_k={size_k}) with size_n % 64 == 0 and size_k % 128 == 0, "
            "or size_n % 128 == 0 and size_k % 64 == 0"]


def shape_reasons(hidden: int, intermediate: int) -> list[str]:
    """Why Marlin cannot take H and I (empty: it can). GEMM1 is 2I x H, GEMM2 is H x I."""
    return (gemm_shape_reasons("GEMM1 w13 [2I, H]", 2 * intermediate, hidden)
            + gemm_shape_reasons("GEMM2 w2 [H, I]", hidden, intermediate))


def availability_reasons(info: PlatformInfo) -> list[str]:
    return lib.availability_reasons(info, OP_NAME)


def supports(case: Mapping[str, object], info: PlatformInfo) -> list[str]:
    from dsv4hal.kernels.moe_support import expert_case_reasons

    reasons = expert_case_reasons(case, info, kernel="Marlin", fmt="mxfp4", shape_reasons=shape_reasons,
                                  fmt_reason="Marlin MoE here runs MXFP4 weights only (W4A16)")
    return reasons + availability_reasons(info)


# ---------------------------------------------------------------- weights


def prepare_weights(weights: ExpertWeights) -> MarlinWeights:
    """ExpertWeights (mxfp4) -> MarlinWeights; runs on the weights' device."""
    from dsv4hal_cuda_sm90.marlin_layout import permute_scales_for_marlin, repack_mxfp4_for_marlin

    if weights.format != "mxfp4":
        raise ValueError(f"{NAME} takes MXFP4 expert weights only; got format {weights.format!r} "
                         "(fp8_block weights go to another moe_experts kernel)")
    h, i = weights.hidden, weights.intermediate
    reasons = shape_reasons(h, i)
    if reasons:
        raise ValueError(f"{NAME}: " + "; ".join(reasons))
    return MarlinWeights(
        w13=repack_mxfp4_for_marlin(weights.w13), w13_scale=permute_scales_for_marlin(weights.w13_scale),
        w2=repack_mxfp4_for_marlin(weights.w2), w2_scale=permute_scales_for_marlin(weights.w2_scale),
        num_experts=weights.num_experts, hidden=h, intermediate=i)


# ---------------------------------------------------------------- the kernel


def _gemm() -> Any:
    """torch.ops._moe_C.moe_wna16_marlin_gemm, loading the library from VLLM_MOE_LIB unless already registered."""
    return lib.moe_op(OP_NAME, NAME)


_WORKSPACES: dict[Any, torch.Tensor] = {}


def _sm_count(device: torch.device) -> int:
    import torch

    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return DEFAULT_SM_COUNT


def workspace(device: torch.device) -> torch.Tensor:
    """One zeroed int32 [SMs * 4] lock buffer per device, reused by every call (as vLLM's
    marlin_make_workspace_new(device, 4)); the kernel leaves its locks released."""
    import torch

    key = (device.type, device.index)
    ws = _WORKSPACES.get(key)
    if ws is None:
        ws = _WORKSPACES[key] = torch.zeros(_sm_count(device) * 4, dtype=torch.int32, device=device)
    return ws


def choose_block_size(num_tokens: int, top_k: int, num_experts: int) -> int:
    """vLLM's fused_marlin_moe choice: the first block size with M*k/E/bs < 0.9, else 64 (from shapes: no sync)."""
    for bs in BLOCK_SIZES:
        if num_tokens * top_k / num_experts / bs < 0.9:
            return bs
    return BLOCK_SIZES[-1]


def _marlin(gemm: Any, a: torch.Tensor, w: torch.Tensor, scale: torch.Tensor, ws: torch.Tensor,
            routing: tuple[torch.Tensor, torch.Tensor, torch.Tensor], topk_weights: torch.Tensor, block_size: int,
            top_k: int, mul_topk_weights: bool, size_m: int, size_n: int, size_k: int) -> torch.Tensor:
    sorted_ids, expert_ids, num_post_pad = routing
    return gemm(a, None, w, None, scale, None, None, None, None, None, ws, sorted_ids, expert_ids, num_post_pad,
                topk_weights, block_size, top_k, mul_topk_weights, FLOAT4_E2M1F_ID, size_m, size_n, size_k,
                True,  # is_full_k
                False,  # use_atomic_add
                True,  # use_fp32_reduce
                False,  # is_zp_float
                *LAUNCH)  # thread_k, thread_n, blocks_per_sm


def moe_experts(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, weights: MarlinWeights,
                swiglu_limit: float = 10.0) -> torch.Tensor:
    """x bf16 [T, H], topk_ids int32 [T, k], topk_weights fp32 [T, k] -> bf16 [T, H] (routed experts only)."""
    import torch

    from dsv4hal.kernels.aligned_routes import route_capacity
    from dsv4hal.kernels.moe_align import align_routes
    from dsv4hal.kernels.triton.moe_activation import swiglu
    from dsv4hal.kernels.triton.moe_combine import combine_routes

    m, k = topk_ids.shape
    h, i, e = weights.hidden, weights.intermediate, weights.num_experts
    if m == 0:
        return torch.zeros(0, h, dtype=torch.bfloat16, device=x.device)
    gemm = _gemm()
    ws = workspace(x.device)
    bs = choose_block_size(m, k, e)
    aligned = align_routes(topk_ids, e, bs)
    # vLLM allocates sorted_token_ids at exactly the capacity; the block-rounded tail beyond it is padding anyway
    routing = (aligned.sorted_routes[:route_capacity(m * k, e, bs)], aligned.block_expert, aligned.num_padded)
    x = x.contiguous()
    topk_weights = topk_weights.contiguous()
    h13 = _marlin(gemm, x, weights.w13, weights.w13_scale, ws, routing, topk_weights, bs, k, False, m, 2 * i, h)
    act = swiglu(h13, swiglu_limit)  # w13 = [w1 (gate); w3 (up)]: rows [gate | up]
    y = _marlin(gemm, act, weights.w2, weights.w2_scale, ws, routing, topk_weights, bs, 1, True, m * k, h, i)
    # route t*k + j is row t*k + j of y, weights already applied; the GEMM never writes dropped routes' rows, which
    # the combine recognises by their ids
    return combine_routes(y, None, None, topk_ids=topk_ids, num_experts=e)
