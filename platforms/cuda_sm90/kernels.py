"""Kernel registrations of the cuda_sm90 plugin (metadata only; targets are imported when bound)."""

from __future__ import annotations

from dsv4hal.registry import KernelImpl, Registry

_MOD = "dsv4hal_cuda_sm90.flashmla"


def register(registry: Registry) -> None:
    for flavour, lib, prio in (("sgl", "flash_mla", 300), ("vllm", "vllm", 290)):
        registry.add_kernel(KernelImpl(
            op="sparse_attention_decode", name=f"flashmla_sm90_{flavour}", target=f"{_MOD}:sparse_attention_decode_"
            f"{flavour}", platforms=("cuda_sm90",), priority=prio, tier="vendor", requires=(lib,),
            supports=_decode_supports, layout="v4-584-e4m3fn",
            description=f"FlashMLA legacy SM90 sparse decode ({lib})"))
        registry.add_kernel(KernelImpl(
            op="sparse_attention_prefill", name=f"flashmla_sm90_{flavour}", target=f"{_MOD}:sparse_attention_prefill_"
            f"{flavour}", platforms=("cuda_sm90",), priority=prio, tier="vendor", requires=(lib,),
            supports=_prefill_supports, description=f"FlashMLA legacy SM90 sparse prefill ({lib})"))
    from dsv4hal_cuda_sm90.deepgemm_indexer import register_deepgemm_indexer
    from dsv4hal_cuda_sm90.deepgemm_moe import register_deepgemm  # these import no torch at registration
    from dsv4hal_cuda_sm90.marlin_moe import register_marlin
    from dsv4hal_cuda_sm90.vllm_router import register_router

    register_marlin(registry)
    register_deepgemm(registry)
    register_router(registry)
    register_deepgemm_indexer(registry)


def _decode_supports(case, info):  # noqa: ANN001, ANN202
    from dsv4hal_cuda_sm90.flashmla import decode_supports

    return decode_supports(case, info)


def _prefill_supports(case, info):  # noqa: ANN001, ANN202
    from dsv4hal_cuda_sm90.flashmla import prefill_supports

    return prefill_supports(case, info)
