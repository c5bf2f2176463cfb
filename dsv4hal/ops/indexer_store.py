"""Op contract: `indexer_store` (spec 2.3: the C4 indexer K cache writer, FP8 path).

indexer_store(k, loc, cache, scale="amax") -> None, in place
    k: fp32 or bf16 [N, 128] (the indexer compressor's rows: RMSNorm, RoPE and Hadamard already applied);
    loc: int32/int64 [N] slot ids (page loc // 64, offset loc % 64), -1 skips the row;
    cache: IndexerPagedCache (132-byte rows, pages of 64; dsv4hal.formats.indexer_cache), all on one device;
    scale: "amax" or "pow2", the scale rule (below).
For each row i with loc[i] >= 0, slot loc[i] is overwritten with:
    amax = max(max_j |k[i, j]|, 1e-4) in fp32; s = amax / FP8_MAX (one IEEE fp32 division; FP8_MAX 448 for
    e4m3fn, 240 for e4m3fnuz). scale="pow2" rounds s up to a power of two, 2**ceil(log2 s), from its bits;
    values fp8(clamp(k[i] / s, +-FP8_MAX)), fp32 division then round to nearest even; s stored as fp32.
The two rules make the bytes of the two production writers: "amax" is SGLang's (`fused_store_indexer_cache`,
plain fp32 scales; dsv4hal's default), "pow2" is vLLM's `indexer_k_quant_and_cache` with ue8m0 scales
(`exp2f(ceilf(log2f(s)))`: equal to the exact rounding except where s lies within a few ulps above a power of
two and log2f rounds down to the integer; there vLLM stores half the scale and saturates that row's largest
values). vLLM on gfx942 divides by 224 rather than 240 for e4m3fnuz; dsv4hal uses 240 for both writers.
Every other byte of the cache is left untouched. Results are bit-exact with the reference.
Duplicate non-negative locations leave one of the rows, unspecified which. Any other negative location and
any loc >= cache.num_slots is invalid: checked mode refuses it (and non-finite k, a device sync); unchecked
mode skips such a row, never writing outside the cache.
"""

from __future__ import annotations

import torch

from dsv4hal.checks import check_choice, check_finite, check_tensor, describe
from dsv4hal.errors import InvalidArgumentError
from dsv4hal.formats.indexer_cache import INDEX_DIM, SCALE_MODES, IndexerPagedCache
from dsv4hal.ops.signatures import define

OP = "indexer_store"
K_DTYPES = (torch.float32, torch.bfloat16)
LOC_DTYPES = (torch.int32, torch.int64)


def _check_cache(cache: object) -> IndexerPagedCache:
    if not isinstance(cache, IndexerPagedCache):
        raise InvalidArgumentError(OP, "cache", "an IndexerPagedCache", describe(cache),
                                   remedy="wrap the buffer with IndexerPagedCache(data, fp8)")
    cache.validate(OP, "cache")
    return cache


def _check_loc_range(loc: torch.Tensor, num_slots: int) -> None:
    bad = (loc < -1) | (loc >= num_slots)
    if loc.numel() and bool(bad.any()):
        raise InvalidArgumentError(
            OP, "loc", f"slot ids in [0, {num_slots}) or -1 (skip)", f"slot id {int(loc[bad][0])}",
            remedy="loc addresses slots of this cache (num_pages * 64); -1 and no other negative skips",
        )


def validate(k: object, loc: object, cache: object, scale: object = "amax", *, checked: bool = False) -> None:
    """Raise InvalidArgumentError unless the arguments meet the indexer_store contract (module docstring)."""
    cache = _check_cache(cache)
    dev = cache.data.device
    k = check_tensor(OP, "k", k, dtype=K_DTYPES, shape=(None, INDEX_DIM), device=dev)
    loc = check_tensor(OP, "loc", loc, dtype=LOC_DTYPES, shape=(k.shape[0],), device=dev)
    check_choice(OP, "scale", scale, SCALE_MODES)
    if checked:
        _check_loc_range(loc, cache.num_slots)
        check_finite(OP, "k", k)


def case(k: torch.Tensor, loc: torch.Tensor, cache: IndexerPagedCache, scale: str = "amax") -> dict[str, object]:
    """Hashable features for kernel selection: the cache's FP8 flavour and the scale rule."""
    return {"fp8": cache.fp8, "scale": scale}


@define(validate=validate, case=case, mutates=("cache",))
def indexer_store(k: torch.Tensor, loc: torch.Tensor, cache: IndexerPagedCache, scale: str = "amax") -> None:
    """Quantize index keys into the 132-byte FP8 rows of the C4 indexer cache, in place (bit-exact).

    Arguments:
        k: (N, 128), torch.float32 or torch.bfloat16: the indexer compressor's rows (RMSNorm, RoPE, Hadamard done).
        loc: (N,), torch.int32 or torch.int64, on the cache's device: slot ids (page loc // 64, offset loc % 64);
            -1 skips the row.
        cache: IndexerPagedCache (pages of 64 rows of 128 FP8 bytes + an fp32 scale). Mutated.
        scale: "amax" (s = amax / FP8_MAX, SGLang's writer, the default) or "pow2" (s rounded up to a power of
            two, vLLM's ue8m0 writer).

    Returns:
        None. Slot loc[i] holds fp8(clamp(k[i] / s, +-FP8_MAX)) and s as fp32, amax = max(max|k[i]|, 1e-4).

    Rejected (InvalidArgumentError): other dtypes, shapes or devices, an unknown scale rule. Checked mode also
    refuses loc < -1 or loc >= cache.num_slots and non-finite k; unchecked, such rows are skipped.
    """
