"""Pure-PyTorch `indexer_store` (contract in dsv4hal.ops.indexer_store): the byte model of
dsv4hal.formats.indexer_cache (quantize_rows, then write_rows' sync-free skip). Also runs on CUDA tensors."""

from __future__ import annotations

import torch

from dsv4hal.formats.indexer_cache import IndexerPagedCache, quantize_rows, write_rows


def indexer_store(k: torch.Tensor, loc: torch.Tensor, cache: IndexerPagedCache, scale: str = "amax") -> None:
    """Quantize k [N, 128] and write row i to slot loc[i] in place; loc -1 (or any loc outside the cache) skips."""
    raw, s = quantize_rows(k, cache.fp8, scale)
    write_rows(cache, loc, raw, s)
