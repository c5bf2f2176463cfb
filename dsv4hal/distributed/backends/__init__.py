"""Expert-parallel backends, described as KernelImpl entries of the op `expert_parallel` and chosen by
dsv4hal.selection.select_kernel like every kernel (priorities, requirements, supports() reasons, overrides), so
`explain` prints why each one was taken or refused.

The built-in entries live here and in the platform plugins' modules named in PLUGIN_ENTRIES (metadata only:
nothing imports a vendor library until a backend is built). Priorities: DeepEP 400 (NVLink/RDMA kernels, where
installed), loop-back 300 (one rank: nothing to move), torch all_to_all 200, torch all_gather 100 (the
fallback)."""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Mapping
from functools import cache
from typing import Any

from dsv4hal.hardware import PlatformInfo, library_versions
from dsv4hal.override import Overrides
from dsv4hal.registry import KernelImpl
from dsv4hal.selection import Decision, select_kernel

EP_OP = "expert_parallel"
# "module:attribute" of a platform plugin's tuple of KernelImpl entries for EP_OP
PLUGIN_ENTRIES = ("dsv4hal_cuda_sm90.deepep:EP_BACKENDS",)
LOOPBACK_PRIORITY = 300
ALL_TO_ALL_PRIORITY = 200
ALL_GATHER_PRIORITY = 100


def _one_rank(case: Mapping[str, object], info: PlatformInfo) -> list[str]:
    return [] if case["world_size"] == 1 else [f"world size {case['world_size']}: the loop-back serves one rank"]


def _several_ranks(case: Mapping[str, object], info: PlatformInfo) -> list[str]:
    if case["world_size"] == 1:
        return ["world size 1: the loop-back moves nothing (no collectives)"]
    if case["group_backend"] not in ("nccl", "gloo"):
        return [f"process group backend {case['group_backend']!r}: needs nccl (GPUs) or gloo (CPU)"]
    return []


BUILTIN: tuple[KernelImpl, ...] = (
    KernelImpl(EP_OP, "loopback", "dsv4hal.distributed.backends.loopback:make", ("*",), LOOPBACK_PRIORITY,
               tier="reference", supports=_one_rank, plugin="dsv4hal",
               description="world size 1: the same dispatch/combine code path with no communication"),
    KernelImpl(EP_OP, "torch_all_to_all", "dsv4hal.distributed.backends.torch_collectives:make_all_to_all", ("*",),
               ALL_TO_ALL_PRIORITY, tier="portable", supports=_several_ranks, plugin="dsv4hal",
               description="torch.distributed all_to_all_single (NCCL on GPUs, gloo on the CPU)"),
    KernelImpl(EP_OP, "torch_all_gather", "dsv4hal.distributed.backends.torch_collectives:make_all_gather", ("*",),
               ALL_GATHER_PRIORITY, tier="portable", supports=_several_ranks, plugin="dsv4hal",
               description="torch.distributed all_gather + reduce_scatter (all_reduce on gloo): the fallback"),
)


class BackendRegistry:
    """The EP entries; select_kernel reads them through kernels_for(op) as it reads the main registry."""

    def __init__(self, entries: tuple[KernelImpl, ...]) -> None:
        self.kernels = {EP_OP: {k.name: k for k in entries}}

    def kernels_for(self, op: str) -> list[KernelImpl]:
        return list(self.kernels.get(op, {}).values())


def _plugin_entries() -> tuple[KernelImpl, ...]:
    out: list[KernelImpl] = []
    for ref in PLUGIN_ENTRIES:
        module, _, attr = ref.partition(":")
        try:
            out.extend(getattr(importlib.import_module(module), attr))
        except ImportError:  # the platform plugin is not installed: its backends are not candidates
            continue
    return tuple(out)


@cache
def backend_registry() -> BackendRegistry:
    return BackendRegistry(BUILTIN + _plugin_entries())


def with_ep_libraries(info: PlatformInfo, registry: BackendRegistry) -> PlatformInfo:
    """Detected machines get the EP backends' libraries looked up too (find_spec, no import); simulated ones are
    taken as given."""
    if info.detected_by == "simulated":
        return info
    needed = frozenset({r for k in registry.kernels_for(EP_OP) for r in k.requires} - set(info.libraries))
    return dataclasses.replace(info, libraries={**info.libraries, **_installed(needed)})


@cache
def _installed(names: frozenset[str]) -> dict[str, str]:
    return library_versions(names)


def choose_backend(case: Mapping[str, object], info: PlatformInfo, platform: str, *, backend: str | None = None,
                   overrides: Overrides | None = None, registry: BackendRegistry | None = None) -> Decision:
    """The backend for this EP case, with every candidate's reasons (Decision.explain). `backend` forces one
    (as an override: refused with UnsupportedCaseError if it cannot run the case)."""
    registry = registry or backend_registry()
    ov = overrides or Overrides()
    if backend is not None:
        ov = dataclasses.replace(ov, kernels={**ov.kernels, EP_OP: backend},
                                 sources={**ov.sources, f"kernels.{EP_OP}": "api"})
    return select_kernel(registry, EP_OP, case, with_ep_libraries(info, registry), platform, ov)  # type: ignore[arg-type]


def build(decision: Decision, registry: BackendRegistry | None = None) -> Any:
    """Import the chosen backend's target and build it."""
    from dsv4hal.plugins import import_target

    return import_target(decision.chosen.target)()
