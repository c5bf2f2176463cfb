"""KernelImpl entries for the portable Triton kernels (added as kernels land)."""

from __future__ import annotations

from dsv4hal.registry import Registry


def register(registry: Registry) -> None:
    pass
