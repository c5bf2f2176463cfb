"""indexer_logits through DeepGEMM's paged MQA logits, behind dsv4hal's contract: the binding the cuda_sm90 and
cuda_sm100 plugins share (DeepGEMM dispatches the same `fp8_paged_mqa_logits` entry to its SM90 or SM100 kernel
from the device, with the same host checks; each plugin registers it with its arch's block sizes). DeepGEMM as
vLLM 0.24 bundles it (deepseek-ai/DeepGEMM 891d57b, 2.5.0; docs/vendor-apis.md 2.4):
`get_paged_mqa_logits_metadata(context_lens, block_kv, num_sms)` then
`fp8_paged_mqa_logits(q, kv_cache, weights, context_lens, block_table, schedule_meta, max_context_len, clean_logits)`.

Layout: DeepGEMM's fused cache is uint8 [num_blocks, block_kv, 1, D+4] with stride(1) == D+4, and it reads
each block as SoA: block_kv*D FP8 values, then block_kv fp32 scales at byte block_kv*D (csrc/apis/attention.hpp
builds both views from stride(0)). dsv4hal's IndexerPagedCache page is exactly that for block_kv = 64, D = 128
(8448 bytes: 64 x 128 values, then 64 fp32 scales), so the cache is passed as a zero-copy view
`data.view(pages, 64, 1, 132)`. stride(0) = 8448 is a multiple of 4 (asserted) and of 16 (TMA).

Mapping: dsv4hal gives every query token its own block-table row, so B = T and next_n = 1 (context_lens
[T, 1]); DeepGEMM's next_n = 2 shares one block-table row between a request's two tokens, which the contract
does not promise. DeepGEMM leaves logits past a token's context unwritten (clean_logits=True asserts with 2-D
lengths), so a small Triton pass writes -inf there, reading only the lengths.

Limits, each a reason in `supports` or handled here: e4m3fn only (e4m3fnuz has no DeepGEMM path); 32 or 64
heads and head dim 32/64/128 (the contract fixes 64 x 128); block_kv 64 (SM100 also 32: the format is 64);
fp32 weights (the contract); DeepGEMM >= 2.2.0 (2-D context lengths; 2.1 took 1-D only). The schedule
kernel keeps (3 * align(T, 32) + 1) int32 in shared memory (<= 232448 bytes): larger T runs in chunks.
Blocks past ceil(ctx / 64) are never read (the kernel substitutes block 0), as the contract allows.

Scheduling metadata follows the FlashMLA rule (dsv4hal.step): per call, or shared by every call inside
`platform.decode_step()` with the same lengths tensor and shapes. First use JIT-compiles (nvcc), per
aligned batch size for the schedule kernel: warm up outside CUDA-graph capture (dsv4hal.cuda_graphs does).

This module imports torch and deep_gemm only inside functions: registering the plugin stays free."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from dsv4hal.kernels import vendor_bounds, vendor_versions
from dsv4hal.registry import KernelImpl

if TYPE_CHECKING:
    import torch

    from dsv4hal.formats.indexer_cache import IndexerPagedCache
    from dsv4hal.hardware import PlatformInfo

LIBRARY = "deep_gemm"
MIN_VERSION = (2, 2, 0)
HEADS = (32, 64)  # DG_HOST_ASSERT(num_heads == 32 or num_heads == 64), FP8 path
HEAD_DIMS = (32, 64, 128)
BLOCK_KV = 64  # the indexer cache's page size; SM90 takes block_kv == 64, SM100 32 or 64
SMEM_CAPACITY = 232448  # SM90ArchSpec / SM100ArchSpec smem_capacity: bounds the schedule kernel's batch
MAX_TOKENS = ((SMEM_CAPACITY // 4 - 1) // 3) // 32 * 32  # 19360 query tokens per schedule
TMA_ALIGN = 16  # bytes: TMA descriptors need 16-byte aligned base addresses


def supports(case: Mapping[str, object], info: PlatformInfo, *, arch: str, block_kvs: tuple[int, ...]) -> list[str]:
    """Reasons DeepGEMM's paged MQA logits on `arch` (taking blocks of `block_kvs`) cannot run this case."""
    from dsv4hal.formats.indexer_cache import INDEX_DIM, PAGE_SIZE
    from dsv4hal.ops.indexer_logits import INDEX_HEADS

    reasons = []
    if case.get("fp8") != "e4m3fn":
        reasons.append(f"DeepGEMM's paged MQA logits read e4m3fn caches only (this cache is {case.get('fp8')}); "
                       "the portable triton_indexer_logits reads e4m3fnuz")
    if INDEX_HEADS not in HEADS:
        reasons.append(f"DeepGEMM's FP8 paged MQA logits take 32 or 64 heads, not {INDEX_HEADS}")
    if INDEX_DIM not in HEAD_DIMS:
        reasons.append(f"DeepGEMM's FP8 paged MQA logits take head dim 32/64/128, not {INDEX_DIM}")
    if PAGE_SIZE not in block_kvs:
        reasons.append(f"DeepGEMM {arch} paged MQA logits take blocks of {block_kvs}, not {PAGE_SIZE}")
    return reasons


