"""Every KernelImpl of the cuda_sm100 plugin (metadata and supports() only: no torch, no vendor import; the
targets are imported when an op is bound). Priorities are named below with the reason for each.

FlashMLA's SM100 sparse kernels for the V4 (584-byte, "MODEL1") cache, reached through sgl-flash-mla
(`flash_mla`). Facts the choices below rest on (docs/vendor-apis.md sections 1.1, 1.3, 1.4, 1.7 and
deepseek-ai/FlashMLA @9241ae3 csrc/api/sparse_{decode,fwd}.h, csrc/sm100/...):

- sgl-flash-mla 1.0.0 serves the V4 format only from its legacy library (`torch.ops.flash_mla_legacy`,
  `use_legacy=True`), which carries sm_100/sm_103/sm_107 code; its current library (`use_legacy=False`)
  takes the V4.1 formats (528/288 bytes) only. So V4 needs use_legacy=True on SM100 exactly as on SM90.
- SM100 decode: head64 kernel for h_q=64, the small-topk head128 kernel for h_q=128; both assert
  topk % 64 == 0 and extra_topk % 64 == 0 (dsv4hal's index contract pads every width to 64), the cache
  base 16-byte aligned and k_cache.stride(0) % 576 == 0 (V4PagedCache pages are padded to a multiple of
  576 bytes, so this always holds), and q.stride(0) % q.stride(1) == 0 (the binding makes it so).
- SM100 prefill: h_q=64 runs a kernel with B_TOPK=64 (topk % 64); h_q=128 runs the small-topk kernel
  (B_TOPK=64) when topk <= 1280, else the regular head128 kernel (B_TOPK=128, topk % 128). SM90 instead
  needs topk % 128 for both head counts.

indexer_logits runs dsv4hal.kernels.deepgemm_indexer, the binding Hopper uses: DeepGEMM 891d57b dispatches the
same `fp8_paged_mqa_logits` entry to its SM100 kernel with the same host checks (csrc/apis/attention.hpp: FP8 q
e4m3fn, 32/64 heads, fused cache [blocks, block_kv, 1, D+4] SoA per block, 2-D context lengths). What SM100 adds
is not used: block_kv 32 (dsv4hal's indexer pages are 64); the FP4 indexer (`fp8_fp4_paged_mqa_logits`, a
68-byte cache row of D/2 packed nibbles + UE8M0 scales: another cache format than this contract's 132-byte FP8
rows); bf16 logits (the contract returns fp32). The output is DeepGEMM's own buffer (row stride aligned to 256
entries), so its alignment needs nothing from the caller. Not run here (no Blackwell GPU).
"""

from __future__ import annotations

from collections.abc import Mapping

from dsv4hal_cuda_sm100 import deepgemm_moe, flashinfer_moe

from dsv4hal.hardware import PlatformInfo
from dsv4hal.kernels import deepep, deepgemm_indexer, deepgemm_mega_moe, deepgemm_mhc, flashinfer_a2a, vendor_bounds
from dsv4hal.kernels.moe_support import moe_kernel
from dsv4hal.kernels.vendor_versions import sgl_flash_mla
from dsv4hal.registry import KernelImpl, QueryHeads, Registry

PLATFORM = "cuda_sm100"
LIBRARY = "flash_mla"  # import name of sgl-flash-mla
_MOD = "dsv4hal_cuda_sm100.flashmla"

PRIORITY = 300  # FlashMLA attention: above the portable Triton kernels (100) and the reference (0)
FLASHINFER_MOE_PRIORITY = 300  # TRTLLM-Gen MXFP4 experts: Blackwell's own MoE kernels, preferred
DEEPGEMM_MOE_PRIORITY = 290  # DeepGEMM FP8 x FP4 experts with dsv4hal's Triton glue: when FlashInfer is missing
DEEPGEMM_INDEXER_PRIORITY = 300  # above the portable triton_indexer_logits (100)
# mhc_pre and mhc_post_pre with DeepGEMM's pre-norm GEMM (dsv4hal.kernels.deepgemm_mhc): not yet timed inside the
# ops, so just below the Triton kernels (100, 101) until `dsv4hal tune` measures them
DEEPGEMM_MHC_PRIORITY = 99
DEEPGEMM_INDEXER = "deepgemm_paged_mqa_logits_sm100"
DEEPGEMM_BLOCK_KVS = (32, 64)  # SM100 fp8_paged_mqa_logits: block_kv == 32 or 64

H_Q = QueryHeads(counts=(64, 128))  # the head64 and head128 kernels
# the first sgl-flash-mla with the use_legacy switch (pyproject pins >= 1.0.0)
MINIMUM = sgl_flash_mla((1, 0, 0), "with use_legacy (the V4 format lives in its legacy library)")
DECODE_TOPK_ALIGN = 64  # SM100 head64 and small-topk head128 kernels: B_TOPK = 64
PREFILL_SMALL_TOPK_MAX = 1280  # h_q=128 takes the small-topk kernel up to this index width
PREFILL_TOPK_ALIGN_SMALL = 64  # h_q=64 kernel and the h_q=128 small-topk kernel
PREFILL_TOPK_ALIGN_LARGE = 128  # h_q=128 regular kernel (width > 1280)


