"""dsv4hal plugin for AMD Instinct (gfx942 MI300/MI325 with e4m3fnuz FP8, gfx950 MI350/MI355)."""

from __future__ import annotations

from dsv4hal.claims import claim_arch
from dsv4hal.hardware import PlatformInfo, Vendor
from dsv4hal.hookspecs import hookimpl
from dsv4hal.registry import PlatformSpec, Registry

PLATFORM = "rocm"
ARCHS = ("gfx942", "gfx950")


def claims(info: PlatformInfo) -> list[str]:
    return claim_arch(info, Vendor.AMD, ARCHS, "dsv4hal's ROCm kernels are tuned and checked for CDNA3/CDNA4")


@hookimpl
def dsv4hal_register(registry: Registry) -> None:
    registry.add_platform(PlatformSpec(
        name=PLATFORM, description="AMD Instinct gfx942/gfx950: aiter where it has the kernel, Triton otherwise",
        priority=100, claims=claims, device_type="cuda", archs=ARCHS))
