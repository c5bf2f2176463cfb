"""Contracts of the sparse attention ops (spec 3.2-3.4).

sparse_attention_decode(q, swa_cache, swa_indices, swa_lengths, sink, softmax_scale,
                        extra_cache=None, extra_indices=None, extra_lengths=None) -> (out, lse)
    q            bf16 [T, h_q, 512] contiguous, h_q in {64, 128}; every query token is its own row (s_q = 1)
    swa_cache    V4PagedCache, page 256 (the SWA pool)
    swa_indices  int32 [T, W] slots of swa_cache, newest first; W % 64 == 0; unit stride along W (the row
                 stride is free). -1 = unused; any other negative is invalid (see below)
    swa_lengths  int32 [T] contiguous; entries k >= swa_lengths[t] are ignored even if valid
    sink         fp32 [h_q] contiguous, per-head attention sink logit (value vector 0)
    softmax_scale a positive finite float (not a bool)
    extra_*      the C4 (page 64) or C128 (page 2) cache of the layer, its indices [T, W_x] and lengths
    returns      out bf16 [T, h_q, 512] (V = K, all 512 dims), lse fp32 [T, h_q] (natural log, before the
                 sink; +inf for a row with no key)

sparse_attention_prefill(q, kv, indices, lengths, sink, softmax_scale) -> (out, lse)
    kv           bf16 [S, 512] contiguous workspace (dequantized cache rows); indices int32 [T, W] into kv
    same math and the same layout rules as decode.

Indices: -1 is an unused entry; any other negative, and any index past the cache (or kv), is invalid:
checked mode refuses it (InvalidArgumentError), unchecked mode leaves that entry's contribution unspecified
(the portable kernels and the reference skip it; FlashMLA does no bounds checks). Checked mode also refuses
lengths outside [0, W] and non-finite q, kv or sink.

Compress ratio is implied by the extra cache's page size (64 -> 4, 2 -> 128; none -> 0).
"""

from __future__ import annotations

import torch

from dsv4hal.checks import (
    check_alloc,
    check_finite,
    check_index_range,
    check_positive_float,
    check_tensor,
    describe,
)
from dsv4hal.errors import InvalidArgumentError
from dsv4hal.formats.v4_cache import HEAD_DIM, V4PagedCache
from dsv4hal.ops.buckets import DECODE_TOKEN_CLASSES
from dsv4hal.ops.signatures import define

H_Q_CHOICES = (64, 128)
INDEX_ALIGN = 64
RATIO_BY_EXTRA_PAGE = {64: 4, 2: 128}
SWA_PAGE_SIZE = 256

DECODE = "sparse_attention_decode"
PREFILL = "sparse_attention_prefill"


def _check_q(op: str, q: object) -> torch.Tensor:
    q = check_tensor(op, "q", q, dtype=torch.bfloat16, shape=(None, None, HEAD_DIM), contiguous=True)
    if q.shape[1] not in H_Q_CHOICES:
        raise InvalidArgumentError(op, "q", f"h_q in {H_Q_CHOICES} (pad heads to 64)", describe(q),
                                   remedy="zero-pad the per-rank heads to 64 as the model does")
    return q


def _check_indices(op: str, name: str, idx: object, t: int, dev: torch.device) -> torch.Tensor:
    idx = check_tensor(op, name, idx, dtype=torch.int32, shape=(t, None), device=dev, unit_stride=True)
    if idx.shape[1] % INDEX_ALIGN:
        raise InvalidArgumentError(op, name, f"width a multiple of {INDEX_ALIGN}", describe(idx),
                                   remedy="pad the last dimension with -1")
    return idx


def _check_lengths(op: str, name: str, lengths: object, t: int, width: int, dev: torch.device,
                   checked: bool) -> None:
    lengths = check_tensor(op, name, lengths, dtype=torch.int32, shape=(t,), device=dev, contiguous=True)
    if checked and lengths.numel() and bool(((lengths < 0) | (lengths > width)).any()):
        raise InvalidArgumentError(op, name, f"lengths in [0, {width}] (the index width)",
                                   f"min {int(lengths.min())}, max {int(lengths.max())}")


def _check_outputs(op: str, t: int, h: int, dev: torch.device) -> None:
    """out and lse, plus fp32 split-K partials of about the same size (the portable kernel's)."""
    check_alloc(op, "q (output size)", t * h * (HEAD_DIM * 2 + 4 + (HEAD_DIM + 2) * 4), dev)


def _check_cache(op: str, name: str, cache: object, dev: torch.device, pages: tuple[int, ...]) -> V4PagedCache:
    if not isinstance(cache, V4PagedCache):
        raise InvalidArgumentError(op, name, "a V4PagedCache", describe(cache),
                                   remedy="wrap the uint8 pool: V4PagedCache(data, page_size, fp8)")
    cache.validate(op, name)
    if cache.data.device != dev:
        raise InvalidArgumentError(op, name, f"a cache on {dev}", f"a cache on {cache.data.device}")
    if cache.page_size not in pages:
        raise InvalidArgumentError(op, name, f"page size in {pages}", f"page size {cache.page_size}",
                                   remedy="SWA pools use 256-token pages, C4 pools 64, C128 pools 2")
    return cache


