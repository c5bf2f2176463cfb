"""Kernel registrations of the cuda_sm90 plugin (metadata only; targets are imported when bound)."""

from __future__ import annotations

from dsv4hal.registry import Registry


def register(registry: Registry) -> None:
    """Vendor kernels are added here as they are bound (see the Hopper issue)."""
