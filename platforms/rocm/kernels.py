"""Every KernelImpl of the rocm plugin (metadata and supports() only: no torch, no vendor import; the targets
are imported when an op is bound). Priorities are named below with the reason for each.

indexer_topk -> `torch.ops.sgl_kernel.deepseek_v4_topk_transform_512` (HIP build of sgl-kernel; SGLang's
    DSV4 HIP radix backend calls it). Schema (sgl-project/sglang, kernels/aot/csrc/common_extension_rocm.cc):
    `deepseek_v4_topk_transform_512(Tensor scores, Tensor seq_lens, Tensor page_table, Tensor! page_indices,
    int page_size, Tensor!? raw_indices) -> ()`. k is page_indices.size(1), 1..1024 in current sources
    (exactly 512 in older sgl-kernel builds). It always writes page indices, so a page table is required.
sparse_attention_decode -> aiter `pa_decode_sparse` (aiter.ops.triton.attention.pa_decode_sparse), whose
    gfx950 Gluon path reads the packed 584-byte V4 cache ("fp8_ds_mla": 576-byte records, then 8-byte
    UE8M0 scale blocks, page stride free) with an optional second (C4/C128) cache. gfx950 and OCP e4m3fn
    only. Nothing in aiter reads this cache on gfx942; the other aiter V4 decoders (mla_v40_decode_fwd,
    mla_decode_fwd_v4_nm) take FP8-quantized q and a different cache layout.
sparse_attention_prefill: nothing registered (see platforms/rocm/README.md).
"""

from __future__ import annotations

from collections.abc import Mapping

from dsv4hal_rocm import aiter_moe

from dsv4hal.hardware import PlatformInfo
from dsv4hal.kernels import vendor_bounds
from dsv4hal.kernels.moe_support import moe_kernel
from dsv4hal.registry import KernelImpl, QueryHeads, Registry

PLATFORM = "rocm"
SGL_KERNEL = "sgl_kernel"  # import name; importing it registers torch.ops.sgl_kernel.*
AITER = "aiter"
TOPK_PRIORITY = 250  # above the portable Triton top-k kernels (99-102)
DECODE_PRIORITY = 300  # above the portable Triton attention (100)
MOE_PRIORITY = 300  # aiter's a8w4 MXFP4 experts: above the portable triton_fused_moe (100)
TOPK_MAX_K = 1024  # the HIP op's kMaxTopK
AITER_DECODE_ARCHS = ("gfx950",)  # pa_decode_sparse's packed-cache (Gluon) path asserts gfx950
AITER_HEADS = QueryHeads(multiple=16)  # BLOCK_M of the Gluon kernel: heads are processed 16 at a time


def topk_supports(case: Mapping[str, object], info: PlatformInfo) -> list[str]:
    reasons = []
    k = case.get("k")
    if not isinstance(k, int) or not 0 < k <= TOPK_MAX_K:
        reasons.append(f"deepseek_v4_topk_transform_512 takes k <= {TOPK_MAX_K} (page_indices.size(1)), got {k}")
    if not case.get("page_transform"):
        reasons.append("deepseek_v4_topk_transform_512 always writes page indices and needs a page_table; "
                       "raw-only top-k (page_table=None) goes to another implementation")
    return reasons


def decode_supports(case: Mapping[str, object], info: PlatformInfo) -> list[str]:
    reasons = []
    if info.arch not in AITER_DECODE_ARCHS:
        reasons.append(f"aiter pa_decode_sparse reads the packed V4 cache only on {', '.join(AITER_DECODE_ARCHS)} "
                       f"(its Gluon path); this GPU is {info.arch}")
    if case.get("fp8") != "e4m3fn":
        reasons.append(f"aiter pa_decode_sparse decodes the packed cache as OCP e4m3fn; this cache is "
                       f"{case.get('fp8')} (convert it with dsv4hal_rocm.convert_cache)")
    return reasons + AITER_HEADS.reasons(case.get("h_q"), "aiter pa_decode_sparse")


def register(registry: Registry) -> None:
    registry.add_kernel(KernelImpl(
        op="indexer_topk", name="sgl_kernel_hip_topk", target="dsv4hal_rocm.sgl_ops:indexer_topk",
        platforms=(PLATFORM,), priority=TOPK_PRIORITY, tier="vendor", requires=(SGL_KERNEL,),
        supports=topk_supports, bounds_checked=False,
        bounds_note=vendor_bounds.SGL_HIP_TOPK,
        description="sgl-kernel HIP deepseek_v4_topk_transform_512 (radix select + page transform, raw out)"))
    registry.add_kernel(KernelImpl(
        op="sparse_attention_decode", name="aiter_pa_decode_sparse",
        target="dsv4hal_rocm.aiter_ops:sparse_attention_decode", platforms=(PLATFORM,), priority=DECODE_PRIORITY,
        tier="vendor", requires=(AITER, "triton"), supports=decode_supports, layout="v4-584-e4m3fn",
        query_heads=AITER_HEADS,
        description="aiter pa_decode_sparse (gfx950 Gluon, packed V4 cache, SWA + extra two-loop); "
                    "split-K partials combined here to return lse"))
    registry.add_kernel(moe_kernel(
        aiter_moe.NAME, "dsv4hal_rocm.aiter_moe", PLATFORM, MOE_PRIORITY, (AITER,), aiter_moe.LAYOUT,
        aiter_moe.supports, "aiter fused_moe a8w4 (FP8 activations x MXFP4, FlyDSL, gate/up interleaved), Silu with "
        "swiglu_limit; not run here (no AMD GPU)"))
