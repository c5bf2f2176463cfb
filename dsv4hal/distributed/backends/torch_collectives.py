"""torch.distributed backends: all_to_all_single, and the all_gather / reduce-scatter fallback (NCCL on GPUs,
gloo on the CPU). The algorithms are dsv4hal.distributed.backends.collective's."""

from __future__ import annotations

from dsv4hal.distributed.backends.collective import CollectiveBackend


def make_all_to_all() -> CollectiveBackend:
    return CollectiveBackend("torch_all_to_all", "all_to_all")


def make_all_gather() -> CollectiveBackend:
    return CollectiveBackend("torch_all_gather", "all_gather")
