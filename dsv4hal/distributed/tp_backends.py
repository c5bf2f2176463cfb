"""Tensor-parallel all-reduce backends: KernelImpl entries of the collective op `tp_all_reduce` in the main
registry, chosen by dsv4hal.selection like every kernel, so `dsv4hal explain tp_all_reduce` prints why each one was
taken or refused. Registered by the cpu plugin for every platform. Metadata only: no torch import here.

Priorities: loop-back 300 (one rank: nothing to reduce); torch all_reduce 200 (NCCL on GPUs, gloo on the CPU);
symmetric memory 150 (torch.ops.symm_mem one-shot/two-shot all-reduce over a buffer every rank maps): below NCCL
until measured on a GPU, forced with DSV4HAL_KERNELS=tp_all_reduce=torch_symm_mem. No backend fuses mHC post:
TensorParallel.all_reduce_mhc_post runs the all-reduce, then the platform's mhc_post."""

from __future__ import annotations

from collections.abc import Mapping

from dsv4hal.collectives import TP_ALL_REDUCE
from dsv4hal.distributed.backends import one_rank, several_ranks
from dsv4hal.hardware import PlatformInfo
from dsv4hal.registry import KernelImpl, Registry

TP_OP = TP_ALL_REDUCE
LOOPBACK_PRIORITY = 300
ALL_REDUCE_PRIORITY = 200
SYMM_MEM_PRIORITY = 150


def _symm_mem(case: Mapping[str, object], info: PlatformInfo) -> list[str]:
    reasons = several_ranks(case, info)
    if case["group_backend"] != "nccl" or case["device"] != "cuda":
        reasons.append(f"needs an NCCL group and CUDA tensors (got {case['group_backend']}, {case['device']})")
    if case["symm_mem"] != "available":
        reasons.append("torch.ops.symm_mem (torch.distributed._symmetric_memory) is not in this torch build")
    if not isinstance(case.get("max_tokens"), int) or int(case["max_tokens"]) <= 0:  # type: ignore[call-overload]
        reasons.append("needs max_tokens (the symmetric buffer's rows, allocated once on every rank)")
    return reasons


BUILTIN: tuple[KernelImpl, ...] = (
    KernelImpl(TP_OP, "loopback", "dsv4hal.distributed.tp_reduce:make_loopback", ("*",), LOOPBACK_PRIORITY,
               tier="reference", supports=one_rank, description="world size 1: the sum is the tensor itself"),
    KernelImpl(TP_OP, "torch_all_reduce", "dsv4hal.distributed.tp_reduce:make_all_reduce", ("*",),
               ALL_REDUCE_PRIORITY, tier="portable", supports=several_ranks,
               description="torch.distributed all_reduce in place (NCCL on GPUs, gloo on the CPU)"),
    KernelImpl(TP_OP, "torch_symm_mem", "dsv4hal.distributed.tp_reduce:make_symm_mem", ("*",), SYMM_MEM_PRIORITY,
               tier="portable", supports=_symm_mem,
               description="torch symmetric memory: one-shot all-reduce (two-shot for large tensors) over a "
                           "[max_tokens, hidden] buffer rendezvoused once"),
)


def register(registry: Registry) -> None:
    """The built-in backends, for every platform (the cpu plugin's registration calls this)."""
    for impl in BUILTIN:
        registry.add_kernel(impl)
