"""Op contracts: `pack_store` (quantize -> pack -> scatter by loc) and `dequant_gather` (its inverse read).

pack_store(k, loc, cache) -> None, in place
    k: bf16 [N, 512] contiguous (448 nope values then 64 post-RoPE rope values); loc: int32/int64 [N] contiguous
    slot ids on k's device; cache: V4PagedCache on the same device. For each row i with loc[i] >= 0 the 584-byte record
    of slot loc[i] (page loc // P, offset loc % P; layout in dsv4hal.formats.v4_cache) is overwritten with:
    per 64-element nope tile, amax = max(max|x|, 1e-4), exponent e = ceil(log2(amax / FP8_MAX)) stored as the
    UE8M0 byte e + 127, values fp8(x * 2**-e) rounded to nearest even and clamped to +-FP8_MAX (448 for
    e4m3fn, 240 for e4m3fnuz); rope copied as bf16 bits. Rows with loc[i] == -1 are skipped. The pad byte,
    page padding and every other slot are left untouched. Results must be bit-exact with the reference.
    Duplicate non-negative locations leave one of the rows, unspecified which.

dequant_gather(cache, loc) -> bf16 [M, 512]
    Row i is slot loc[i] dequantized (fp8 value * 2**(byte - 127) per tile, rope as stored), exact in bf16;
    rows with loc[i] == -1 are zero. loc: int32/int64 [M] contiguous.

Any positive page size P is accepted; production uses 256 (SWA), 64 (C4) and 2 (C128), see
PAGE_SIZE_BY_RATIO. Locations: -1 skips the row; any other negative, and any loc >= cache.num_slots, is
invalid. Checked mode additionally reads the inputs (a device sync) and refuses invalid locations and
non-finite k. Unchecked mode never writes or reads outside the cache for them: the reference and the portable
kernels skip such a row (a zero row for dequant_gather), and validation happens before any byte is written.
"""

from __future__ import annotations

import torch

from dsv4hal.checks import check_alloc, check_finite, check_tensor, describe
from dsv4hal.errors import InvalidArgumentError
from dsv4hal.formats.v4_cache import HEAD_DIM, V4PagedCache
from dsv4hal.ops.signatures import define

OP_PACK_STORE = "pack_store"
OP_DEQUANT_GATHER = "dequant_gather"
LOC_DTYPES = (torch.int32, torch.int64)
# Feature "size" (same key as the other ops and ops/catalog.py): rows >= this are "large" (prefill), else "small".
LARGE_N = 4096


def _check_cache(op: str, cache: object) -> V4PagedCache:
    if not isinstance(cache, V4PagedCache):
        raise InvalidArgumentError(
            op, "cache", "a V4PagedCache", describe(cache), remedy="wrap the buffer with V4PagedCache(data, page_size)"
        )
    cache.validate(op, "cache")
    return cache


def _check_loc_range(op: str, loc: torch.Tensor, num_slots: int) -> None:
    """Checked mode: -1 skips; everything else (other negatives included) must address a slot of the cache."""
    bad = (loc < -1) | (loc >= num_slots)
    if loc.numel() and bool(bad.any()):
        first = int(loc[bad][0])
        raise InvalidArgumentError(
            op, "loc", f"slot ids in [0, {num_slots}) or -1 (skip)", f"slot id {first}",
            remedy="loc addresses slots of this cache (num_pages * page_size); -1 and no other negative skips",
        )


def validate_pack_store(k: object, loc: object, cache: object, *, checked: bool = False) -> None:
    """Raise InvalidArgumentError unless the arguments meet the pack_store contract."""
    op = OP_PACK_STORE
    cache = _check_cache(op, cache)
    k = check_tensor(op, "k", k, dtype=torch.bfloat16, shape=(None, HEAD_DIM), device=cache.device, contiguous=True)
    loc = check_tensor(op, "loc", loc, dtype=LOC_DTYPES, shape=(k.shape[0],), device=cache.device, contiguous=True)
    if checked:
        _check_loc_range(op, loc, cache.num_slots)
        check_finite(op, "k", k)


