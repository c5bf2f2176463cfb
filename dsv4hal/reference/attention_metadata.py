"""Reference build_attention_metadata (spec 3.1), vectorised PyTorch that writes into `out` in place
(no host sync, so it can be captured in a CUDA graph as well).

Inputs checked mode refuses (a position past the page table, a negative page id, a window slot past
full_to_swa) never index outside a tensor here: such an SWA entry is -1, such a C128 entry -1 and such an
output location 0 (the dummy slot), as in the portable kernel. Any negative position gives the row of -1 (an
unused row: lengths 0, or 1 where a length is at least 1)."""

from __future__ import annotations

import torch

from dsv4hal.ops.attention_metadata import PAGE, WINDOW, AttentionMetadata


def _page_of(page_table: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """Page id of position p (p >= 0, shape [T, n]) of each row, or -1 when p's page is past the table."""
    t, pages = page_table.shape
    idx = p // PAGE
    if pages == 0:
        return torch.full_like(idx, -1)
    got = torch.gather(page_table.long(), 1, idx.clamp(max=pages - 1))
    return torch.where(idx < pages, got, -1)


def build_attention_metadata(positions: torch.Tensor, page_table: torch.Tensor, full_to_swa: torch.Tensor,
                             index_topk: int = 512, out: AttentionMetadata | None = None) -> AttentionMetadata:
    t, pages = page_table.shape
    m = out if out is not None else AttentionMetadata.empty(t, pages, positions.device)
    pos = positions.long()
    length = (pos + 1).clamp(min=0)  # any negative position is an unused row, as -1
    back = pos[:, None] - torch.arange(WINDOW, device=pos.device)[None, :]
    bs = back.clamp(min=0)
    page = _page_of(page_table, bs)
    slot = page * PAGE + bs % PAGE
    s = full_to_swa.shape[0]
    inside = (back >= 0) & (page >= 0) & (slot < s)
    # one extra -1 entry stands in for every slot outside full_to_swa (an empty one included)
    f2s = torch.cat([full_to_swa.long(), torch.full((1,), -1, dtype=torch.long, device=full_to_swa.device)])
    m.swa_indices.copy_(f2s[torch.where(inside, slot, s)])
    m.swa_lengths.copy_(length.clamp(max=WINDOW))
    m.c4_lengths_raw.copy_(length // 4)
    m.c4_lengths.copy_((length // 4).clamp(min=1, max=index_topk))
    j = torch.arange(m.c128_indices.shape[1], device=pos.device)
    if pages:
        c128_page = torch.gather(page_table.long(), 1, (j // 2).clamp(max=pages - 1).expand(t, -1))
    else:
        c128_page = torch.zeros(t, j.shape[0], dtype=torch.long, device=pos.device)
    used = (j[None, :] < (length // 128)[:, None]) & (j[None, :] // 2 < pages)
    m.c128_indices.copy_(torch.where(used, c128_page * 2 + j % 2, -1))
    m.c128_lengths.copy_((length // 128).clamp(min=1))
    p0 = pos.clamp(min=0)[:, None]
    own_page = _page_of(page_table, p0)[:, 0]
    raw = own_page * PAGE + pos.clamp(min=0) % PAGE
    has_raw = (pos >= 0) & (own_page >= 0)
    m.c4_out_loc.copy_(torch.where((length % 4 == 0) & has_raw, raw // 4, 0))
    m.c128_out_loc.copy_(torch.where((length % 128 == 0) & has_raw, raw // 128, 0))
    return m
