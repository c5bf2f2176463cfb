"""Expert-parallel backends: KernelImpl entries of the collective op `expert_parallel` in the main registry, chosen
by dsv4hal.selection.select_kernel like every kernel (priorities, requirements, supports() reasons, overrides,
locks), so `dsv4hal explain expert_parallel` prints why each one was taken or refused.

The built-in entries are here (registered by the cpu plugin, for every platform); a platform plugin adds its own
with registry.add_kernel (cuda_sm90 and cuda_sm100: DeepEP, priority 400). Metadata only: nothing imports torch or
a vendor library until a backend is built. Priorities: loop-back 300 (one rank: nothing to move), torch all_to_all
200, torch all_gather 100 (the fallback)."""

from __future__ import annotations

from collections.abc import Mapping

from dsv4hal.collectives import EXPERT_PARALLEL
from dsv4hal.hardware import PlatformInfo
from dsv4hal.registry import KernelImpl, Registry

EP_OP = EXPERT_PARALLEL
LOOPBACK_PRIORITY = 300
ALL_TO_ALL_PRIORITY = 200
ALL_GATHER_PRIORITY = 100


def one_rank(case: Mapping[str, object], info: PlatformInfo) -> list[str]:
    return [] if case["world_size"] == 1 else [f"world size {case['world_size']}: the loop-back serves one rank"]


def several_ranks(case: Mapping[str, object], info: PlatformInfo) -> list[str]:
    if case["world_size"] == 1:
        return ["world size 1: the loop-back moves nothing (no collectives)"]
    if case["group_backend"] not in ("nccl", "gloo"):
        return [f"process group backend {case['group_backend']!r}: needs nccl (GPUs) or gloo (CPU)"]
    return []


BUILTIN: tuple[KernelImpl, ...] = (
    KernelImpl(EP_OP, "loopback", "dsv4hal.distributed.backends.loopback:make", ("*",), LOOPBACK_PRIORITY,
               tier="reference", supports=one_rank,
               description="world size 1: the same dispatch/combine code path with no communication"),
    KernelImpl(EP_OP, "torch_all_to_all", "dsv4hal.distributed.backends.torch_collectives:make_all_to_all", ("*",),
               ALL_TO_ALL_PRIORITY, tier="portable", supports=several_ranks,
               description="torch.distributed all_to_all_single (NCCL on GPUs, gloo on the CPU)"),
    KernelImpl(EP_OP, "torch_all_gather", "dsv4hal.distributed.backends.torch_collectives:make_all_gather", ("*",),
               ALL_GATHER_PRIORITY, tier="portable", supports=several_ranks,
               description="torch.distributed all_gather + reduce_scatter (all_reduce on gloo): the fallback"),
)


def register(registry: Registry) -> None:
    """The built-in backends, for every platform (the cpu plugin's registration calls this)."""
    for impl in BUILTIN:
        registry.add_kernel(impl)
