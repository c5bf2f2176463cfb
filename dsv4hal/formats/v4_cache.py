"""The 584-byte V4 paged KV record ("MODEL1_FP8Sparse", spec §2.1) and its quantizer (§2.2).

A page of P token slots is laid out as P 576-byte records (448 fp8 nope bytes, then 64 bf16 rope values),
followed by P 8-byte scale blocks (7 UE8M0 bytes and a pad byte that is never written), padded to a
multiple of 576 bytes. Location -> address: page = loc // P, offset = loc % P.

Everything here is pure PyTorch over index arithmetic on the flat byte buffer, so it runs unchanged on
any device and serves as the byte-level oracle for every platform's pack-store kernel.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from dsv4hal.checks import check_alloc, check_choice, check_count, check_device, describe
from dsv4hal.errors import InvalidArgumentError
from dsv4hal.formats.cache_object import CacheObject
from dsv4hal.formats.fp8 import (
    FP8_FLAVORS,
    FP8Flavor,
    amax_scale,
    float_to_fp8_bytes,
    fp8_to_float,
    pow2_ceil_exponent,
    ue8m0_decode,
    ue8m0_encode_exponent,
)

NOPE_DIM = 448
ROPE_DIM = 64
HEAD_DIM = NOPE_DIM + ROPE_DIM  # 512
TILE = 64
NUM_TILES = NOPE_DIM // TILE  # 7
RECORD_BYTES = NOPE_DIM + 2 * ROPE_DIM  # 576: nope fp8 + rope bf16
SCALE_BLOCK_BYTES = 8  # 7 UE8M0 scales + 1 pad byte
TOKEN_BYTES = RECORD_BYTES + SCALE_BLOCK_BYTES  # 584
AMAX_FLOOR = 1e-4
# Production tokens per page by compress ratio: SWA (0), C4 (4), C128 (128) share 256-token page ids.
PAGE_SIZE_BY_RATIO: dict[int, int] = {0: 256, 4: 64, 128: 2}

_ROPE_BYTES = 2 * ROPE_DIM


def page_bytes(page_size: int) -> int:
    """Bytes of one page: P records of 584 bytes rounded up to a multiple of 576."""
    return -(-page_size * TOKEN_BYTES // RECORD_BYTES) * RECORD_BYTES


def scale_offset(page_size: int) -> int:
    """Byte offset of the scale region within a page."""
    return page_size * RECORD_BYTES


@dataclass
class V4PagedCache(CacheObject):
    """One layer's V4 K cache: `data` is uint8 [num_pages, page_bytes(page_size)]."""

    data: torch.Tensor
    page_size: int
    fp8: FP8Flavor = "e4m3fn"
    # the FlashMLA view of `data`, built once: views cost microseconds of host time on every call
    _view: tuple[torch.Tensor, torch.Tensor] | None = field(default=None, init=False, repr=False, compare=False)
    _memo_token: object | None = field(default=None, init=False, repr=False, compare=False)  # see CacheObject

    @classmethod
    def empty(
        cls, num_pages: int, page_size: int, fp8: FP8Flavor = "e4m3fn", device: torch.device | str = "cpu"
    ) -> V4PagedCache:
        # Zero-initialised like the production pool: pad bytes and unwritten slots read as zero.
        op = "V4PagedCache.empty"
        num_pages = check_count(op, "num_pages", num_pages)
        page_size = check_count(op, "page_size", page_size, minimum=1)
        check_choice(op, "fp8", fp8, FP8_FLAVORS)
        dev = check_device(op, "device", device)
        check_alloc(op, "num_pages (cache size)", num_pages * page_bytes(page_size), dev, kind="a cache")
        return cls(torch.zeros(num_pages, page_bytes(page_size), dtype=torch.uint8, device=dev), page_size, fp8)

    @property
    def num_pages(self) -> int:
        return int(self.data.shape[0])

    @property
    def num_slots(self) -> int:
        return self.num_pages * self.page_size

    @property
    def device(self) -> torch.device:
        return self.data.device

    def validate(self, op: str, name: str) -> None:
        """Raise InvalidArgumentError if the buffer does not match the declared geometry and flavour."""
        if not isinstance(self.page_size, int) or isinstance(self.page_size, bool) or self.page_size <= 0:
            raise InvalidArgumentError(op, f"{name}.page_size", "a positive int", repr(self.page_size))
        if self.fp8 not in FP8_FLAVORS:
            raise InvalidArgumentError(op, f"{name}.fp8", "one of " + ", ".join(FP8_FLAVORS), repr(self.fp8))
        d = self.data
        if not isinstance(d, torch.Tensor):
            raise InvalidArgumentError(op, f"{name}.data", "a torch.Tensor", type(d).__name__)
        want = f"uint8 tensor [num_pages, {page_bytes(self.page_size)}]"
        got = f"{d.dtype} tensor of shape {tuple(d.shape)}"
        if d.dtype != torch.uint8 or d.dim() != 2 or d.shape[1] != page_bytes(self.page_size):
            raise InvalidArgumentError(
                op, f"{name}.data", want, got, remedy="allocate with V4PagedCache.empty(num_pages, page_size)"
            )
        if not d.is_contiguous():
            raise InvalidArgumentError(op, f"{name}.data", "a contiguous tensor", "a strided view")

    def flashmla_view(self) -> torch.Tensor:
        """The strided uint8 view FlashMLA is handed: [num_pages, P, 1, 584], stride(1) == 584."""
        if self._view is None or self._view[0] is not self.data:
            p = self.page_size
            self._view = (self.data, self.data[:, : p * TOKEN_BYTES].view(self.num_pages, p, 1, TOKEN_BYTES))
        return self._view[1]