def validate_dequant_gather(cache: object, loc: object, *, checked: bool = False) -> None:
    """Raise InvalidArgumentError unless the arguments meet the dequant_gather contract."""
    op = OP_DEQUANT_GATHER
    cache = _check_cache(op, cache)
    loc = check_tensor(op, "loc", loc, dtype=LOC_DTYPES, shape=(None,), device=cache.device, contiguous=True)
    check_alloc(op, "loc (output size)", loc.shape[0] * HEAD_DIM * 2, cache.device)
    if checked:
        _check_loc_range(op, loc, cache.num_slots)


def size_class(n: int) -> str:
    return "large" if n >= LARGE_N else "small"


def _features(cache: V4PagedCache, n: int) -> dict[str, object]:
    return {"fp8": cache.fp8, "page_size": cache.page_size, "size": size_class(n)}


def case_pack_store(k: torch.Tensor, loc: torch.Tensor, cache: V4PagedCache) -> dict[str, object]:
    """Hashable features for kernel selection: fp8 flavour, page size, size class of N."""
    return _features(cache, int(k.shape[0]))


def case_dequant_gather(cache: V4PagedCache, loc: torch.Tensor) -> dict[str, object]:
    """Hashable features for kernel selection: fp8 flavour, page size, size class of M."""
    return _features(cache, int(loc.shape[0]))


def fake_dequant_gather(cache: V4PagedCache, loc: torch.Tensor) -> torch.Tensor:
    """The output's shape and dtype (under torch.compile)."""
    return cache.data.new_empty(loc.shape[0], HEAD_DIM, dtype=torch.bfloat16)


@define(validate=validate_pack_store, case=case_pack_store, mutates=("cache",))
def pack_store(k: torch.Tensor, loc: torch.Tensor, cache: V4PagedCache) -> None:
    """Quantize bf16 keys into the 584-byte V4 paged cache, in place (bit-exact with the reference).

    Arguments:
        k: (N, 512), torch.bfloat16, contiguous. 448 nope values then 64 post-RoPE rope values per token.
        loc: (N,), torch.int32 or torch.int64, contiguous, on the cache's device. Slot ids (page loc // P, offset
            loc % P); -1 skips the row.
        cache: V4PagedCache, any positive page size P (production: 256 SWA, 64 C4, 2 C128). Mutated.

    Returns:
        None. Slot loc[i] holds, per 64-element nope tile, the UE8M0 exponent byte e + 127 with
        e = ceil(log2(max(max|x|, 1e-4) / FP8_MAX)) and fp8(x * 2**-e) (round to nearest even, clamped to
        +-FP8_MAX: 448 e4m3fn, 240 e4m3fnuz); rope copied as bf16 bits. Pad bytes and other slots are untouched;
        duplicate locations leave one of the rows.

    Rejected (InvalidArgumentError): other dtypes or shapes, strided views, tensors on another device. Checked
    mode also refuses loc < -1 or loc >= cache.num_slots and non-finite k; unchecked, such rows are skipped.
    """


@define(validate=validate_dequant_gather, case=case_dequant_gather, fake=fake_dequant_gather)
def dequant_gather(cache: V4PagedCache, loc: torch.Tensor) -> torch.Tensor:
    """Read V4 cache slots back to bf16 (the sparse-prefill workspace); pack_store's inverse, exact in bf16.

    Arguments:
        cache: V4PagedCache.
        loc: (M,), torch.int32 or torch.int64, contiguous, on the cache's device. Slot ids; -1 gives a zero row.

    Returns:
        (M, 512), torch.bfloat16: row i is slot loc[i], fp8 value * 2**(byte - 127) per tile, rope as stored.

    Rejected (InvalidArgumentError): as pack_store, and an output that cannot fit the device. Checked mode
    refuses invalid slot ids; unchecked, their rows are zero.
    """