def validate_decode(q, swa_cache, swa_indices, swa_lengths, sink, softmax_scale, extra_cache=None,  # noqa: ANN001
                    extra_indices=None, extra_lengths=None, *, checked: bool = False) -> None:
    op = DECODE
    q = _check_q(op, q)
    t, h, dev = q.shape[0], q.shape[1], q.device
    swa = _check_cache(op, "swa_cache", swa_cache, dev, (SWA_PAGE_SIZE,))
    idx = _check_indices(op, "swa_indices", swa_indices, t, dev)
    _check_lengths(op, "swa_lengths", swa_lengths, t, idx.shape[1], dev, checked)
    check_tensor(op, "sink", sink, dtype=torch.float32, shape=(h,), device=dev, contiguous=True)
    check_positive_float(op, "softmax_scale", softmax_scale)
    _check_outputs(op, t, h, dev)
    given = [x is not None for x in (extra_cache, extra_indices, extra_lengths)]
    if any(given) and not all(given):
        raise InvalidArgumentError(op, "extra_cache/extra_indices/extra_lengths", "all three or none",
                                   f"only {sum(given)} of them")
    if checked:
        check_finite(op, "q", q)
        check_finite(op, "sink", sink)
        check_index_range(op, "swa_indices", idx, swa.num_slots)
    if extra_cache is None:
        return
    extra = _check_cache(op, "extra_cache", extra_cache, dev, tuple(RATIO_BY_EXTRA_PAGE))
    if extra.fp8 != swa.fp8:
        raise InvalidArgumentError(op, "extra_cache", f"the same FP8 flavour as swa_cache ({swa.fp8})", extra.fp8)
    xidx = _check_indices(op, "extra_indices", extra_indices, t, dev)
    _check_lengths(op, "extra_lengths", extra_lengths, t, xidx.shape[1], dev, checked)
    if checked:
        check_index_range(op, "extra_indices", xidx, extra.num_slots)


# Decode shape classes, the buckets `dsv4hal tune` measures (dsv4hal.ops.buckets). On the H200 the portable
# Triton decode beats FlashMLA at T = 1 up to 1024 extra entries and loses at 8192
# (bench/results/h200/bench-attention.json): the extra-width classes split there. Exact widths would not do: a C128
# width grows with the context (ceil(L / 128), padded to 64), so a lock keyed on it would miss most real calls.
EXTRA_SHORT_MAX = 1024
# The token classes split at this many query rows, so a lock can choose for small batches apart: on the H100 at 64
# rows the Triton decode beats FlashMLA over the SWA window alone (20.1 against 38.5 us, random keys;
# bench/results/h100/tune-triton-attention.json) and loses over 1024 extra keys; at 1024 rows it loses everywhere
# (bench/results/h100/bench-attention.json).
DECODE_BATCH_MAX = 64


def _token_class_index(num_tokens: int) -> int:
    return (num_tokens > 1) + (num_tokens > DECODE_BATCH_MAX)


def decode_token_class(num_tokens: int) -> str:
    return DECODE_TOKEN_CLASSES[_token_class_index(num_tokens)]


def extra_width_class(width: int | None) -> str | None:
    return None if width is None else ("short" if width <= EXTRA_SHORT_MAX else "long")


def key_decode(q, swa_cache, swa_indices, swa_lengths, sink, softmax_scale, extra_cache=None,  # noqa: ANN001
               extra_indices=None, extra_lengths=None) -> tuple:
    """Everything the case reads, as one flat tuple: a bound call without validation finds its kernel by it
    (~1 us less than building the case and its key). The case is computed from it, so they cannot disagree."""
    shape = q.shape
    return (_token_class_index(shape[0]), shape[1], swa_cache.fp8, swa_cache.page_size,
            None if extra_cache is None else extra_cache.page_size,
            None if extra_indices is None else extra_indices.shape[1])


def _case_of_key(key: tuple) -> dict[str, object]:
    tokens, h_q, fp8, swa_page, extra_page, width = key
    width = None if width is None else int(width)
    return {"h_q": int(h_q), "compress_ratio": 0 if extra_page is None else RATIO_BY_EXTRA_PAGE.get(extra_page, -1),
            "fp8": fp8, "swa_page_size": swa_page, "extra_page_size": extra_page,
            "extra_width": width, "extra_class": extra_width_class(width), "tokens": DECODE_TOKEN_CLASSES[tokens]}


def case_decode(q, swa_cache, swa_indices, swa_lengths, sink, softmax_scale, extra_cache=None,  # noqa: ANN001
                extra_indices=None, extra_lengths=None) -> dict[str, object]:
    return _case_of_key(key_decode(q, swa_cache, swa_indices, swa_lengths, sink, softmax_scale, extra_cache,
                                   extra_indices, extra_lengths))


