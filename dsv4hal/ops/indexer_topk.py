"""Contract of indexer_topk (spec 4.3, the "Lightning TopK" transform).

indexer_topk(scores, lengths, k, page_table=None, page_size=64) -> (raw, pages)
    scores      fp32 [B, S] (row stride may be larger than S)
    lengths     int32 [B]: n_b = number of candidates (compressed positions) of row b, n_b <= S
    k           512 or 1024
    page_table  int32 [B, P] page ids of the request of row b, or None (no page transform)
    returns     raw int32 [B, k]: n_b <= k -> 0..n_b-1 then -1 (scores ignored); n_b > k -> exactly the
                indices of the k largest scores among [0, n_b), in any order, ties at the threshold
                broken arbitrarily; pages int32 [B, k] = page_table[b, i // page_size] * page_size
                + i % page_size for raw i >= 0, -1 elsewhere (None when page_table is None).
"""

from __future__ import annotations

import torch

from dsv4hal.errors import InvalidArgumentError
from dsv4hal.ops.checks import check_choice, check_finite, check_tensor, describe

OP = "indexer_topk"
K_CHOICES = (512, 1024)


def validate(scores, lengths, k, page_table=None, page_size=64, *, checked: bool = False) -> None:  # noqa: ANN001
    scores = check_tensor(OP, "scores", scores, dtype=torch.float32, shape=(None, None))
    b, s = scores.shape
    if scores.stride(1) != 1:
        raise InvalidArgumentError(OP, "scores", "unit stride along candidates", f"stride {scores.stride()}")
    lengths = check_tensor(OP, "lengths", lengths, dtype=torch.int32, shape=(b,), device=scores.device)
    check_choice(OP, "k", k, K_CHOICES)
    if not isinstance(page_size, int) or page_size <= 0 or page_size & (page_size - 1):
        raise InvalidArgumentError(OP, "page_size", "a power of two (64 for the C4 pool)", repr(page_size))
    if page_table is not None:
        check_tensor(OP, "page_table", page_table, dtype=torch.int32, shape=(b, None), device=scores.device)
    if checked:
        check_finite(OP, "scores", scores)
        if lengths.numel() and bool(((lengths < 0) | (lengths > s)).any()):
            raise InvalidArgumentError(OP, "lengths", f"values in [0, {s}] (the score width)",
                                       f"min {int(lengths.min())}, max {int(lengths.max())}")
        if page_table is not None and lengths.numel():
            need = int((lengths.max() + page_size - 1) // page_size)
            if need > page_table.shape[1]:
                raise InvalidArgumentError(OP, "page_table", f"at least {need} pages per row", describe(page_table))


def case(scores, lengths, k, page_table=None, page_size=64) -> dict[str, object]:  # noqa: ANN001
    return {"k": int(k), "page_transform": page_table is not None,
            "size": "large" if scores.shape[1] > 16384 else "small"}
