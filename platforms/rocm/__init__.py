"""dsv4hal plugin for AMD Instinct (gfx942 MI300/MI325 with e4m3fnuz FP8, gfx950 MI350/MI355).

Binds the indexer top-k to sgl-kernel's HIP op and, on gfx950, sparse decode to aiter's pa_decode_sparse
(see dsv4hal_rocm.kernels); everything else falls to dsv4hal's portable Triton kernels or the reference.
platforms/rocm/README.md says what runs where, and how SGLang's HIP backend serves extend."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dsv4hal.claims import claim_arch
from dsv4hal.hardware import PlatformInfo, Vendor
from dsv4hal.hookspecs import hookimpl
from dsv4hal.registry import PlatformSpec, Registry

if TYPE_CHECKING:
    from dsv4hal.formats.fp8 import FP8Flavor
    from dsv4hal.formats.v4_cache import V4PagedCache

PLATFORM = "rocm"
ARCHS = ("gfx942", "gfx950")

__all__ = ["ARCHS", "PLATFORM", "claims", "convert_cache", "dsv4hal_register"]


def claims(info: PlatformInfo) -> list[str]:
    return claim_arch(info, Vendor.AMD, ARCHS, "dsv4hal's ROCm kernels are tuned and checked for CDNA3/CDNA4")


def convert_cache(cache: V4PagedCache, dst: FP8Flavor) -> V4PagedCache:
    """Re-encode a V4 paged cache for another FP8 flavour (dsv4hal.formats.v4_cache.convert_cache).

    gfx942 (MI300/MI325) stores FP8 as e4m3fnuz; NVIDIA GPUs and gfx950 use OCP e4m3fn. The same byte
    means half the value in fnuz, so a cache written on one vendor cannot be read by the other's kernels
    as is. Use this when moving a cache across vendors or flavours (prefill/decode disaggregation,
    offloaded or persisted caches, HiCache-style transfer, or to feed an e4m3fn-only kernel such as
    FlashMLA or aiter's pa_decode_sparse from a gfx942-written cache): it returns a copy in which only the
    448 nope bytes and 7 UE8M0 scale bytes of every slot change (the exponent moves by one); rope, pad
    and page padding bytes are copied. e4m3fn -> e4m3fnuz is lossless for every scale byte in [1, 254]
    (writers produce 105..248); e4m3fnuz -> e4m3fn re-casts only tiles holding +-240 or NaN codes.
    A pure-PyTorch copy on the cache's own device, outside the hot path (it allocates a new pool)."""
    from dsv4hal.formats import v4_cache

    return v4_cache.convert_cache(cache, dst)


@hookimpl
def dsv4hal_register(registry: Registry) -> None:
    registry.add_platform(PlatformSpec(
        name=PLATFORM, description="AMD Instinct gfx942/gfx950: aiter where it has the kernel, Triton otherwise",
        priority=100, claims=claims, device_type="cuda", archs=ARCHS, runs_triton=True))
    from dsv4hal_rocm import kernels

    kernels.register(registry)
