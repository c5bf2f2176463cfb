"""The C4 indexer K cache, FP8 path (spec 2.3): 132 bytes a token, pages of 64 tokens.

Page layout (8448 bytes, no padding): [64 x 128 FP8 values][64 x fp32 scales]. Token `off` of a page has
its values at bytes off*128 .. off*128+127 and its scale at 64*128 + off*4 (little-endian fp32). This is
also DeepGEMM's fused paged-MQA-logits cache ([blocks, 64, 1, 132], SoA inside each block).
One scale per token (block 128), two writer rules (SCALE_MODES):
- "amax" (SGLang's writer, dsv4hal's default): scale = max(amax, 1e-4) / FP8_MAX, a plain fp32;
- "pow2" (vLLM's writer with ue8m0 scales): that quotient rounded up to a power of two, from its bits.
values = fp8(clamp(k / scale, +-FP8_MAX)), round to nearest even. Slot `loc` lives at page loc // 64, offset
loc % 64.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

import torch

from dsv4hal.checks import check_alloc, check_choice, check_count, check_device, check_tensor
from dsv4hal.errors import InvalidArgumentError
from dsv4hal.formats.cache_object import CacheObject
from dsv4hal.formats.fp8 import (
    FP8_FLAVORS,
    FP8Flavor,
    amax_scale,
    float_to_fp8_bytes,
    fp8_to_float,
    pow2_ceil_exponent,
)

INDEX_DIM = 128
PAGE_SIZE = 64
SCALE_BYTES = 4
TOKEN_BYTES = INDEX_DIM + SCALE_BYTES  # 132
SCALE_OFFSET = PAGE_SIZE * INDEX_DIM  # 8192: scales follow all values of the page
PAGE_BYTES = PAGE_SIZE * TOKEN_BYTES  # 8448
AMAX_FLOOR = 1e-4
SCALE_MODES = ("amax", "pow2")

# Scales are reinterpreted with Tensor.view(float32), which uses host byte order; the format is little-endian.
assert sys.byteorder == "little", "the indexer cache format is little-endian"


@dataclass
class IndexerPagedCache(CacheObject):
    """uint8 [num_pages, 8448] paged FP8 indexer cache of one layer."""

    data: torch.Tensor
    fp8: FP8Flavor = "e4m3fn"
    _memo_token: object | None = field(default=None, init=False, repr=False, compare=False)  # see CacheObject

    @classmethod
    def empty(
        cls, num_pages: int, fp8: FP8Flavor = "e4m3fn", device: torch.device | str = "cpu"
    ) -> IndexerPagedCache:
        """A zero-filled cache (zeros rather than garbage so unwritten slots are deterministic)."""
        op = "IndexerPagedCache.empty"
        num_pages = check_count(op, "num_pages", num_pages)
        check_choice(op, "fp8", fp8, FP8_FLAVORS)
        dev = check_device(op, "device", device)
        check_alloc(op, "num_pages (cache size)", num_pages * PAGE_BYTES, dev, kind="a cache")
        return cls(torch.zeros(num_pages, PAGE_BYTES, dtype=torch.uint8, device=dev), fp8)

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


def row_scales(amax: torch.Tensor, fp8: FP8Flavor = "e4m3fn", scale: str = "amax") -> torch.Tensor:
    """fp32 scale per row from its fp32 amax (before the 1e-4 floor) under the SCALE_MODES rule."""
    s = amax_scale(amax.float().clamp_min(AMAX_FLOOR), fp8)
    if scale == "pow2":  # 2**ceil(log2 s) from the bits: exact, unlike exp2(ceil(log2(s))) in floating point
        s = torch.ldexp(torch.ones_like(s), pow2_ceil_exponent(s))
    elif scale != "amax":
        raise InvalidArgumentError("row_scales", "scale", "an indexer scale mode: one of 'amax', 'pow2'", repr(scale))
    return s


def quantize_rows(k: torch.Tensor, fp8: FP8Flavor = "e4m3fn", scale: str = "amax") -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 [N, 128] -> (uint8 FP8 bytes [N, 128], fp32 scale [N]) per the format above."""
    check_tensor("quantize_rows", "k", k, shape=(None, INDEX_DIM))
    k = k.float()
    s = row_scales(k.abs().amax(dim=1), fp8, scale)
    return float_to_fp8_bytes(k / s[:, None], fp8), s


