"""Contract of indexer_topk (spec 4.3, the "Lightning TopK" transform).

indexer_topk(scores, lengths, k, page_table=None, page_size=64) -> (raw, pages)
    scores      fp32 [B, S] with unit stride along S (the row stride is free)
    lengths     int32 [B] contiguous: n_b = number of candidates (compressed positions) of row b, n_b <= S
    k           512 or 1024 (an int)
    page_table  int32 [B, P] page ids of the request of row b (unit stride along P), or None (no page
                transform); page_size a power-of-two int
    returns     raw int32 [B, k]: n_b <= k -> 0..n_b-1 then -1 (scores ignored); n_b > k -> exactly the
                indices of the k largest scores among [0, n_b), in any order, ties at the threshold
                broken arbitrarily; pages int32 [B, k] = page_table[b, i // page_size] * page_size
                + i % page_size for raw i >= 0, -1 elsewhere (None when page_table is None).
Scores past a row's length are never read as candidates: any value there (garbage, 0, -inf as indexer_logits
writes, NaN) is ignored.
Checked mode reads the inputs: finite scores in each row's [0, n_b), lengths in [0, S], and for every row the
pages its candidates use (page_table[b, :ceil(n_b / page_size)]) present and >= 0, and no page id below -1 (a
page id is an index: -1 marks an unused table entry, which a used page cannot be; other negatives are invalid).
Unchecked, such inputs give unspecified indices, never a read outside the buffers.
"""

from __future__ import annotations

import torch

from dsv4hal.checks import check_alloc, check_choice, check_finite, check_page_table_rows, check_tensor, show
from dsv4hal.errors import InvalidArgumentError
from dsv4hal.ops.signatures import define

OP = "indexer_topk"
K_CHOICES = (512, 1024)


def validate(scores, lengths, k, page_table=None, page_size=64, *, checked: bool = False) -> None:  # noqa: ANN001
    scores = check_tensor(OP, "scores", scores, dtype=torch.float32, shape=(None, None))
    b, s = scores.shape
    if scores.stride(1) != 1:
        raise InvalidArgumentError(OP, "scores", "unit stride along candidates", f"stride {scores.stride()}")
    lengths = check_tensor(OP, "lengths", lengths, dtype=torch.int32, shape=(b,), device=scores.device,
                           contiguous=True)
    check_choice(OP, "k", k, K_CHOICES)
    if (not isinstance(page_size, int) or isinstance(page_size, bool) or page_size <= 0
            or page_size & (page_size - 1)):
        raise InvalidArgumentError(OP, "page_size", "a power-of-two int (64 for the C4 pool)", show(page_size))
    if page_table is not None:
        check_tensor(OP, "page_table", page_table, dtype=torch.int32, shape=(b, None), device=scores.device,
                     unit_stride=True)
    # raw and pages, plus the kernel's per-row state and histogram
    check_alloc(OP, "scores (output size)", b * (k * 4 * (1 if page_table is None else 2) + 16 + 1024),
                scores.device)
    if checked:
        if lengths.numel() and bool(((lengths < 0) | (lengths > s)).any()):
            raise InvalidArgumentError(OP, "lengths", f"values in [0, {s}] (the score width)",
                                       f"min {int(lengths.min())}, max {int(lengths.max())}")
        # a row's candidates only: past its length the indexer leaves -inf (or anything), which top-k ignores
        candidates = torch.arange(s, device=scores.device)[None, :] < lengths[:, None]
        check_finite(OP, "scores (within each row's length)", scores[candidates])
        if page_table is not None and lengths.numel():
            used = (lengths.long() + page_size - 1) // page_size  # pages each row's candidates use
            check_page_table_rows(OP, page_table, used, "a row's candidates use")


def case(scores, lengths, k, page_table=None, page_size=64) -> dict[str, object]:  # noqa: ANN001
    return {"k": int(k), "page_transform": page_table is not None,
            "size": "large" if scores.shape[1] > 16384 else "small"}


def fake(scores, lengths, k, page_table=None, page_size=64) -> tuple[torch.Tensor, torch.Tensor | None]:  # noqa: ANN001
    """The outputs' shapes and dtypes (under torch.compile)."""
    raw = scores.new_empty(scores.shape[0], k, dtype=torch.int32)
    return raw, None if page_table is None else raw.new_empty(raw.shape)


@define(validate=validate, case=case, fake=fake, none_outputs={1: "page_table"})
def indexer_topk(scores: torch.Tensor, lengths: torch.Tensor, k: int, page_table: torch.Tensor | None = None,
                 page_size: int = 64) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Top-k of the indexer's scores per row, with per-row lengths and the optional page transform (the
    "Lightning TopK" of spec 4.3).

    Arguments:
        scores: (B, S), torch.float32, unit stride along S (the row stride is free).
        lengths: (B,), torch.int32, contiguous: n_b candidates of row b, n_b <= S.
        k: 512 or 1024 (an int).
        page_table: (B, P), torch.int32, unit stride along P: the C4 pool pages of row b's request; or None.
        page_size: a power-of-two int (64 for the C4 pool).

    Returns:
        raw: (B, k), torch.int32. n_b <= k: 0..n_b-1 then -1 (scores ignored); n_b > k: the indices of the k
            largest scores among [0, n_b), any order, ties at the threshold broken arbitrarily.
        pages: (B, k), torch.int32, page_table[b, i // page_size] * page_size + i % page_size for raw i >= 0,
            -1 elsewhere; None when page_table is None.

    Rejected (InvalidArgumentError): other dtypes, shapes or devices, k not 512/1024, page_size not a power of
    two. Checked mode also refuses non-finite scores within a row's length (past it anything is ignored, such as
    indexer_logits' -inf), lengths outside [0, S], and a used page id < 0 or any page id < -1; unchecked, such
    inputs give unspecified indices, never an out-of-bounds read.
    """
