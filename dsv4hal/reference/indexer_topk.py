"""Reference indexer top-k with the length semantics and the page transform (spec 4.3)."""

from __future__ import annotations

import torch


def page_transform(raw: torch.Tensor, page_table: torch.Tensor, page_size: int = 64) -> torch.Tensor:
    """raw compressed positions -> slots of the paged pool; -1 stays -1, and so does a position whose page is
    past the table (an input checked mode refuses)."""
    if page_table.shape[1] == 0:
        return torch.full_like(raw, -1, dtype=torch.int32)
    safe = raw.clamp(min=0).long()
    page_idx = safe // page_size
    page = torch.gather(page_table.long(), 1, page_idx.clamp(max=page_table.shape[1] - 1))
    slots = page * page_size + safe % page_size
    inside = (raw >= 0) & (page_idx < page_table.shape[1])
    return torch.where(inside, slots, torch.full_like(slots, -1)).to(torch.int32)


def indexer_topk(scores: torch.Tensor, lengths: torch.Tensor, k: int, page_table: torch.Tensor | None = None,
                 page_size: int = 64) -> tuple[torch.Tensor, torch.Tensor | None]:
    b, s = scores.shape
    n = lengths.long()[:, None]
    cols = torch.arange(max(s, k), device=scores.device)
    masked = torch.full((b, max(s, k)), float("-inf"), device=scores.device, dtype=torch.float32)
    masked[:, :s] = scores.float()
    masked = masked.masked_fill(cols[None, :] >= n, float("-inf"))
    top = masked.topk(k, dim=1, sorted=False).indices
    ascending = torch.where(cols[None, :k] < n, cols[None, :k], torch.full_like(cols[None, :k], -1))
    raw = torch.where(n <= k, ascending.expand(b, k), top).to(torch.int32)
    pages = page_transform(raw, page_table, page_size) if page_table is not None else None
    return raw, pages
