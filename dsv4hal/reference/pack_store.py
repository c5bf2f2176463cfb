"""CPU reference kernels of the V4 pack-store and dequant-gather ops (contracts in dsv4hal.ops.pack_store).

Pure PyTorch on the byte model of dsv4hal.formats.v4_cache; they also run on CUDA tensors. Arguments are
validated by the dispatcher (validate_pack_store / validate_dequant_gather), not here.
"""

from __future__ import annotations

import torch

from dsv4hal.formats.v4_cache import (
    V4PagedCache,
    dequantize_records,
    in_cache,
    quantize_tokens,
    read_records,
    write_records,
)


def pack_store(k: torch.Tensor, loc: torch.Tensor, cache: V4PagedCache) -> None:
    """Quantize k [N,512] bf16 and write each row into cache slot loc[i] in place; loc = -1 skips the row
    (so does an invalid loc: another negative or one past the cache, which checked mode refuses)."""
    write_records(cache, loc, quantize_tokens(k, cache.fp8))


def dequant_gather(cache: V4PagedCache, loc: torch.Tensor) -> torch.Tensor:
    """Dequantized keys [M,512] bf16 of slots `loc`; rows with loc = -1 (or an invalid loc) are zero.

    An fp8 value times a power of two is exact in bf16, so the result is the stored value bit for bit."""
    keys = dequantize_records(read_records(cache, loc), cache.fp8)
    keys = keys.masked_fill((~in_cache(cache, loc)).unsqueeze(1), 0.0)
    return keys.to(torch.bfloat16)