def prefill_topk_align(h_q: int, width: int) -> int:
    """The index-width multiple FlashMLA's SM100 sparse prefill asserts for this head count and width."""
    if h_q == 128 and width > PREFILL_SMALL_TOPK_MAX:
        return PREFILL_TOPK_ALIGN_LARGE
    return PREFILL_TOPK_ALIGN_SMALL


def _fp8_reasons(case: Mapping[str, object]) -> list[str]:
    if case.get("fp8") != "e4m3fn":
        return [f"FlashMLA reads e4m3fn caches only (this cache is {case.get('fp8')}); convert it with "
                "dsv4hal.formats.v4_cache.convert_cache or use another implementation"]
    return []


def _h_q_reasons(case: Mapping[str, object], what: str) -> list[str]:
    return H_Q.reasons(case.get("h_q"), f"FlashMLA SM100 {what}")


def decode_supports(case: Mapping[str, object], info: PlatformInfo) -> list[str]:
    reasons = _fp8_reasons(case) + _h_q_reasons(case, "decode")
    width = case.get("extra_width")
    if isinstance(width, int) and width % DECODE_TOPK_ALIGN:
        reasons.append(f"FlashMLA SM100 decode needs an extra index width that is a multiple of "
                       f"{DECODE_TOPK_ALIGN}, got {width}: pad the indices with -1")
    return reasons


def prefill_supports(case: Mapping[str, object], info: PlatformInfo) -> list[str]:
    reasons = _h_q_reasons(case, "sparse prefill")
    h_q, width = case.get("h_q"), case.get("width")
    if h_q in H_Q.counts and isinstance(width, int):
        align = prefill_topk_align(int(h_q), width)  # type: ignore[arg-type]
        if width % align:
            kernel = ("the regular head128 kernel (width > 1280)" if align == PREFILL_TOPK_ALIGN_LARGE
                      else f"the h_q={h_q} kernel")
            reasons.append(f"FlashMLA SM100 sparse prefill through {kernel} needs an index width that is a "
                           f"multiple of {align}, got {width}: pad the indices with -1")
    return reasons


def deepgemm_indexer_supports(case: Mapping[str, object], info: PlatformInfo) -> list[str]:
    return deepgemm_indexer.supports(case, info, arch="SM100", block_kvs=DEEPGEMM_BLOCK_KVS)


def register(registry: Registry) -> None:
    common = dict(platforms=(PLATFORM,), priority=PRIORITY, tier="vendor", requires=(LIBRARY,), query_heads=H_Q,
                  min_versions=(MINIMUM,))
    registry.add_kernel(KernelImpl(
        op="sparse_attention_decode", name="flashmla_sm100_sgl", target=f"{_MOD}:sparse_attention_decode",
        supports=decode_supports, layout="v4-584-e4m3fn",
        bounds_checked=False, bounds_note=vendor_bounds.FLASHMLA_DECODE,
        description="FlashMLA SM100 sparse decode, V4 format (sgl-flash-mla legacy library, use_legacy=True)",
        **common))
    registry.add_kernel(KernelImpl(
        op="sparse_attention_prefill", name="flashmla_sm100_sgl", target=f"{_MOD}:sparse_attention_prefill",
        supports=prefill_supports, bounds_checked=False, bounds_note=vendor_bounds.FLASHMLA_PREFILL_SM100,
        description="FlashMLA SM100 sparse prefill over the bf16 workspace (sgl-flash-mla, use_legacy=True)",
        **common))
    registry.add_kernel(moe_kernel(
        flashinfer_moe.NAME, "dsv4hal_cuda_sm100.flashinfer_moe", PLATFORM, FLASHINFER_MOE_PRIORITY,
        ("flashinfer",), flashinfer_moe.LAYOUT, flashinfer_moe.supports,
        "FlashInfer trtllm_fp4_block_scale_routed_moe (MXFP8 x MXFP4, TRTLLM-Gen); not run here (no Blackwell "
        "GPU)"))
    registry.add_kernel(moe_kernel(
        deepgemm_moe.NAME, "dsv4hal_cuda_sm100.deepgemm_moe", PLATFORM, DEEPGEMM_MOE_PRIORITY, ("deep_gemm",),
        deepgemm_moe.LAYOUT, deepgemm_moe.supports,
        "DeepGEMM m_grouped_fp8_fp4_gemm_nt_contiguous (FP8 1x128 x MXFP4), dsv4hal's Triton glue; not run here "
        "(no Blackwell GPU)"))
    registry.add_kernel(deepgemm_indexer.kernel(PLATFORM, DEEPGEMM_INDEXER, DEEPGEMM_INDEXER_PRIORITY,
                                                deepgemm_indexer_supports, "SM100"))
    registry.add_kernel(deepgemm_mhc.kernel(PLATFORM, "deepgemm_mhc_pre_sm100", DEEPGEMM_MHC_PRIORITY, "SM100"))
    registry.add_kernel(deepgemm_mhc.kernel(PLATFORM, "deepgemm_mhc_post_pre_sm100", DEEPGEMM_MHC_PRIORITY,
                                            "SM100", op="mhc_post_pre"))
    registry.add_kernel(deepep.kernel(PLATFORM, "sm100"))  # expert_parallel
    registry.add_kernel(flashinfer_a2a.kernel(PLATFORM, "sm100"))  # expert_parallel
    registry.add_kernel(deepgemm_mega_moe.kernel(PLATFORM, "sm100"))  # ep_fused_moe
