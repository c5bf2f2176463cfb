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
Unchecked, out-of-range indices stay inside the buffers (reference and portable kernel alike):
    block_table: a used entry outside [0, cache pages) (-1 = unused entry, any other negative, pages or more)
        reads no page: its block's 64 logits are -inf, as positions not present (indexer_topk ranks -inf below
        every finite score; checked indexer_topk refuses -inf within a row's length, as checked indexer_logits
        refuses the table).
    context_lens: a negative length scores nothing (all -inf); one past P*64 scores all P*64 entries.

indexer_q_prep(q, weights, cos, sin, positions, fp8="e4m3fn") -> (q_fp8 [T, 64, 128], weights fp32 [T, 64])
    What indexer_logits takes, from the indexer's two projections (spec 4.2 steps 2-3; SGLang's
    fused_q_indexer_rope_hadamard_quant with the weight folding):
    q: bf16 or fp32 [T, 64, 128] contiguous, q_lora @ wq_b_idx per head; weights: bf16 or fp32 [T, 64], x @
        weights_proj^T; cos, sin: fp32 [max_pos, 32], the layer's RoPE table; positions: int32 [T] < max_pos;
        fp8: the indexer cache's flavour, "e4m3fn" or "e4m3fnuz".
    In fp32: RoPE on the last 64 dims of each head (interleaved pairs, the references' rope.apply_rope) at
    positions[t], then the Walsh-Hadamard transform over the 128 dims (Sylvester order, scaled by 128^-0.5);
    per (token, head) qs = max(amax, 1e-4) / FP8_MAX (448, or 240 for e4m3fnuz; an IEEE division);
    q_fp8 = fp8(clamp(q / qs, +-FP8_MAX)) to nearest even; weights_out = weights * 128^-0.5 * 64^-0.5 * qs.
    Saturation: the rotated head is clamped to +-2^120 (Q_PREP_SATURATION) before the Hadamard transform, so
    that its sums stay finite, and weights_out to the fp32 max: finite q and weights, even near the float max,
    give finite outputs (codes at +-FP8_MAX) for a RoPE table within [-1, 1]. No real input reaches either bound.
    Checked mode reads positions (in [0, max_pos)) and the float inputs (finite).
    Unchecked, positions outside [0, max_pos) (negative, max_pos or more, up to int32 max) are clamped to 0 or
    max_pos - 1 (reference and portable kernel alike): never a read outside cos/sin. An empty table rotates by
    nothing.
"""

from __future__ import annotations

import torch

from dsv4hal.checks import check_alloc, check_choice, check_finite, check_same_device, check_tensor, describe
from dsv4hal.errors import InvalidArgumentError
from dsv4hal.formats.fp8 import FP8_FLAVORS, fp8_dtype
from dsv4hal.formats.indexer_cache import INDEX_DIM, PAGE_SIZE, IndexerPagedCache
from dsv4hal.ops.signatures import define

OP = "indexer_logits"
Q_PREP_OP = "indexer_q_prep"
INDEX_HEADS = 64
WEIGHT_FOLD = INDEX_DIM**-0.5 * INDEX_HEADS**-0.5  # 128^-0.5 * 64^-0.5, folded into the head weights (spec 4.2)
ROPE_PAIRS = 32  # RoPE on the last 64 dims of a head: 32 (re, im) pairs
# indexer_q_prep saturates the rotated head at +-2^120 before the Hadamard transform: its sums of 128 terms then stay
# below 2^127 < fp32 max (finite inputs near the float max give finite codes), far above any real query
Q_PREP_SATURATION = 2.0**120
F32_MAX = torch.finfo(torch.float32).max  # the folded weights saturate here instead of overflowing to inf


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
    # fp32 [T, P*64]: a block table expanded to many pages (stride 0) is small, its output is not
    check_alloc(OP, "block_table (output size)", t * block_table.shape[1] * PAGE_SIZE * 4, dev)
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


def fake(q, weights, cache, context_lens, block_table) -> torch.Tensor:  # noqa: ANN001
    """The output's shape and dtype (under torch.compile)."""
    return weights.new_empty(q.shape[0], block_table.shape[1] * PAGE_SIZE)


@define(validate=validate, case=case, fake=fake)
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
            ceil(ctx / 64) are never read. Unchecked, a used entry outside [0, cache pages) (-1 included) reads
            no page: that block's 64 logits are -inf.

    Returns:
        (T, P * 64), torch.float32: sum_h weights[t, h] * relu(<q[t, h], k_j> * ks_j) for j < context_lens[t],
        -inf beyond; fp32 accumulation.

    Rejected (InvalidArgumentError): other dtypes, shapes or devices. Checked mode also refuses context lengths
    outside [0, P * 64], used block-table entries outside the cache, and non-finite q or weights.
    """


def validate_q_prep(q: object, weights: object, cos: object, sin: object, positions: object, fp8: object = "e4m3fn",
                    *, checked: bool = False) -> None:
    """Raise InvalidArgumentError unless the arguments meet the indexer_q_prep contract (module docstring)."""
    op = Q_PREP_OP
    q = check_tensor(op, "q", q, dtype=(torch.bfloat16, torch.float32), shape=(None, INDEX_HEADS, INDEX_DIM),
                     contiguous=True)
    t = q.shape[0]
    tensors = {
        "weights": check_tensor(op, "weights", weights, dtype=(torch.float32, torch.bfloat16),
                                shape=(t, INDEX_HEADS), unit_stride=True),
        "cos": check_tensor(op, "cos", cos, dtype=torch.float32, shape=(None, ROPE_PAIRS), unit_stride=True),
        "sin": check_tensor(op, "sin", sin, dtype=torch.float32, shape=(None, ROPE_PAIRS), unit_stride=True),
        "positions": check_tensor(op, "positions", positions, dtype=torch.int32, shape=(t,), contiguous=True),
    }
    if tensors["sin"].shape != tensors["cos"].shape:
        raise InvalidArgumentError(op, "sin", f"the shape of cos {tuple(tensors['cos'].shape)}", describe(sin))
    check_same_device(op, tensors, q.device, "q")
    check_choice(op, "fp8", fp8, FP8_FLAVORS)
    if checked:
        pos, max_pos = tensors["positions"], tensors["cos"].shape[0]
        if t and bool(((pos < 0) | (pos >= max_pos)).any()):
            raise InvalidArgumentError(op, "positions", f"values in [0, {max_pos}) (the RoPE table)",
                                       f"{int(pos.min())}...{int(pos.max())}",
                                       remedy="build the table with max_pos beyond the longest request")
        check_finite(op, "q", q)
        for name in ("weights", "cos", "sin"):
            check_finite(op, name, tensors[name])


def case_q_prep(q: torch.Tensor, weights: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor,
                fp8: str = "e4m3fn") -> dict[str, object]:
    """Hashable features for kernel selection: the FP8 flavour written and the dtype read."""
    return {"fp8": fp8, "dtype": str(q.dtype).removeprefix("torch.")}


def fake_q_prep(q, weights, cos, sin, positions, fp8="e4m3fn") -> tuple[torch.Tensor, torch.Tensor]:  # noqa: ANN001
    """The outputs' shapes and dtypes (under torch.compile)."""
    return q.new_empty(q.shape, dtype=fp8_dtype(fp8)), q.new_empty(q.shape[:2], dtype=torch.float32)


@define(validate=validate_q_prep, case=case_q_prep, fake=fake_q_prep)
def indexer_q_prep(q: torch.Tensor, weights: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                   positions: torch.Tensor, fp8: str = "e4m3fn") -> tuple[torch.Tensor, torch.Tensor]:
    """The lightning indexer's query preparation: RoPE, Hadamard and per-head FP8 quantization of q, and the q
    scale folded into the head weights (spec 4.2 steps 2-3), so that the outputs go to indexer_logits as they are.

    Arguments:
        q: (T, 64, 128), torch.bfloat16 or torch.float32, contiguous: q_lora @ wq_b_idx, per head.
        weights: (T, 64), torch.float32 or torch.bfloat16, unit stride along heads: x @ weights_proj^T.
        cos: (max_pos, 32), torch.float32: the layer's RoPE table (YaRN or not is the caller's choice).
        sin: (max_pos, 32), torch.float32: same shape as cos.
        positions: (T,), torch.int32: each token's position, < max_pos. Unchecked, one outside [0, max_pos) is
            clamped to 0 or max_pos - 1.
        fp8: "e4m3fn" or "e4m3fnuz": the FP8 flavour of the indexer cache the logits will read.

    Returns:
        q_fp8: (T, 64, 128), float8_e4m3fn or float8_e4m3fnuz: fp8(clamp(h / qs, +-FP8_MAX)), h the head after
            RoPE on its last 64 dims at positions[t] and the Walsh-Hadamard transform (scaled 128^-0.5), qs =
            max(amax(h), 1e-4) / FP8_MAX per (token, head).
        weights: (T, 64), torch.float32: weights * 128^-0.5 * 64^-0.5 * qs, saturated at the fp32 max (the
            rotated head saturates at +-2^120 before the transform: finite inputs give finite outputs).

    Rejected (InvalidArgumentError): other dtypes, shapes, layouts or devices, an unknown fp8 flavour. Checked
    mode also refuses positions outside the RoPE table and non-finite q, weights, cos or sin.
    """
