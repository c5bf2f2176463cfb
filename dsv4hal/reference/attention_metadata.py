"""Reference build_attention_metadata (spec 3.1), vectorised PyTorch that writes into `out` in place
(no host sync, so it can be captured in a CUDA graph as well)."""

from __future__ import annotations

import torch

from dsv4hal.ops.attention_metadata import PAGE, WINDOW, AttentionMetadata


def _loc(page_table: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """Full-pool slot of position p (p >= 0) of each row; p may have trailing dims."""
    rows = page_table.long()
    page = torch.gather(rows, 1, (p // PAGE).reshape(rows.shape[0], -1)).reshape(p.shape)
    return page * PAGE + p % PAGE


def build_attention_metadata(positions: torch.Tensor, page_table: torch.Tensor, full_to_swa: torch.Tensor,
                             index_topk: int = 512, out: AttentionMetadata | None = None) -> AttentionMetadata:
    t, pages = page_table.shape
    m = out if out is not None else AttentionMetadata.empty(t, pages, positions.device)
    pos = positions.long()
    length = pos + 1
    back = pos[:, None] - torch.arange(WINDOW, device=pos.device)[None, :]
    swa = full_to_swa.long()[_loc(page_table, back.clamp(min=0))]
    m.swa_indices.copy_(torch.where(back >= 0, swa, -1))
    m.swa_lengths.copy_(length.clamp(max=WINDOW))
    m.c4_lengths_raw.copy_(length // 4)
    m.c4_lengths.copy_((length // 4).clamp(min=1, max=index_topk))
    j = torch.arange(m.c128_indices.shape[1], device=pos.device)
    page = torch.gather(page_table.long(), 1, (j // 2).clamp(max=pages - 1).expand(t, -1))
    m.c128_indices.copy_(torch.where(j[None, :] < (length // 128)[:, None], page * 2 + j % 2, -1))
    m.c128_lengths.copy_((length // 128).clamp(min=1))
    raw = _loc(page_table, pos[:, None])[:, 0]
    m.c4_out_loc.copy_(torch.where(length % 4 == 0, raw // 4, 0))
    m.c128_out_loc.copy_(torch.where(length % 128 == 0, raw // 128, 0))
    return m
