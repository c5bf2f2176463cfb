"""World size 1: dispatch and combine run the collective backend's code with no communication, so a single-GPU
CI exercises the same packing, layouts and handles as a multi-GPU run."""

from __future__ import annotations

from dsv4hal.distributed.backends.collective import CollectiveBackend


def make() -> CollectiveBackend:
    return CollectiveBackend("loopback", "all_to_all")
