"""DeepEP (deepseek-ai/DeepEP, `deep_ep`) as an expert-parallel backend of dsv4hal.distributed: its normal
dispatch/combine (NVLink within a node, RDMA across nodes) for normal mode and the standard layout, and its
low-latency kernels for decode mode and the batched layout (worst-case buffers, no host sync, CUDA-graph capturable).

Calls DeepEP's Python API (deep_ep.Buffer): get_dispatch_layout + dispatch / combine, and low_latency_dispatch /
low_latency_combine with return_recv_hook=True, so wait() of the split-phase forms runs the receive hook. Normal mode
combine sums without weights, which is what moe_experts' weighted rows need; low-latency combine applies the weights.
The low-latency FP8 scales come back as DeepEP lays them out (column-major in the last two dims, for TMA).

Shared by the cuda_sm90 and cuda_sm100 plugins, which register `kernel(platform, arch)` (metadata only: this module
imports torch and deep_ep inside the backend's methods)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from dsv4hal.collectives import EXPERT_PARALLEL
from dsv4hal.hardware import PlatformInfo
from dsv4hal.registry import KernelImpl

if TYPE_CHECKING:
    import torch

LIBRARY = "deep_ep"
# above the loop-back (300) and the torch collectives (200, 100): DeepEP's kernels move tokens GPU-to-GPU without
# the all_to_all's padding or the host-side split exchange
DEEPEP_PRIORITY = 400


def supports(case: Mapping[str, object], info: PlatformInfo) -> list[str]:
    out = []
    if case["world_size"] == 1:
        out.append("world size 1: the loop-back moves nothing")
    if case["group_backend"] != "nccl" or case["device"] != "cuda":
        out.append(f"needs an NCCL group and CUDA tensors (got {case['group_backend']}, {case['device']})")
    want = "batched" if case["mode"] == "decode" else "standard"
    if case["layout"] != want:
        out.append(f"{case['mode']} mode returns the {want} layout (low-latency kernels: batched; normal: standard)")
    if int(case["hidden"]) % 128:  # type: ignore[call-overload]
        out.append(f"hidden {case['hidden']} is not a multiple of 128 (FP8 block scales)")
    return out


def kernel(platform: str, arch: str) -> KernelImpl:
    """DeepEP as the expert_parallel backend `deepep_<arch>` of `platform` (the same kernels on SM90 and SM100;
    kernel names are unique per op, as flashmla_sm90_* and flashmla_sm100_* are)."""
    return KernelImpl(EXPERT_PARALLEL, f"deepep_{arch}", "dsv4hal.kernels.deepep:make", (platform,), DEEPEP_PRIORITY,
                      tier="vendor", requires=(LIBRARY,), supports=supports,
                      description="DeepEP normal (NVLink/RDMA) and low-latency dispatch/combine")


class DeepEPBackend:
    name = "deepep"

    def __init__(self) -> None:
        self._buffers: dict[tuple[int, bool], Any] = {}

    def _buffer(self, ctx: Any, low_latency: bool) -> Any:
        import deep_ep

        key = (id(ctx.group), low_latency)
        if key not in self._buffers:
            b = deep_ep.Buffer
            if low_latency:
                rdma = b.get_low_latency_rdma_size_hint(ctx.max_tokens, ctx.hidden, ctx.world_size, ctx.num_physical)
                self._buffers[key] = b(ctx.group, 0, rdma, low_latency_mode=True,
                                       num_qps_per_rank=max(1, ctx.experts_per_rank))
            else:
                size = ctx.hidden * 2
                nvl = max(cfg.get_nvl_buffer_size_hint(size, ctx.world_size) for cfg in (
                    b.get_dispatch_config(ctx.world_size), b.get_combine_config(ctx.world_size)))
                self._buffers[key] = b(ctx.group, nvl, 0)
        return self._buffers[key]

    def dispatch(self, ctx: Any, x: torch.Tensor, phys_ids: torch.Tensor, weights: torch.Tensor, layout: str,
                 decode: bool) -> Any:
        import torch

        from dsv4hal.distributed.backends.base import Pending
        from dsv4hal.distributed.contract import Dispatched, Handle

        topk_idx = phys_ids.to(torch.int64)
        none = torch.zeros(0, dtype=torch.bool, device=x.device)
        if decode:
            buf = self._buffer(ctx, True)
            recv, counts, state, _, hook = buf.low_latency_dispatch(
                x, topk_idx, ctx.max_tokens, ctx.num_physical, use_fp8=ctx.codec.fp8 is not None,
                async_finish=False, return_recv_hook=True)
            xs, scale = recv if isinstance(recv, tuple) else (recv, None)
            handle = Handle("batched", True, x.shape[0], none, backend_state=(state, topk_idx, weights),
                            out_rows=ctx.max_tokens * ctx.world_size)
            return Pending([], lambda: (hook(), Dispatched(xs, scale, None, None, counts, handle, "batched"))[1])
        buf = self._buffer(ctx, False)
        per_rank, per_rdma, per_expert, in_rank, _ = buf.get_dispatch_layout(topk_idx, ctx.num_physical)
        payload: Any = x
        if ctx.codec.fp8 is not None:
            from dsv4hal.formats.fp8_block import act_quant_1x128

            payload = act_quant_1x128(x, ctx.codec.fp8, pow2_scales=ctx.codec.pow2_scales)
        recv, recv_idx, recv_w, counts, state, _ = buf.dispatch(
            payload, topk_idx=topk_idx, topk_weights=weights, num_tokens_per_rank=per_rank,
            num_tokens_per_rdma_rank=per_rdma, is_token_in_rank=in_rank, num_tokens_per_expert=per_expert)
        xs, scale = recv if isinstance(recv, tuple) else (recv, None)
        handle = Handle("standard", False, x.shape[0], none, backend_state=state, out_rows=xs.shape[0])
        count_t = torch.tensor(counts, dtype=torch.int32, device=x.device)
        return Pending([], lambda: Dispatched(xs, scale, recv_idx.to(torch.int32), recv_w, count_t, handle,
                                              "standard"))

    def combine(self, ctx: Any, expert_out: torch.Tensor, handle: Any) -> Any:
        from dsv4hal.distributed.backends.base import Pending

        if handle.decode:
            state, topk_idx, weights = handle.backend_state
            out, _, hook = self._buffer(ctx, True).low_latency_combine(expert_out, topk_idx, weights, state,
                                                                       return_recv_hook=True)
            return Pending([], lambda: (hook(), out)[1])
        out, _, _ = self._buffer(ctx, False).combine(expert_out, handle.backend_state)
        return Pending([], lambda: out)


def make() -> DeepEPBackend:
    return DeepEPBackend()