def validate_prefill(q, kv, indices, lengths, sink, softmax_scale, *, checked: bool = False) -> None:  # noqa: ANN001
    op = PREFILL
    q = _check_q(op, q)
    t, h, dev = q.shape[0], q.shape[1], q.device
    kv = check_tensor(op, "kv", kv, dtype=torch.bfloat16, shape=(None, HEAD_DIM), device=dev, contiguous=True)
    idx = _check_indices(op, "indices", indices, t, dev)
    _check_lengths(op, "lengths", lengths, t, idx.shape[1], dev, checked)
    check_tensor(op, "sink", sink, dtype=torch.float32, shape=(h,), device=dev, contiguous=True)
    check_positive_float(op, "softmax_scale", softmax_scale)
    _check_outputs(op, t, h, dev)
    if checked:
        check_finite(op, "q", q)
        check_finite(op, "kv", kv)
        check_finite(op, "sink", sink)
        check_index_range(op, "indices", idx, kv.shape[0])


def case_prefill(q, kv, indices, lengths, sink, softmax_scale) -> dict[str, object]:  # noqa: ANN001
    return {"h_q": int(q.shape[1]), "width": int(indices.shape[1])}


def _fake_outputs(q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return q.new_empty(q.shape), q.new_empty(q.shape[0], q.shape[1], dtype=torch.float32)


def fake_decode(q, swa_cache, swa_indices, swa_lengths, sink, softmax_scale, extra_cache=None,  # noqa: ANN001
                extra_indices=None, extra_lengths=None) -> tuple[torch.Tensor, torch.Tensor]:  # noqa: ANN001
    """The outputs' shapes and dtypes (under torch.compile)."""
    return _fake_outputs(q)


def fake_prefill(q, kv, indices, lengths, sink, softmax_scale) -> tuple[torch.Tensor, torch.Tensor]:  # noqa: ANN001
    """The outputs' shapes and dtypes (under torch.compile)."""
    return _fake_outputs(q)


@define(validate=validate_decode, case=case_decode, key=key_decode, fake=fake_decode)
def sparse_attention_decode(q: torch.Tensor, swa_cache: V4PagedCache, swa_indices: torch.Tensor,
                            swa_lengths: torch.Tensor, sink: torch.Tensor, softmax_scale: float,
                            extra_cache: V4PagedCache | None = None, extra_indices: torch.Tensor | None = None,
                            extra_lengths: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Sparse MQA decode over the FP8 V4 cache: the SWA window plus an optional C4/C128 compressed cache, with an
    attention sink. V = K (all 512 dims). Every query token is its own row (s_q = 1).

    Arguments:
        q: (T, h_q, 512), torch.bfloat16, contiguous; h_q in {64, 128} (pad heads to 64).
        swa_cache: V4PagedCache with 256-token pages (the SWA pool), on q's device.
        swa_indices: (T, W), torch.int32, unit stride along W; W % 64 == 0. Slots of swa_cache, newest first;
            -1 = unused.
        swa_lengths: (T,), torch.int32, contiguous; entries k >= swa_lengths[t] are ignored.
        sink: (h_q,), torch.float32, contiguous. Per-head sink logit (value vector 0).
        softmax_scale: a positive finite float (not a bool).
        extra_cache: the layer's C4 (page 64, ratio 4) or C128 (page 2, ratio 128) V4PagedCache, same FP8
            flavour as swa_cache; or None (SWA-only layer).
        extra_indices: (T, W_x), torch.int32, as swa_indices, into extra_cache; None iff extra_cache is None.
        extra_lengths: (T,), torch.int32; None iff extra_cache is None.

    Returns:
        out: (T, h_q, 512), torch.bfloat16.
        lse: (T, h_q), torch.float32, natural log before the sink; +inf for a row with no key.

    Rejected (InvalidArgumentError): other dtypes, shapes, page sizes or devices, strided views, some but not
    all of the extra_* arguments. Checked mode also refuses indices < -1 or past their cache, lengths outside
    [0, W] and non-finite q or sink; unchecked, such entries' contributions are unspecified.
    """


@define(validate=validate_prefill, case=case_prefill, fake=fake_prefill)
def sparse_attention_prefill(q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor, lengths: torch.Tensor,
                             sink: torch.Tensor, softmax_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Sparse MQA over a bf16 workspace of dequantized cache rows (dequant_gather), by indices, with a sink.

    Arguments:
        q: (T, h_q, 512), torch.bfloat16, contiguous; h_q in {64, 128}.
        kv: (S, 512), torch.bfloat16, contiguous; the workspace.
        indices: (T, W), torch.int32, unit stride along W, W % 64 == 0; rows of kv, -1 = unused.
        lengths: (T,), torch.int32, contiguous; entries k >= lengths[t] are ignored.
        sink: (h_q,), torch.float32, contiguous.
        softmax_scale: a positive finite float.

    Returns:
        out: (T, h_q, 512), torch.bfloat16; lse: (T, h_q), torch.float32 (as sparse_attention_decode).

    Rejected (InvalidArgumentError): as sparse_attention_decode; checked mode also reads kv (finite).
    """