@dataclass
class V4TokenRecords:
    """Decoded-layout content of N token slots: nope uint8 [N,448], scale_exp uint8 [N,7], rope bf16 [N,64]."""

    nope: torch.Tensor
    scale_exp: torch.Tensor
    rope: torch.Tensor


def quantize_tokens(k: torch.Tensor, fp8: FP8Flavor) -> V4TokenRecords:
    """Quantize [N,512] keys: per 64-tile UE8M0 power-of-two scale and RNE fp8 nope; rope kept as bf16."""
    n = k.shape[0]
    tiles = k[:, :NOPE_DIM].to(torch.float32).reshape(n, NUM_TILES, TILE)
    amax = tiles.abs().amax(dim=-1).clamp_min(AMAX_FLOOR)
    # Ceil to a power of two so amax / scale <= FP8_MAX: no saturation above the floor.
    exponent = pow2_ceil_exponent(amax_scale(amax, fp8))
    # Multiplying by 2**-e is exact (the scale is a power of two), so only the fp8 cast rounds.
    scaled = tiles * torch.exp2(-exponent.to(torch.float32)).unsqueeze(-1)
    nope = float_to_fp8_bytes(scaled, fp8).reshape(n, NOPE_DIM)
    rope = k[:, NOPE_DIM:].to(torch.bfloat16).contiguous()
    return V4TokenRecords(nope=nope, scale_exp=ue8m0_encode_exponent(exponent), rope=rope)


def dequantize_records(rec: V4TokenRecords, fp8: FP8Flavor) -> torch.Tensor:
    """Records -> float32 [N,512]: fp8 value * 2**(byte - 127) per tile, rope widened."""
    n = rec.nope.shape[0]
    vals = fp8_to_float(rec.nope.contiguous(), fp8).reshape(n, NUM_TILES, TILE)
    nope = (vals * ue8m0_decode(rec.scale_exp).unsqueeze(-1)).reshape(n, NOPE_DIM)
    return torch.cat([nope, rec.rope.to(torch.float32)], dim=1)


def exact_dequant(k: torch.Tensor, fp8: FP8Flavor) -> torch.Tensor:
    """The exact float32 values a cache holds after storing `k`, computed from the inputs alone."""
    return dequantize_records(quantize_tokens(k, fp8), fp8)


