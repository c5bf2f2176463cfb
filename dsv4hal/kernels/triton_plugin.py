"""The portable Triton kernels, registered for every GPU platform below the vendor kernels, and for
the CPU only when Triton's interpreter is on (TRITON_INTERPRET=1: tests) at a priority below the
reference, so they run there only when forced."""

from __future__ import annotations

from dsv4hal.hookspecs import hookimpl
from dsv4hal.registry import Registry

GPU_PLATFORMS = ("cuda_sm90", "cuda_sm100", "rocm")


@hookimpl
def dsv4hal_register(registry: Registry) -> None:
    from dsv4hal.kernels.triton import registrations

    registrations.register(registry)
