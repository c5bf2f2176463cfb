"""The whole expert-parallel MoE layer in one call, the collective op `ep_fused_moe`:

    fw = ep.prepare_fused_weights(local_weights, intermediate=...)      # once, after loading
    y = ep.fused_moe(x, topk_ids, topk_weights, fw)                     # every step: bf16 [T, H] on this rank

y[t] = sum_j topk_weights[t, j] * expert_{topk_ids[t, j]}(x[t]) over the token's routes (negative ids: dropped),
the experts being SwiGLU MLPs (gate clamped to swiglu_limit, up to +-swiglu_limit) held by the ranks of the group.

Backends are KernelImpl entries of the main registry chosen like every kernel (priorities, requirements, supports()
reasons, DSV4HAL_KERNELS=ep_fused_moe=<name>, explain): the choice binds when the weights are prepared, since a
fused kernel fixes its weight layout. Built in: `split` (priority 100, every platform): dispatch (standard layout,
the expert_parallel backend chosen for the case), moe_experts on the received rows, combine. Vendor entries
(dsv4hal.kernels.deepgemm_mega_moe: DeepGEMM Mega MoE on SM100 and SM90) run dispatch, both GEMMs, SwiGLU and
combine as one kernel over a symmetric-memory buffer. Metadata only at import: no torch here."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dsv4hal.collectives import EP_FUSED_MOE
from dsv4hal.distributed.fused_weights import FusedWeights as FusedWeights
from dsv4hal.registry import KernelImpl, Registry

if TYPE_CHECKING:
    import torch

    from dsv4hal.formats.experts import ExpertWeights

FUSED_OP = EP_FUSED_MOE
SPLIT_PRIORITY = 100


def fused_case(ep: Any, weights: ExpertWeights, device: str) -> dict[str, object]:
    """The selection case of ep_fused_moe for these weights on this ExpertParallel."""
    from dsv4hal.distributed.tp import symm_mem_available

    return {"world_size": ep.world_size, "group_backend": ep.group_backend, "weights": weights.format,
            "fp8": weights.fp8, "hidden": ep.hidden, "intermediate": weights.intermediate, "top_k": ep.top_k,
            "experts_per_rank": ep.experts_per_rank, "max_tokens": ep.max_tokens or 0,
            "symm_mem": "available" if symm_mem_available() else "missing", "device": device}


class SplitFusedMoE:
    """The portable path: ExpertParallel.dispatch (standard layout), the platform's moe_experts on the received
    rows, ExpertParallel.combine. Prepared weights are moe_experts' own."""

    name = "split"

    def prepare(self, ep: Any, weights: ExpertWeights) -> Any:
        return ep._platform().ops.moe_experts.prepare_weights(weights)

    def run(self, ep: Any, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, state: Any,
            decode: bool, swiglu_limit: float) -> torch.Tensor:
        from dsv4hal.distributed.experts import run_local_experts

        d = ep._start_dispatch(x, topk_ids, topk_weights, "standard", decode).wait()  # fused_moe agreed on them
        return ep.combine(run_local_experts(ep._platform(), d, state, swiglu_limit), d.handle)


def make_split() -> SplitFusedMoE:
    return SplitFusedMoE()


BUILTIN: tuple[KernelImpl, ...] = (
    KernelImpl(FUSED_OP, "split", "dsv4hal.distributed.fused:make_split", ("*",), SPLIT_PRIORITY, tier="portable",
               description="expert_parallel dispatch + moe_experts + combine (three steps, any platform)"),
)


def register(registry: Registry) -> None:
    """The built-in split path, for every platform (the cpu plugin's registration calls this)."""
    for impl in BUILTIN:
        registry.add_kernel(impl)