def _slot_addresses(cache: V4PagedCache, loc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Flat byte addresses [n, 576] of each slot's record and [n, 7] of its scale bytes (pad excluded)."""
    p = cache.page_size
    loc = loc.to(torch.int64)
    page, off = loc // p, loc % p
    page_base = page * cache.data.shape[1]
    dev = loc.device
    record = (page_base + off * RECORD_BYTES).unsqueeze(1) + torch.arange(RECORD_BYTES, device=dev)
    scales = (page_base + scale_offset(p) + off * SCALE_BLOCK_BYTES).unsqueeze(1) + torch.arange(NUM_TILES, device=dev)
    return record, scales


def _record_bytes(rec: V4TokenRecords) -> torch.Tensor:
    """[n, 576] bytes of nope then rope (bf16 little-endian, i.e. the bf16 tensor's own bytes)."""
    rope = rec.rope.to(torch.bfloat16).contiguous().view(torch.uint8)
    return torch.cat([rec.nope.to(torch.uint8), rope], dim=1)


def in_cache(cache: V4PagedCache, loc: torch.Tensor) -> torch.Tensor:
    """Which locations address a slot of the cache (-1, the invalid negatives and loc >= num_slots do not)."""
    return (loc >= 0) & (loc < cache.num_slots)


def write_records(cache: V4PagedCache, loc: torch.Tensor, rec: V4TokenRecords) -> None:
    """Scatter N records into the cache at `loc`. Pad bytes are never written. Rows whose loc is not a slot
    of the cache (-1, and the invalid negatives and out-of-range ids checked mode refuses) are skipped, so no
    unchecked value can make the write fail half-way or land outside the buffer.

    Duplicate non-negative locations leave one of the rows, unspecified which (as in production)."""
    if loc.shape[0] == 0 or cache.num_slots == 0:
        return
    keep = in_cache(cache, loc)
    record, scales = _record_bytes(rec), rec.scale_exp.to(torch.uint8)
    # Sync-free skip (no boolean selection, so it can be captured in a CUDA graph): a skipped row rewrites
    # the first kept row's slot with that row's own bytes; if no row is kept, it rewrites slot 0 unchanged.
    # 1-element index tensors, not 0-dim ones: indexing with a 0-dim tensor reads it on the host.
    anchor = keep.to(torch.uint8).argmax().view(1)
    any_kept = keep.index_select(0, anchor)
    flat = cache.data.view(-1)
    zero_record, zero_scales = _slot_addresses(cache, torch.zeros(1, dtype=torch.int64, device=loc.device))
    fill_record = torch.where(any_kept, record.index_select(0, anchor), flat[zero_record])
    fill_scales = torch.where(any_kept, scales.index_select(0, anchor), flat[zero_scales])
    fill_loc = torch.where(any_kept, loc.index_select(0, anchor).to(torch.int64), 0)
    keep_col = keep.unsqueeze(1)
    record_addr, scale_addr = _slot_addresses(cache, torch.where(keep, loc.to(torch.int64), fill_loc))
    flat[record_addr.reshape(-1)] = torch.where(keep_col, record, fill_record).reshape(-1)
    flat[scale_addr.reshape(-1)] = torch.where(keep_col, scales, fill_scales).reshape(-1)


def read_records(cache: V4PagedCache, loc: torch.Tensor) -> V4TokenRecords:
    """Gather the records at `loc`; rows whose loc is not a slot of the cache come back as zeros."""
    n, dev = loc.shape[0], loc.device
    if cache.num_slots == 0:
        return V4TokenRecords(nope=torch.zeros(n, NOPE_DIM, dtype=torch.uint8, device=dev),
                              scale_exp=torch.zeros(n, NUM_TILES, dtype=torch.uint8, device=dev),
                              rope=torch.zeros(n, ROPE_DIM, dtype=torch.bfloat16, device=dev))
    keep = in_cache(cache, loc)
    skip = (~keep).unsqueeze(1)
    # Select a safe slot instead of filtering so the gather stays sync-free; skipped rows are zeroed afterwards.
    record_addr, scale_addr = _slot_addresses(cache, torch.where(keep, loc, torch.zeros_like(loc)))
    flat = cache.data.view(-1)
    record = flat[record_addr].masked_fill(skip, 0)
    scales = flat[scale_addr].masked_fill(skip, 0)
    rope = record[:, NOPE_DIM:].contiguous().view(torch.bfloat16)
    return V4TokenRecords(nope=record[:, :NOPE_DIM].contiguous(), scale_exp=scales, rope=rope)


def _nope_view(data: torch.Tensor, page_size: int) -> torch.Tensor:
    """[num_pages, P, 7, 64] strided view of every slot's nope bytes."""
    region = data[:, : page_size * RECORD_BYTES].view(data.shape[0], page_size, RECORD_BYTES)
    return region[:, :, :NOPE_DIM].unflatten(-1, (NUM_TILES, TILE))


def _scale_view(data: torch.Tensor, page_size: int) -> torch.Tensor:
    """[num_pages, P, 7] strided view of every slot's scale bytes (pad byte excluded)."""
    start = scale_offset(page_size)
    region = data[:, start : start + page_size * SCALE_BLOCK_BYTES].view(data.shape[0], page_size, SCALE_BLOCK_BYTES)
    return region[:, :, :NUM_TILES]


def _shift_scales(scales: torch.Tensor, delta: int) -> torch.Tensor:
    """Add `delta` to UE8M0 bytes; byte 0 marks a never-written slot (all zeros) and stays 0."""
    shifted = (scales.to(torch.int16) + delta).clamp(1, 255).to(torch.uint8)
    return torch.where(scales == 0, scales, shifted)


def _fn_to_fnuz(nope: torch.Tensor, scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # Same bits are half the value in fnuz, so the exponent goes up by one. -0 (0x80) is NaN in fnuz -> +0;
    # NaN (0x7F/0xFF) would read as +-240 in fnuz -> fnuz NaN (0x80) so a NaN never turns into a number.
    is_nan = (nope & 0x7F) == 0x7F
    nope = torch.where(nope == 0x80, torch.zeros_like(nope), nope)
    nope = torch.where(is_nan, torch.full_like(nope, 0x80), nope)
    return nope, _shift_scales(scales, 1)


def _fnuz_to_fn(nope: torch.Tensor, scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # Tiles holding +-240 (0x7F/0xFF, NaN in fn) or NaN (0x80, -0 in fn) cannot keep their bits: they keep
    # the exponent and re-cast each value (lossy only below fn's subnormal step; NaN stays NaN).
    special = ((nope & 0x7F) == 0x7F) | (nope == 0x80)
    recast_tile = special.any(dim=-1)
    recast = float_to_fp8_bytes(fp8_to_float(nope, "e4m3fnuz"), "e4m3fn")
    nope = torch.where(recast_tile.unsqueeze(-1), recast, nope)
    scales = torch.where(recast_tile, scales, _shift_scales(scales, -1))
    return nope, scales


def convert_cache(cache: V4PagedCache, dst: FP8Flavor) -> V4PagedCache:
    """A copy of `cache` re-encoded for FP8 flavour `dst`, so a cache written by one vendor reads on another.

    Only nope and scale bytes of every slot change; rope, pad and page padding bytes are copied.
    e4m3fn -> e4m3fnuz is lossless for every scale byte in [1, 254] (writers produce 105..248)."""
    if not isinstance(cache, V4PagedCache):
        raise InvalidArgumentError("convert_cache", "cache", "a V4PagedCache", describe(cache))
    cache.validate("convert_cache", "cache")
    check_choice("convert_cache", "dst", dst, FP8_FLAVORS)
    data = cache.data.clone()
    if dst == cache.fp8:
        return V4PagedCache(data, cache.page_size, dst)
    p = cache.page_size
    nope_v, scale_v = _nope_view(data, p), _scale_view(data, p)
    convert = _fn_to_fnuz if dst == "e4m3fnuz" else _fnuz_to_fn
    nope, scales = convert(nope_v.contiguous(), scale_v.contiguous())
    nope_v.copy_(nope)
    scale_v.copy_(scales)
    return V4PagedCache(data, p, dst)