def kernel(platform: str, name: str, priority: int,
           supports_fn: Callable[[Mapping[str, object], PlatformInfo], list[str]], arch: str) -> KernelImpl:
    """The KernelImpl each CUDA plugin registers: the same target and cache layout, its own name, priority and
    arch checks (supports_fn binds `supports` to the arch's block sizes)."""
    return KernelImpl(
        op="indexer_logits", name=name, target="dsv4hal.kernels.deepgemm_indexer:indexer_logits",
        platforms=(platform,), priority=priority, tier="vendor", requires=(LIBRARY, "triton"),
        supports=supports_fn, layout="indexer-132-e4m3fn", bounds_checked=False,
        min_versions=(vendor_versions.deep_gemm(MIN_VERSION, "whose paged MQA logits take 2-D context lengths "
                                                             "[B, next_n]"),),
        bounds_note=vendor_bounds.DEEPGEMM_PAGED_MQA_LOGITS,
        description=f"DeepGEMM fp8_paged_mqa_logits ({arch} kernel) over a zero-copy view of the 132-byte cache "
                    "(next_n 1), Triton -inf tail")


def _deep_gemm() -> Any:
    import deep_gemm

    return deep_gemm


def _aligned(x: torch.Tensor) -> torch.Tensor:
    """x itself when its base is 16-byte aligned (TMA), else an aligned copy (fixed size: graph-safe)."""
    return x if x.data_ptr() % TMA_ALIGN == 0 else x.clone()


def schedule(dg: Any, context_lens: torch.Tensor, num_sms: int) -> torch.Tensor:
    """DeepGEMM's schedule for lengths [B, 1]: per call, or once per step inside platform.decode_step()."""
    from dsv4hal.step import step_plans

    plans = step_plans()
    if plans is None:
        return dg.get_paged_mqa_logits_metadata(context_lens, BLOCK_KV, num_sms)
    key = ("deepgemm_paged_mqa_logits", context_lens.data_ptr(), tuple(context_lens.shape), num_sms)
    meta = plans.get(key)
    if meta is None:
        meta = plans[key] = dg.get_paged_mqa_logits_metadata(context_lens, BLOCK_KV, num_sms)
    return meta


def fused_cache_view(cache: IndexerPagedCache) -> torch.Tensor:
    """uint8 [pages, 64, 1, 132]: DeepGEMM's fused FP8 cache, sharing the IndexerPagedCache's storage."""
    from dsv4hal.formats.indexer_cache import INDEX_DIM, PAGE_SIZE, SCALE_BYTES

    return cache.data.view(cache.num_pages, PAGE_SIZE, 1, INDEX_DIM + SCALE_BYTES)


def _chunk(dg: Any, q: torch.Tensor, kv: torch.Tensor, weights: torch.Tensor, ctx: torch.Tensor,
           block_table: torch.Tensor, width: int) -> torch.Tensor:
    num_sms = int(dg.get_num_sms())
    meta = schedule(dg, ctx, num_sms)
    return dg.fp8_paged_mqa_logits(q, kv, weights, ctx, block_table, meta, width, False)


def indexer_logits(q: torch.Tensor, weights: torch.Tensor, cache: IndexerPagedCache, context_lens: torch.Tensor,
                   block_table: torch.Tensor) -> torch.Tensor:
    """fp32 [T, P*64] per dsv4hal.ops.indexer_logits (a view of DeepGEMM's 256-aligned logits buffer)."""
    import torch

    from dsv4hal.errors import InvalidArgumentError
    from dsv4hal.formats.indexer_cache import PAGE_SIZE
    from dsv4hal.kernels.triton.indexer_logits import mask_tail_

    t, p = block_table.shape
    width = p * PAGE_SIZE
    if t == 0 or p == 0 or cache.num_pages == 0:  # nothing addressable: DeepGEMM's TMA needs a non-empty cache
        return torch.full((t, width), float("-inf"), dtype=torch.float32, device=q.device)
    if cache.data.data_ptr() % TMA_ALIGN:
        raise InvalidArgumentError(
            "indexer_logits", "cache.data", f"a {TMA_ALIGN}-byte aligned base address (DeepGEMM reads it with TMA)",
            f"address {cache.data.data_ptr():#x}", remedy="allocate the cache with IndexerPagedCache.empty or "
            "slice it at page boundaries of a 16-byte aligned pool")
    dg = _deep_gemm()
    kv = fused_cache_view(cache)
    q4 = _aligned(q.contiguous()).view(t, 1, q.shape[1], q.shape[2])
    w = _aligned(weights.contiguous())
    ctx = context_lens.reshape(t, 1).contiguous()
    table = block_table if block_table.stride(1) == 1 else block_table.contiguous()
    if t <= MAX_TOKENS:
        logits = _chunk(dg, q4, kv, w, ctx, table, width)
    else:  # the schedule kernel holds at most MAX_TOKENS lengths in shared memory
        logits = torch.empty(t, width, dtype=torch.float32, device=q.device)
        for s in range(0, t, MAX_TOKENS):
            e = min(s + MAX_TOKENS, t)
            logits[s:e] = _chunk(dg, q4[s:e], kv, _aligned(w[s:e]), ctx[s:e], table[s:e], width)
    return mask_tail_(logits, context_lens)
