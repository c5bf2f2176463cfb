"""dsv4hal plugin for NVIDIA datacenter Blackwell (the SM100 family: sm100 B200/GB200, sm103 B300).

SM120/SM121 (RTX Blackwell, DGX Spark) are not claimed: they lack tcgen05 and TMEM, which the SM100
kernels of FlashMLA, DeepGEMM and TRTLLM-Gen need.

Binds FlashMLA's SM100 sparse decode and prefill for the V4 cache format through sgl-flash-mla's legacy
library (use_legacy=True, as on Hopper; see dsv4hal_cuda_sm100.kernels for the facts), and dsv4hal's
portable Triton kernels where no vendor kernel exists."""

from __future__ import annotations

from dsv4hal.claims import claim_arch
from dsv4hal.hardware import PlatformInfo, Vendor
from dsv4hal.hookspecs import hookimpl
from dsv4hal.registry import PlatformSpec, Registry

PLATFORM = "cuda_sm100"
ARCHS = ("sm100", "sm103")  # the SM100 family


def claims(info: PlatformInfo) -> list[str]:
    return claim_arch(info, Vendor.NVIDIA, ARCHS, "SM120 is not SM100: no tcgen05/TMEM")


@hookimpl
def dsv4hal_register(registry: Registry) -> None:
    registry.add_platform(PlatformSpec(
        name=PLATFORM, description="NVIDIA Blackwell SM100 family: FlashMLA SM100, FlashInfer TRTLLM-Gen, DeepGEMM",
        priority=100, claims=claims, device_type="cuda", archs=ARCHS, runs_triton=True))
    from dsv4hal_cuda_sm100 import kernels

    kernels.register(registry)
