"""Every KernelImpl of the cuda_sm90 plugin (metadata and supports() only: no torch, no vendor import; the
targets are imported when an op is bound). Priorities are named below with the reason for each; the portable
Triton kernels sit at 100 and the PyTorch reference at 0 on every platform."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from dsv4hal_cuda_sm90 import (
    deepgemm_grouped_linear,
    deepgemm_linear,
    deepgemm_moe,
    marlin_moe,
    oai_triton_moe,
    vllm_router,
)

from dsv4hal.hardware import PlatformInfo
from dsv4hal.kernels import deepep, deepgemm_indexer, deepgemm_mega_moe, deepgemm_mhc, flashinfer_a2a, vendor_bounds
from dsv4hal.kernels.moe_support import moe_kernel
from dsv4hal.kernels.vendor_versions import deep_gemm as deep_gemm_minimum
from dsv4hal.registry import KernelImpl, QueryHeads, Registry

PLATFORM = "cuda_sm90"
_FLASHMLA = "dsv4hal_cuda_sm90.flashmla"

FLASHMLA_SGL_PRIORITY = 300  # sgl-flash-mla is FlashMLA's own build: preferred when both are installed
FLASHMLA_VLLM_PRIORITY = 290  # vLLM's bundled FlashMLA: the same kernels, used when only vLLM is installed
# One query row (T = 1) over the SWA window alone or with a short extra list (<= 1024 entries): the portable
# triton_sparse_decode (100) beats FlashMLA in all 6 such buckets of the H200 lock (bench/results/h200/
# cuda_sm90.lock.json: 11.4-15.3 against 21.9-35.9 us, 1.7-2.8x, FlashMLA planning each call) and in the 4 such cells
# of bench-attention.json, where a captured FlashMLA call is planned by dsv4hal's parallel program (9.9-15.7 against
# 14.1-17.2 us, 1.03-1.42x). So FlashMLA goes below it there. With a long C128 list (1M context) FlashMLA stays first
# (32.0 against 59.3 us). These are GPU times (graph replays: how engines run decode). Launched eagerly, the Triton
# kernel's host time is 85-141 us a call against 69-107 for the bound FlashMLA call (bench-attention.json, host_us),
# so an eager single-row call is host-bound either way and waits longer through Triton: force FlashMLA for eager
# single-row serving.
# Up to 64 rows (the "batch" class) FlashMLA stays first: each of the V4-Flash step's three attention calls at batch
# 64, run on its own inputs through both kernels, is faster through FlashMLA (SWA / C4 / C128: 17.1 / 61.1 / 34.2
# against 21.7 / 71.0 / 55.7 us, bench/results/h100/demo-flash.json, kernels_per_call), and at 64 rows over 1024
# extra keys Triton is slower (bench/results/h100/bench-attention.json).
FLASHMLA_SINGLE_ROW_PRIORITY = {"sgl": 95, "vllm": 94}
FLASHMLA_SINGLE_ROW_CASES = ({"tokens": "single", "extra_class": None}, {"tokens": "single", "extra_class": "short"})
FLASHMLA_SINGLE_ROW_WHY = ("H200 graph replays: triton_sparse_decode 1.03-2.8x faster for one query row; launched "
                           "eagerly its host time is 16-35 us longer: force FlashMLA to serve single rows eagerly")
MARLIN_PRIORITY = 300  # MXFP4 experts; H200 conformance: bench/results/h200/conformance-cuda_sm90-moe.json
DEEPGEMM_MOE_PRIORITY = 290  # FP8 experts; H200 conformance: bench/results/h200/conformance-cuda_sm90-moe.json
# the same FP8 experts with DeepGEMM's psum layout (the GEMMs skip the padding tail of every expert): above the
# per-row layout, faster in 9 of the 10 shapes of bench/results/h200/bench-moe.json (1.07-1.34x from T=8, 1.5-3.6x with
# 50-90% of the routes dropped for expert parallelism); slower only for one token (98.7 against 75.1 us)
DEEPGEMM_MOE_PSUM_PRIORITY = 291
# OpenAI's triton_kernels (vLLM 0.24's bundle) for MXFP4 experts, against Marlin on the H200 (V4-Flash, bench-moe.json):
# 1.11x faster at T=16, 1.09x at 32, 1.13x at 64, 1.24x at 512, 1.96x at 4096 (0.49 of the bf16 peak), but 2.9x slower
# at T=1 and 1.42x at T=8. Weights prepared for more than 64 tokens a call (prepare_weights(tokens=...), the class
# prefill) get it; the classes few and decode: below
OAI_TRITON_MOE_PRIORITY = 250
OAI_TRITON_MOE_PREFILL_PRIORITY = 310
# The classes few and decode (<= 64 tokens a call): the portable triton_fused_moe (100; its MXFP4 decode kernels with
# the weight rows as the dot's M, layout triton-moe-v2) beats both libraries at every measured T on the H200
# (sweep-mx-moe-decode.json, "grid_v2"): 48.0 / 110.7 / 189.5 / 335.8 / 769.7 us at
# T = 1 / 4 / 8 / 16 / 64 against Marlin's 54.4 / 141.6 / 251.3 / 445.2 / 1012.7 and triton_kernels' 96.4 / 201.3 /
# 283.3 / 419.9 / 909.8. So both go below it there, Marlin still above triton_kernels
MARLIN_DECODE_PRIORITY = 95
OAI_TRITON_MOE_DECODE_PRIORITY = 90
MOE_DECODE_WHY = "H200: the portable triton_fused_moe is faster at every measured T <= 64"
OAI_TRITON_MOE_WHY = ("H200: 1.24-1.96x faster than Marlin for prefill (T >= 512); slower than triton_fused_moe and "
                      "Marlin at T <= 64")
ROUTER_PRIORITY = 300  # vLLM's fused sqrt-softplus top-k; H200 conformance (same file)
DEEPGEMM_INDEXER_PRIORITY = 300  # above the portable triton_indexer_logits (100)
# mhc_pre and mhc_post_pre with DeepGEMM's pre-norm GEMM (dsv4hal.kernels.deepgemm_mhc): above the Triton kernels
# (100, 101), faster in every measured H200 shape (cuda_sm90.lock.json: 5.0 vs 5.4 us and 13.1 vs 14.5 for mhc_pre;
# bench-mhc.json 9.1 vs 9.6 us at T=1 and 11.8 vs 14.0 at T=64 for mhc_post_pre), conformance passed forced
DEEPGEMM_MHC_PRIORITY = 102
# fp8_linear through DeepGEMM's fp8_gemm_nt, the GEMM SGLang and vLLM run these projections with on Hopper: above the
# portable triton_fp8_linear (100); neither is timed on the H200 yet (`dsv4hal tune` orders them per token class)
DEEPGEMM_LINEAR_PRIORITY = 300
# fp8_grouped_linear through DeepGEMM's fp8_einsum, what SGLang runs V4's wo_a with on Hopper: above the portable
# triton_fp8_grouped_linear (100) for the same reason; neither is timed yet (`dsv4hal bench linear` times both)
DEEPGEMM_GROUPED_LINEAR_PRIORITY = 300

FLASHMLA_H_Q = QueryHeads(counts=(64, 128))  # the legacy kernels are instantiated for 64 and 128 heads
PREFILL_TOPK_ALIGN = 128  # SM90 sparse prefill asserts topk % 128 == 0 for h64 and h128
DEEPGEMM_INDEXER = "deepgemm_paged_mqa_logits_sm90"
DEEPGEMM_BLOCK_KVS = (64,)  # SM90 fp8_paged_mqa_logits: block_kv == 64


def flashmla_decode_supports(case: Mapping[str, object], info: PlatformInfo) -> list[str]:
    reasons = []
    if case.get("fp8") != "e4m3fn":
        reasons.append(f"FlashMLA reads e4m3fn caches only (this cache is {case.get('fp8')}); convert it with "
                       "dsv4hal.formats.v4_cache.convert_cache or use triton")
    reasons += FLASHMLA_H_Q.reasons(case.get("h_q"), "FlashMLA SM90 decode")
    return reasons


def flashmla_prefill_supports(case: Mapping[str, object], info: PlatformInfo) -> list[str]:
    reasons = FLASHMLA_H_Q.reasons(case.get("h_q"), "FlashMLA SM90 prefill")
    width = int(case.get("width", 0))  # type: ignore[arg-type]
    if width % PREFILL_TOPK_ALIGN:
        reasons.append(f"FlashMLA SM90 sparse prefill needs an index width that is a multiple of "
                       f"{PREFILL_TOPK_ALIGN}, got {width}: pad the indices with -1")
    return reasons


def deepgemm_indexer_supports(case: Mapping[str, object], info: PlatformInfo) -> list[str]:
    return deepgemm_indexer.supports(case, info, arch="SM90", block_kvs=DEEPGEMM_BLOCK_KVS)


def register(registry: Registry) -> None:
    for flavour, lib, prio in (("sgl", "flash_mla", FLASHMLA_SGL_PRIORITY),
                               ("vllm", "vllm", FLASHMLA_VLLM_PRIORITY)):
        registry.add_kernel(KernelImpl(
            op="sparse_attention_decode", name=f"flashmla_sm90_{flavour}",
            target=f"{_FLASHMLA}:sparse_attention_decode_{flavour}", platforms=(PLATFORM,), priority=prio,
            priority_when=tuple((when, FLASHMLA_SINGLE_ROW_PRIORITY[flavour]) for when in FLASHMLA_SINGLE_ROW_CASES),
            priority_why=FLASHMLA_SINGLE_ROW_WHY,
            tier="vendor", requires=(lib,), supports=flashmla_decode_supports, layout="v4-584-e4m3fn",
            bounds_checked=False, bounds_note=vendor_bounds.FLASHMLA_DECODE, query_heads=FLASHMLA_H_Q,
            description=f"FlashMLA legacy SM90 sparse decode ({lib})"))
        registry.add_kernel(KernelImpl(
            op="sparse_attention_prefill", name=f"flashmla_sm90_{flavour}",
            target=f"{_FLASHMLA}:sparse_attention_prefill_{flavour}", platforms=(PLATFORM,), priority=prio,
            tier="vendor", requires=(lib,), supports=flashmla_prefill_supports, query_heads=FLASHMLA_H_Q,
            description=f"FlashMLA legacy SM90 sparse prefill ({lib})"))
    registry.add_kernel(KernelImpl(
        op="moe_experts", name=marlin_moe.NAME, target="dsv4hal_cuda_sm90.marlin_moe:moe_experts",
        prepare="dsv4hal_cuda_sm90.marlin_moe:prepare_weights", platforms=(PLATFORM,), priority=MARLIN_PRIORITY,
        priority_when=tuple(({"tokens": c}, MARLIN_DECODE_PRIORITY) for c in ("few", "decode")),
        priority_why=MOE_DECODE_WHY,
        tier="vendor", requires=(), supports=marlin_moe.supports, layout=marlin_moe.LAYOUT,
        description=f"vLLM 0.24 Marlin MoE (W4A16 MXFP4, torch.ops.{marlin_moe.OP_NAMESPACE}.{marlin_moe.OP_NAME}; "
                    f"library from {marlin_moe.ENV_LIB})"))
    registry.add_kernel(moe_kernel(
        deepgemm_moe.NAME, "dsv4hal_cuda_sm90.deepgemm_moe", PLATFORM, DEEPGEMM_MOE_PRIORITY,
        (deepgemm_moe.LIBRARY,), deepgemm_moe.LAYOUT, deepgemm_moe.supports,
        "DeepGEMM m_grouped_fp8_gemm_nt_contiguous (FP8 1x128 activations x 128x128-block weights), Triton "
        "gather+quant and clamped SwiGLU+quant between the GEMMs"))
    registry.add_kernel(replace(
        moe_kernel(deepgemm_moe.PSUM_NAME, "dsv4hal_cuda_sm90.deepgemm_moe", PLATFORM, DEEPGEMM_MOE_PSUM_PRIORITY,
                   (deepgemm_moe.LIBRARY,), deepgemm_moe.LAYOUT, deepgemm_moe.supports,
                   f"{deepgemm_moe.NAME} with DeepGEMM's psum layout (use_psum_layout=True, grouped_layout = each "
                   "expert's unaligned end): the GEMMs visit only the blocks that hold routes"),
        target="dsv4hal_cuda_sm90.deepgemm_moe:moe_experts_psum",
        min_versions=(deep_gemm_minimum(deepgemm_moe.PSUM_MIN_VERSION, "checked to take use_psum_layout on SM90"),)))
    registry.add_kernel(moe_kernel(
        oai_triton_moe.NAME, "dsv4hal_cuda_sm90.oai_triton_moe", PLATFORM, OAI_TRITON_MOE_PRIORITY,
        (oai_triton_moe.LIBRARY,), oai_triton_moe.LAYOUT, oai_triton_moe.supports,
        "triton_kernels matmul_ogs (vLLM 0.24's bundle; W4A16 MXFP4 in the Hopper layouts): routing from the top-k, "
        "GEMM1 with DSV4's clamped SwiGLU fused, GEMM2 with the routing weights and the per-token sum",
        priority_when=(({"tokens": "prefill"}, OAI_TRITON_MOE_PREFILL_PRIORITY),
                       *(({"tokens": c}, OAI_TRITON_MOE_DECODE_PRIORITY) for c in ("few", "decode"))),
        priority_why=OAI_TRITON_MOE_WHY))
    registry.add_kernel(KernelImpl(
        op="moe_route", name=vllm_router.NAME, target="dsv4hal_cuda_sm90.vllm_router:moe_route",
        platforms=(PLATFORM,), priority=ROUTER_PRIORITY, tier="vendor", supports=vllm_router.supports,
        bounds_checked=False, bounds_note=vendor_bounds.VLLM_ROUTER,
        description=f"vLLM 0.24 torch.ops._moe_C.{vllm_router.OP_NAME} (library from {vllm_router.lib.ENV_LIB})"))
    registry.add_kernel(deepgemm_indexer.kernel(PLATFORM, DEEPGEMM_INDEXER, DEEPGEMM_INDEXER_PRIORITY,
                                                deepgemm_indexer_supports, "SM90"))
    registry.add_kernel(deepgemm_mhc.kernel(PLATFORM, "deepgemm_mhc_pre_sm90", DEEPGEMM_MHC_PRIORITY, "SM90"))
    registry.add_kernel(deepgemm_mhc.kernel(PLATFORM, "deepgemm_mhc_post_pre_sm90", DEEPGEMM_MHC_PRIORITY,
                                            "SM90", op="mhc_post_pre"))
    registry.add_kernel(KernelImpl(
        op="fp8_linear", name=deepgemm_linear.NAME, target="dsv4hal_cuda_sm90.deepgemm_linear:fp8_linear",
        platforms=(PLATFORM,), priority=DEEPGEMM_LINEAR_PRIORITY, tier="vendor",
        requires=(deepgemm_linear.LIBRARY, "triton"), supports=deepgemm_linear.supports,
        min_versions=(deepgemm_linear.MINIMUM,),
        description="the MoE's Triton 1x128 quantizer (TMA-aligned MN-major scales), then DeepGEMM fp8_gemm_nt "
                    "(SM90 1D2D kernel, fp32 scales)"))
    registry.add_kernel(KernelImpl(
        op="fp8_grouped_linear", name=deepgemm_grouped_linear.NAME,
        target="dsv4hal_cuda_sm90.deepgemm_grouped_linear:fp8_grouped_linear", platforms=(PLATFORM,),
        priority=DEEPGEMM_GROUPED_LINEAR_PRIORITY, tier="vendor", requires=(deepgemm_linear.LIBRARY, "triton"),
        supports=deepgemm_grouped_linear.supports, min_versions=(deepgemm_grouped_linear.MINIMUM,),
        description="the MoE's Triton 1x128 quantizer over x's T*G rows (scales in the per-group TMA-aligned layout), "
                    "then DeepGEMM fp8_einsum('bhr,hdr->bhd') (the SM90 batched 1D2D kernel, every group in one "
                    "launch)"))
    registry.add_kernel(deepep.kernel(PLATFORM, "sm90"))  # expert_parallel
    registry.add_kernel(flashinfer_a2a.kernel(PLATFORM, "sm90"))  # expert_parallel
    registry.add_kernel(deepgemm_mega_moe.kernel(PLATFORM, "sm90"))  # ep_fused_moe
