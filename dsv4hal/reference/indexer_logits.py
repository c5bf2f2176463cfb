"""Pure-PyTorch C4 indexer logits over the paged FP8 indexer cache (spec 4.2 step 5, FP8 path), and the query
preparation before it (indexer_q_prep, steps 2-3: RoPE, Hadamard, per-head FP8 quantization, weight folding).

The DeepGEMM fp8_paged_mqa_logits contract: the fp8 values of q and k are widened exactly to fp32, the dot
products accumulate in fp32, the per-token key scale multiplies the dot product before the ReLU, and the
head weights (carrying the q scale and 128^-0.5 * 64^-0.5) combine the heads. Slots past a token's context
read -inf, and so do the 64 slots of a used block-table entry outside [0, pages) (unchecked mode: the block is
skipped, as in the Triton kernel). Vectorised over tokens, heads and context.
"""

from __future__ import annotations

import torch

from dsv4hal.formats.fp8 import fp8_dtype, fp8_to_float
from dsv4hal.formats.indexer_cache import INDEX_DIM, PAGE_SIZE, IndexerPagedCache, quantize_rows
from dsv4hal.ops.indexer_logits import F32_MAX, INDEX_HEADS, Q_PREP_SATURATION, WEIGHT_FOLD
from dsv4hal.reference.compress import hadamard_transform
from dsv4hal.reference.rope import apply_rope, table_rows


def gather_context(cache: IndexerPagedCache, block_table: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(k fp32 [T, P*64, 128], ks fp32 [T, P*64]) for every slot a token's block table names.

    Entries outside [0, pages) (an unused tail, or a bad entry) are clamped to a real page; the caller masks
    them (by context length and by present_slots), so their contents never reach the output."""
    pages = block_table.long().clamp(0, max(cache.num_pages - 1, 0))
    k = fp8_to_float(cache.values()[pages], cache.fp8).flatten(1, 2)  # [T, P, 64, 128] -> [T, P*64, 128]
    ks = cache.scales()[pages].flatten(1, 2)
    return k, ks


def indexer_logits(
    q: torch.Tensor,
    weights: torch.Tensor,
    cache: IndexerPagedCache,
    context_lens: torch.Tensor,
    block_table: torch.Tensor,
) -> torch.Tensor:
    """fp32 [T, P*64]: logit[t, j] = sum_h weights[t, h] * relu(<q[t, h], k_j> * ks_j), -inf for j >= ctx[t]."""
    t, p = block_table.shape
    if p == 0 or cache.num_pages == 0:  # nothing addressable: every entry is past the context
        return torch.full((t, p * PAGE_SIZE), float("-inf"), device=q.device)
    k, ks = gather_context(cache, block_table)
    dots = torch.einsum("thd,tjd->thj", q.float(), k)  # fp8 products are exact in fp32; sums accumulate in fp32
    scores = torch.relu(dots * ks[:, None, :])
    logits = torch.einsum("th,thj->tj", weights.float(), scores)
    j = torch.arange(p * PAGE_SIZE, device=q.device)
    absent = (j[None, :] >= context_lens.long()[:, None]) | ~present_slots(block_table, cache.num_pages)
    return logits.masked_fill(absent, float("-inf"))


def present_slots(block_table: torch.Tensor, num_pages: int) -> torch.Tensor:
    """bool [T, P*64]: the slot's block-table entry names a page of the cache."""
    present = (block_table >= 0) & (block_table < num_pages)
    return present.repeat_interleave(PAGE_SIZE, dim=1)


def indexer_q_prep(q: torch.Tensor, weights: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                   positions: torch.Tensor, fp8: str = "e4m3fn") -> tuple[torch.Tensor, torch.Tensor]:
    """q [T, 64, 128] -> (RoPE'd, Hadamard-transformed, per-head FP8-quantized q; weights * fold * q scale).
    Positions outside the table are clamped into it; the rotated head saturates at +-Q_PREP_SATURATION and the
    weights at the fp32 max, so finite inputs give finite outputs (the kernel does the same, bit for bit)."""
    t = q.shape[0]
    cos_rows, sin_rows = table_rows(cos, sin, positions)
    rotated = apply_rope(q.float(), cos_rows[:, None], sin_rows[:, None]).clamp(-Q_PREP_SATURATION, Q_PREP_SATURATION)
    h = hadamard_transform(rotated)
    raw, qs = quantize_rows(h.reshape(-1, INDEX_DIM), fp8)  # scale max(amax, 1e-4) / FP8_MAX, an IEEE division
    q_fp8 = raw.view(fp8_dtype(fp8)).view(t, INDEX_HEADS, INDEX_DIM)
    return q_fp8, (weights.float() * WEIGHT_FOLD * qs.view(t, INDEX_HEADS)).clamp(-F32_MAX, F32_MAX)
