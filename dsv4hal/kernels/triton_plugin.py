"""The portable Triton kernels as a plugin: registered for every platform that declares `runs_triton`,
below the vendor kernels, and for the CPU only when Triton's interpreter is on (TRITON_INTERPRET=1: tests)
at a priority below the reference, so they run there only when forced (kernels/triton/registrations.py)."""

from __future__ import annotations

from dsv4hal.hookspecs import hookimpl
from dsv4hal.registry import Registry


@hookimpl
def dsv4hal_register(registry: Registry) -> None:
    from dsv4hal.kernels.triton import registrations

    registrations.register(registry)
