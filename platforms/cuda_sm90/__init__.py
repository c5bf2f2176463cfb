"""dsv4hal plugin for NVIDIA Hopper (sm90: H100, H200, H20, H800).

Binds FlashMLA's SM90 sparse kernels for the V4 cache format (sgl-flash-mla, or vLLM's bundled
FlashMLA), and dsv4hal's portable Triton kernels where no vendor kernel exists."""

from __future__ import annotations

from dsv4hal.claims import claim_arch
from dsv4hal.hardware import PlatformInfo, Vendor
from dsv4hal.hookspecs import hookimpl
from dsv4hal.registry import PlatformSpec, Registry

PLATFORM = "cuda_sm90"
ARCHS = ("sm90",)


def claims(info: PlatformInfo) -> list[str]:
    return claim_arch(info, Vendor.NVIDIA, ARCHS, "Hopper kernels use wgmma/TMA of sm90a only")


@hookimpl
def dsv4hal_register(registry: Registry) -> None:
    registry.add_platform(PlatformSpec(
        name=PLATFORM, description="NVIDIA Hopper (sm90a): FlashMLA SM90, DeepGEMM, Marlin, Triton",
        priority=100, claims=claims, device_type="cuda", archs=ARCHS, runs_triton=True))
    from dsv4hal_cuda_sm90 import kernels

    kernels.register(registry)