def write_rows(cache: IndexerPagedCache, loc: torch.Tensor, raw: torch.Tensor, scale: torch.Tensor,
               scratch: int | None = None) -> None:
    """Scatter rows (bytes [N, 128], scale [N]) to slots loc [N]; rows whose loc is not a slot of the cache
    (loc < 0, loc >= num_slots) are skipped, with no host sync (CUDA-graph safe). With `scratch` (a slot
    nothing reads) those rows are written there instead. Duplicate slots keep one of their rows."""
    if loc.dim() != 1 or raw.shape != (loc.shape[0], INDEX_DIM) or scale.shape != loc.shape:
        shapes = f"loc {tuple(loc.shape)}, bytes {tuple(raw.shape)}, scale {tuple(scale.shape)}"
        raise InvalidArgumentError("write_rows", "loc, raw, scale", f"loc [N], bytes [N, {INDEX_DIM}], scale [N]",
                                   shapes)
    if loc.shape[0] == 0 or cache.num_slots == 0:
        return
    loc = loc.long()
    keep = (loc >= 0) & (loc < cache.num_slots)
    raw, scale = raw.to(torch.uint8), scale.to(torch.float32)
    if scratch is not None:
        loc = torch.where(keep, loc, torch.full_like(loc, scratch))
    else:
        # Sync-free skip (no boolean selection): a skipped row rewrites the first kept row's slot with that
        # row's bytes; with no row kept, slot 0 is rewritten with its own bytes. 1-element index tensors, not
        # 0-dim ones, whose indexing would read them on the host.
        anchor = keep.to(torch.uint8).argmax().view(1)
        any_kept = keep.index_select(0, anchor)
        a_loc = torch.where(any_kept, loc.index_select(0, anchor), 0)
        a_raw = torch.where(any_kept[:, None], raw.index_select(0, anchor), cache.values()[0, :1])
        a_scale = torch.where(any_kept, scale.index_select(0, anchor), cache.scales()[0, :1])
        loc = torch.where(keep, loc, a_loc)
        raw = torch.where(keep[:, None], raw, a_raw)
        scale = torch.where(keep, scale, a_scale)
    page, off = loc // PAGE_SIZE, loc % PAGE_SIZE
    cache.values()[page, off] = raw
    cache.scales()[page, off] = scale


def read_rows(cache: IndexerPagedCache, loc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Slots loc [M] -> (FP8 values widened to fp32 [M, 128], fp32 scale [M]); loc < 0 reads as zeros."""
    valid = loc >= 0
    safe = torch.where(valid, loc, torch.zeros_like(loc)).long()
    page, off = safe // PAGE_SIZE, safe % PAGE_SIZE
    values = fp8_to_float(cache.values()[page, off], cache.fp8)
    scale = cache.scales()[page, off]
    # where, not a multiply: a never-written slot may hold NaN bytes, and NaN * 0 is NaN
    return torch.where(valid[:, None], values, 0.0), torch.where(valid, scale, 0.0)


def exact_dequant(k: torch.Tensor, fp8: FP8Flavor = "e4m3fn", dtype: torch.dtype = torch.float64,
                  scale: str = "amax") -> torch.Tensor:
    """What the cache represents for fp32 keys k [N, 128]: fp8 value * scale, formed in `dtype`
    (float64 holds the product exactly). Computed from k, never from bytes read back from a cache."""
    raw, s = quantize_rows(k, fp8, scale)
    return fp8_to_float(raw, fp8).to(dtype) * s.to(dtype)[:, None]
