"""The C4 indexer K cache, FP8 path (spec 2.3): 132 bytes a token, pages of 64 tokens.

Page layout (8448 bytes, no padding): [64 x 128 FP8 values][64 x fp32 scales]. Token `off` of a page has
its values at bytes off*128 .. off*128+127 and its scale at 64*128 + off*4 (little-endian fp32).
Scale = max(amax, 1e-4) / FP8_MAX as a plain fp32 (not a power of two), one per token (block 128);
values = fp8(k / scale). Slot `loc` lives at page loc // 64, offset loc % 64.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import torch

from dsv4hal.formats.fp8 import FP8_FLAVORS, FP8_MAX, FP8Flavor, float_to_fp8_bytes, fp8_dtype, fp8_to_float
from dsv4hal.ops.checks import check_choice, check_tensor

INDEX_DIM = 128
PAGE_SIZE = 64
SCALE_BYTES = 4
TOKEN_BYTES = INDEX_DIM + SCALE_BYTES  # 132
SCALE_OFFSET = PAGE_SIZE * INDEX_DIM  # 8192: scales follow all values of the page
PAGE_BYTES = PAGE_SIZE * TOKEN_BYTES  # 8448
AMAX_FLOOR = 1e-4

# Scales are reinterpreted with Tensor.view(float32), which uses host byte order; the format is little-endian.
assert sys.byteorder == "little", "the indexer cache format is little-endian"


@dataclass
class IndexerPagedCache:
    """uint8 [num_pages, 8448] paged FP8 indexer cache of one layer."""

    data: torch.Tensor
    fp8: FP8Flavor = "e4m3fn"

    @classmethod
    def empty(
        cls, num_pages: int, fp8: FP8Flavor = "e4m3fn", device: torch.device | str = "cpu"
    ) -> IndexerPagedCache:
        """A zero-filled cache (zeros rather than garbage so unwritten slots are deterministic)."""
        fp8_dtype(fp8)  # rejects unknown flavours early
        return cls(torch.zeros(num_pages, PAGE_BYTES, dtype=torch.uint8, device=device), fp8)

    @property
    def num_pages(self) -> int:
        return self.data.shape[0]

    @property
    def num_slots(self) -> int:
        return self.num_pages * PAGE_SIZE

    def validate(self, op: str, name: str) -> None:
        """Raise InvalidArgumentError unless this is a well-formed cache (no value reads)."""
        check_tensor(op, f"{name}.data", self.data, dtype=torch.uint8, shape=(None, PAGE_BYTES), contiguous=True)
        check_choice(op, f"{name}.fp8", self.fp8, FP8_FLAVORS)

    def values(self) -> torch.Tensor:
        """uint8 [pages, 64, 128] view of the FP8 value bytes (shares storage)."""
        return self.data[:, :SCALE_OFFSET].unflatten(1, (PAGE_SIZE, INDEX_DIM))

    def scales(self) -> torch.Tensor:
        """float32 [pages, 64] view of the per-token scales (shares storage)."""
        return self.data[:, SCALE_OFFSET:].view(torch.float32)


def quantize_rows(k: torch.Tensor, fp8: FP8Flavor = "e4m3fn") -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 [N, 128] -> (uint8 FP8 bytes [N, 128], fp32 scale [N]) per the format above."""
    if k.dim() != 2 or k.shape[1] != INDEX_DIM:
        raise ValueError(f"quantize_rows expects [N, {INDEX_DIM}], got {tuple(k.shape)}")
    k = k.float()
    amax = k.abs().amax(dim=1).clamp_min(AMAX_FLOOR)
    # Divide by a tensor, not a Python float: CUDA turns division by a scalar into multiplication by its
    # rounded reciprocal, which changes the last bit of some scales and then the bytes.
    scale = amax / torch.full_like(amax, FP8_MAX[fp8])
    return float_to_fp8_bytes(k / scale[:, None], fp8), scale


def write_rows(cache: IndexerPagedCache, loc: torch.Tensor, raw: torch.Tensor, scale: torch.Tensor,
               scratch: int | None = None) -> None:
    """Scatter rows (bytes [N, 128], scale [N]) to slots loc [N]; rows with loc < 0 are skipped.

    Skipping selects rows by value, a host sync; with `scratch` (a slot nothing reads, e.g. in a null page)
    those rows are written there instead, with no sync (CUDA-graph safe)."""
    if loc.dim() != 1 or raw.shape != (loc.shape[0], INDEX_DIM) or scale.shape != loc.shape:
        shapes = f"loc {tuple(loc.shape)}, bytes {tuple(raw.shape)}, scale {tuple(scale.shape)}"
        raise ValueError(f"write_rows expects loc [N], bytes [N, {INDEX_DIM}], scale [N]; got {shapes}")
    if scratch is None:
        keep = loc >= 0
        loc, raw, scale = loc[keep], raw[keep], scale[keep]
    else:
        loc = torch.where(loc >= 0, loc, torch.full_like(loc, scratch))
    loc = loc.long()
    page, off = loc // PAGE_SIZE, loc % PAGE_SIZE
    cache.values()[page, off] = raw.to(torch.uint8)
    cache.scales()[page, off] = scale.to(torch.float32)


def read_rows(cache: IndexerPagedCache, loc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Slots loc [M] -> (FP8 values widened to fp32 [M, 128], fp32 scale [M]); loc < 0 reads as zeros."""
    valid = loc >= 0
    safe = torch.where(valid, loc, torch.zeros_like(loc)).long()
    page, off = safe // PAGE_SIZE, safe % PAGE_SIZE
    values = fp8_to_float(cache.values()[page, off], cache.fp8)
    scale = cache.scales()[page, off]
    # where, not a multiply: a never-written slot may hold NaN bytes, and NaN * 0 is NaN
    return torch.where(valid[:, None], values, 0.0), torch.where(valid, scale, 0.0)


def exact_dequant(k: torch.Tensor, fp8: FP8Flavor = "e4m3fn", dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """What the cache represents for fp32 keys k [N, 128]: fp8 value * scale, formed in `dtype`
    (float64 holds the product exactly). Computed from k, never from bytes read back from a cache."""
    raw, scale = quantize_rows(k, fp8)
    return fp8_to_float(raw, fp8).to(dtype) * scale.to(dtype)[:, None]
