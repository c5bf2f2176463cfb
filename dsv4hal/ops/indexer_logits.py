"""Op contract: `indexer_logits` (spec 4.2 step 5, FP8 path; DeepGEMM fp8_paged_mqa_logits semantics).

indexer_logits(q, weights, cache, context_lens, block_table) -> fp32 [T, P*64]
    q: [T, 64, 128] in the cache's torch FP8 dtype (float8_e4m3fn or float8_e4m3fnuz), the rotated,
        Hadamard-transformed and per-(token, head) quantized index queries;
    weights: fp32 [T, 64] head weights with the q scale and 128^-0.5 * 64^-0.5 already folded in;
    cache: IndexerPagedCache (132-byte FP8 rows, pages of 64; dsv4hal.formats.indexer_cache);
    context_lens: int32 [T], the number of compressed entries token t sees (L_t // 4), 0 <= ctx <= P*64;
    block_table: int32 [T, P], the cache page of each 64-entry block of token t's compressed sequence.
    All on one device.
Output: logit[t, j] = sum_h weights[t, h] * relu(<q[t, h], k_j> * ks_j) for j < context_lens[t], where k_j
(fp8 values as float) and ks_j (fp32 scale) are the cache row at page block_table[t, j // 64], offset j % 64;
-inf for j >= context_lens[t]. Accumulation in fp32. Block-table entries past ceil(ctx / 64) are never read
and may hold anything (e.g. -1).
Checked mode reads context_lens, block_table and the float inputs (a device sync): 0 <= ctx <= P*64, every
used block-table entry in [0, cache pages), q and weights finite.
"""

from __future__ import annotations

import torch

from dsv4hal.errors import InvalidArgumentError
from dsv4hal.formats.fp8 import fp8_dtype
from dsv4hal.formats.indexer_cache import INDEX_DIM, PAGE_SIZE, IndexerPagedCache
from dsv4hal.ops.checks import check_finite, check_same_device, check_tensor, describe
from dsv4hal.ops.signatures import define

OP = "indexer_logits"
INDEX_HEADS = 64


def _check_cache(cache: object) -> IndexerPagedCache:
    if not isinstance(cache, IndexerPagedCache):
        raise InvalidArgumentError(OP, "cache", "an IndexerPagedCache", describe(cache))
    cache.validate(OP, "cache")
    return cache


def _check_context(context_lens: torch.Tensor, block_table: torch.Tensor, num_pages: int) -> None:
    """Checked mode: context lengths fit the block table, and every block a context uses names a real page."""
    ctx = context_lens.long()
    limit = block_table.shape[1] * PAGE_SIZE
    bad = (ctx < 0) | (ctx > limit)
    if bool(bad.any()):
        raise InvalidArgumentError(OP, "context_lens", f"values in [0, {limit}] (P*64)", f"{int(ctx[bad][0])}")
    used_blocks = (ctx + PAGE_SIZE - 1) // PAGE_SIZE
    used = torch.arange(block_table.shape[1], device=ctx.device)[None, :] < used_blocks[:, None]
    pages = block_table.long()
    bad = used & ((pages < 0) | (pages >= num_pages))
    if bool(bad.any()):
        raise InvalidArgumentError(
            OP, "block_table", f"pages in [0, {num_pages}) for every block inside the context",
            f"page {int(pages[bad][0])}", remedy="block_table[t, b] must name a cache page for b < ceil(ctx / 64)",
        )


def validate(
    q: object,
    weights: object,
    cache: object,
    context_lens: object,
    block_table: object,
    *,
    checked: bool = False,
) -> None:
    """Raise InvalidArgumentError unless the arguments meet the indexer_logits contract (module docstring)."""
    cache = _check_cache(cache)
    dev = cache.data.device
    q = check_tensor(OP, "q", q, dtype=fp8_dtype(cache.fp8), shape=(None, INDEX_HEADS, INDEX_DIM))
    t = q.shape[0]
    weights = check_tensor(OP, "weights", weights, dtype=torch.float32, shape=(t, INDEX_HEADS))
    context_lens = check_tensor(OP, "context_lens", context_lens, dtype=torch.int32, shape=(t,))
    block_table = check_tensor(OP, "block_table", block_table, dtype=torch.int32, shape=(t, None))
    check_same_device(OP, {"q": q, "weights": weights, "context_lens": context_lens, "block_table": block_table},
                      dev, "cache")
    if checked:
        _check_context(context_lens, block_table, cache.num_pages)
        check_finite(OP, "q", q)
        check_finite(OP, "weights", weights)


def case(
    q: torch.Tensor,
    weights: torch.Tensor,
    cache: IndexerPagedCache,
    context_lens: torch.Tensor,
    block_table: torch.Tensor,
) -> dict[str, object]:
    """Hashable features for kernel selection: the FP8 flavour of q and the cache."""
    return {"fp8": cache.fp8}


@define(validate=validate, case=case)
def indexer_logits(q: torch.Tensor, weights: torch.Tensor, cache: IndexerPagedCache, context_lens: torch.Tensor,
                   block_table: torch.Tensor) -> torch.Tensor:
    """Index scores of the lightning indexer over the FP8 indexer cache (DeepGEMM fp8_paged_mqa_logits).

    Arguments:
        q: (T, 64, 128), the cache's FP8 dtype (float8_e4m3fn or float8_e4m3fnuz): rotated, Hadamard-transformed,
            per-(token, head) quantized index queries.
        weights: (T, 64), torch.float32: head weights with the q scale and 128^-0.5 * 64^-0.5 folded in.
        cache: IndexerPagedCache.
        context_lens: (T,), torch.int32: compressed entries token t sees (L_t // 4), 0 <= ctx <= P * 64.
        block_table: (T, P), torch.int32: the cache page of each 64-entry block of token t; entries past
            ceil(ctx / 64) are never read.

    Returns:
        (T, P * 64), torch.float32: sum_h weights[t, h] * relu(<q[t, h], k_j> * ks_j) for j < context_lens[t],
        -inf beyond; fp32 accumulation.

    Rejected (InvalidArgumentError): other dtypes, shapes or devices. Checked mode also refuses context lengths
    outside [0, P * 64], used block-table entries outside the cache, and non-finite q or weights.
    """
