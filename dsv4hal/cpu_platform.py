"""The built-in CPU platform: every op bound to its pure-PyTorch reference. The references are also
registered for every other platform at the lowest priority, so an op with no fast kernel still runs
(on the GPU, through PyTorch) and `info` says so; strict mode refuses that on GPU platforms. The built-in
backends of the collective ops expert_parallel, tp_all_reduce and ep_fused_moe (loop-back, torch collectives, the
split path) are registered here too, for every platform."""

from __future__ import annotations

from dsv4hal.distributed import backends as ep_backends
from dsv4hal.distributed import fused as ep_fused
from dsv4hal.distributed import tp_backends
from dsv4hal.hardware import PlatformInfo
from dsv4hal.hookspecs import hookimpl
from dsv4hal.ops.catalog import OPS
from dsv4hal.registry import KernelImpl, PlatformSpec, Registry

REFERENCE_PRIORITY = 0


def _always(info: PlatformInfo) -> list[str]:
    return [] if "torch" in info.libraries else ["torch is not installed"]


@hookimpl
def dsv4hal_register(registry: Registry) -> None:
    registry.add_platform(PlatformSpec(
        name="cpu", description="pure-PyTorch reference on the CPU (any machine)", priority=0,
        claims=_always, device_type="cpu"))
    for op in OPS:
        registry.add_kernel(KernelImpl(
            op=op.name, name="torch_reference", target=op.reference, platforms=("*",),
            priority=REFERENCE_PRIORITY, tier="reference", requires=("torch",),
            description="pure-PyTorch reference (float32 accumulation)"))
    ep_backends.register(registry)
    tp_backends.register(registry)
    ep_fused.register(registry)
