"""Conformance catalog of `pack_store` and `dequant_gather` (contracts in dsv4hal.ops.pack_store).

pack_store is compared byte for byte against the image quantize_tokens + write_records produce from the
inputs; dequant_gather exactly against exact_dequant of the stored keys. Both are integer-exact formats, so
no tolerance is granted.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from dsv4hal.conformance.types import CaseSpec, Fixture, Tolerance, builder_for, compare_close
from dsv4hal.formats.fp8 import FP8_FLAVORS, FP8_MAX
from dsv4hal.formats.v4_cache import (
    HEAD_DIM,
    NOPE_DIM,
    NUM_TILES,
    PAGE_SIZE_BY_RATIO,
    RECORD_BYTES,
    TILE,
    TOKEN_BYTES,
    V4PagedCache,
    exact_dequant,
    page_bytes,
    quantize_tokens,
    scale_offset,
    write_records,
)

OP_PACK_STORE = "pack_store"
OP_DEQUANT_GATHER = "dequant_gather"

TOLERANCES: dict[str, Tolerance] = {
    OP_PACK_STORE: Tolerance(
        0.0, 0.0,
        "bit-exact: the scale is a power of two chosen by an integer rule and the fp8 cast rounds to nearest "
        "even, so every correct kernel writes identical bytes (max_error counts differing bytes)",
    ),
    OP_DEQUANT_GATHER: Tolerance(
        0.0, 0.0, "exact: an fp8 value times a power-of-two scale is representable in bf16, rope is copied",
    ),
}

_SIZES = (1, 64, 1000)
_EDGE_KINDS = ("zeros", "huge", "tiny", "pow2")
_EDGE_N = 64
_SKIP_FRACTION = 0.15


def _params(page_size: int, fp8: str, n: int, kind: str, loc_dtype: str, prefill: str = "zeros") -> dict[str, Any]:
    return {"page_size": page_size, "fp8": fp8, "n": n, "kind": kind, "loc_dtype": loc_dtype, "prefill": prefill}


def _matrix(op: str) -> list[CaseSpec]:
    """Production page sizes x flavours x (sizes + edge values); pack_store adds dirty-cache cases."""
    cases = []
    for ratio, p in sorted(PAGE_SIZE_BY_RATIO.items()):
        for fp8 in FP8_FLAVORS:
            tag = f"p{p}-{fp8}"
            for n in _SIZES:
                loc_dtype = "int32" if n == 64 else "int64"
                cases.append(CaseSpec(op, f"{tag}-random-n{n}", _params(p, fp8, n, "random", loc_dtype), ratio))
            for i, kind in enumerate(_EDGE_KINDS):
                loc_dtype = ("int32", "int64")[i % 2]
                cases.append(CaseSpec(op, f"{tag}-{kind}-n{_EDGE_N}", _params(p, fp8, _EDGE_N, kind, loc_dtype), ratio))
            if op == OP_PACK_STORE:
                # Pre-existing bytes must survive everywhere the op does not own (pad, padding, skipped rows).
                params = _params(p, fp8, _EDGE_N, "random", "int64", prefill="random")
                cases.append(CaseSpec(op, f"{tag}-dirty-n{_EDGE_N}", params, ratio))
    for fp8 in FP8_FLAVORS:
        # The SWA unit-test mock pool uses 128-token pages (spec §2.1 table).
        cases.append(CaseSpec(op, f"p128-{fp8}-random-n{_EDGE_N}", _params(128, fp8, _EDGE_N, "random", "int32"), 0))
    return cases


CASES_PACK_STORE: list[CaseSpec] = _matrix(OP_PACK_STORE)
CASES_DEQUANT_GATHER: list[CaseSpec] = _matrix(OP_DEQUANT_GATHER)


# ----- inputs -------------------------------------------------------------------------------------------


def _randn(gen: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=gen, device=gen.device)


def _rand(gen: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.rand(*shape, generator=gen, device=gen.device)


def _plant_per_tile(tiles: torch.Tensor, values: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Put values [n, 7] at a random position of each tile, after scaling the tile below |value|."""
    n = tiles.shape[0]
    tiles = tiles / tiles.abs().amax(-1, keepdim=True).clamp_min(1e-30) * values.abs().unsqueeze(-1) * 0.99
    pos = torch.randint(0, TILE, (n, NUM_TILES, 1), generator=gen, device=gen.device)
    return tiles.scatter(-1, pos, values.unsqueeze(-1))


def _keys_random(n: int, fp8: str, gen: torch.Generator) -> torch.Tensor:
    # Each tile gets its own magnitude 2**u so different scale exponents occur within a row.
    k = _randn(gen, n, HEAD_DIM)
    mag = torch.exp2(torch.randint(-6, 7, (n, NUM_TILES), generator=gen, device=gen.device).float())
    k[:, :NOPE_DIM] *= mag.repeat_interleave(TILE, dim=1)
    return k


def _keys_zeros(n: int, fp8: str, gen: torch.Generator) -> torch.Tensor:
    # Whole zero rows and single zero tiles: amax hits the 1e-4 floor.
    k = _randn(gen, n, HEAD_DIM)
    k[::3] = 0.0
    tile = torch.randint(0, NUM_TILES, (n,), generator=gen, device=gen.device)
    cols = tile.unsqueeze(1) * TILE + torch.arange(TILE, device=gen.device)
    return k.scatter(1, cols, 0.0)


def _keys_huge(n: int, fp8: str, gen: torch.Generator) -> torch.Tensor:
    k = _randn(gen, n, HEAD_DIM) * 3e3
    sign = torch.where(_rand(gen, n, NUM_TILES) < 0.5, -1.0, 1.0)
    k[:, :NOPE_DIM] = _plant_per_tile(k[:, :NOPE_DIM].reshape(n, NUM_TILES, TILE), sign * 1e4, gen).reshape(n, -1)
    return k


def _keys_tiny(n: int, fp8: str, gen: torch.Generator) -> torch.Tensor:
    # Below the 1e-4 amax floor (tile magnitudes 1e-10..1e-6): scaled values reach fp8 subnormals and zero.
    k = _randn(gen, n, HEAD_DIM)
    mag = torch.pow(10.0, torch.randint(-10, -5, (n, NUM_TILES), generator=gen, device=gen.device).float())
    k[:, :NOPE_DIM] *= mag.repeat_interleave(TILE, dim=1)
    k[:, NOPE_DIM:] *= 1e-6
    return k


def _keys_pow2(n: int, fp8: str, gen: torch.Generator) -> torch.Tensor:
    # Odd tiles: amax = 2**j; even tiles: amax = FP8_MAX * 2**j, so amax / FP8_MAX is itself a power of two.
    k = _randn(gen, n, HEAD_DIM)
    j = torch.randint(-12, 12, (n, NUM_TILES), generator=gen, device=gen.device).float()
    base = torch.where(torch.arange(NUM_TILES, device=gen.device) % 2 == 0, FP8_MAX[fp8], 1.0)
    sign = torch.where(_rand(gen, n, NUM_TILES) < 0.5, -1.0, 1.0)
    amax = sign * base * torch.exp2(j)
    k[:, :NOPE_DIM] = _plant_per_tile(k[:, :NOPE_DIM].reshape(n, NUM_TILES, TILE), amax, gen).reshape(n, -1)
    return k


_KEY_MAKERS = {
    "random": _keys_random, "zeros": _keys_zeros, "huge": _keys_huge, "tiny": _keys_tiny, "pow2": _keys_pow2,
}


def _num_pages(n: int, page_size: int) -> int:
    # About twice the slots needed, so locations are scattered across pages with gaps; slot 0 stays reserved.
    return -(-(2 * n + 8) // page_size) + 1


def _locations(n: int, num_slots: int, gen: torch.Generator) -> torch.Tensor:
    """Distinct slots in [1, num_slots) with ~15% rows skipped by -1 or another negative value."""
    loc = torch.randperm(num_slots - 1, generator=gen, device=gen.device)[:n] + 1
    skip = _rand(gen, n) < _SKIP_FRACTION
    if n == 1:
        skip[:] = False
    negative = torch.where(torch.arange(n, device=gen.device) % 2 == 0, -1, -(loc + 2))
    return torch.where(skip, negative, loc)


def _inputs(spec: CaseSpec, device: torch.device, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, int]:
    p = spec.params
    k = _KEY_MAKERS[p["kind"]](p["n"], p["fp8"], gen).to(torch.bfloat16)
    num_pages = _num_pages(p["n"], p["page_size"])
    loc = _locations(p["n"], num_pages * p["page_size"], gen).to(getattr(torch, p["loc_dtype"]))
    return k.to(device), loc.to(device), num_pages


def _new_cache(spec: CaseSpec, num_pages: int, device: torch.device, gen: torch.Generator) -> V4PagedCache:
    p = spec.params
    cache = V4PagedCache.empty(num_pages, p["page_size"], p["fp8"], device)
    if p.get("prefill") == "random":
        garbage = torch.randint(0, 256, cache.data.shape, generator=gen, device=gen.device, dtype=torch.uint8)
        cache.data.copy_(garbage)
    return cache


# ----- comparison ---------------------------------------------------------------------------------------


def _region(in_page: int, page_size: int) -> str:
    """Name the part of a page a byte offset falls in (for failure messages)."""
    if in_page < scale_offset(page_size):
        slot, at = divmod(in_page, RECORD_BYTES)
        return f"slot {slot} {'nope' if at < NOPE_DIM else 'rope'} byte {at}"
    if in_page < page_size * TOKEN_BYTES:
        slot, at = divmod(in_page - scale_offset(page_size), TOKEN_BYTES - RECORD_BYTES)
        return f"slot {slot} {'scale' if at < NUM_TILES else 'pad'} byte {at}"
    return "page padding"


def compare_bytes(got: torch.Tensor, expected: torch.Tensor, *, page_size: int) -> tuple[float, bool, str]:
    """Byte equality of two cache images; max_error is the number of differing bytes."""
    if not isinstance(got, torch.Tensor) or got.dtype != torch.uint8 or got.shape != expected.shape:
        return float("inf"), False, f"expected uint8 {tuple(expected.shape)}, got {got!r:.80}"
    diff = (got.to("cpu") != expected.to("cpu")).reshape(-1)
    count = int(diff.sum())
    if count == 0:
        return 0.0, True, ""
    first = int(diff.nonzero()[0])
    page, in_page = divmod(first, page_bytes(page_size))
    where = f"page {page} {_region(in_page, page_size)}"
    return float(count), False, f"{count} bytes differ; first at flat offset {first} ({where})"


def _cache_bytes(ret: Any, args: dict[str, Any]) -> torch.Tensor:
    return args["cache"].data


# ----- builders -----------------------------------------------------------------------------------------


def _build_pack_store(spec: CaseSpec, device: torch.device, gen: torch.Generator) -> Fixture:
    k, loc, num_pages = _inputs(spec, device, gen)
    cache = _new_cache(spec, num_pages, device, gen)
    image = V4PagedCache(cache.data.clone(), cache.page_size, cache.fp8)
    write_records(image, loc, quantize_tokens(k, cache.fp8))
    return Fixture(
        args={"k": k, "loc": loc, "cache": cache},
        expected=image.data,
        extract=_cache_bytes,
        compare=functools.partial(compare_bytes, page_size=cache.page_size),
        tolerance=TOLERANCES[OP_PACK_STORE],
    )


def _gather_locations(loc: torch.Tensor, num_slots: int, gen: torch.Generator) -> torch.Tensor:
    """Every stored (and skipped) location, a few never-written slots and repeats, in random order."""
    written = torch.zeros(num_slots, dtype=torch.bool, device=loc.device)
    written[loc[loc >= 0].long()] = True
    unwritten = (~written).nonzero().flatten()[:4].to(loc.device)
    repeats = loc[:8]
    query = torch.cat([loc, unwritten.to(loc.dtype), repeats])
    order = torch.randperm(query.shape[0], generator=gen, device=gen.device).to(loc.device)
    return query[order]


def _build_dequant_gather(spec: CaseSpec, device: torch.device, gen: torch.Generator) -> Fixture:
    k, loc, num_pages = _inputs(spec, device, gen)
    cache = _new_cache(spec, num_pages, device, gen)
    write_records(cache, loc, quantize_tokens(k, cache.fp8))
    query = _gather_locations(loc, cache.num_slots, gen)
    # Map each queried slot back to the row of k stored there (-1: skipped or never written -> zeros).
    row_of_slot = torch.full((cache.num_slots,), -1, dtype=torch.int64, device=device)
    kept = loc >= 0
    row_of_slot[loc[kept].long()] = torch.arange(k.shape[0], device=device)[kept]
    row = torch.where(query >= 0, row_of_slot[query.clamp_min(0).long()], -1)
    expected = exact_dequant(k, cache.fp8)[row.clamp_min(0)].masked_fill((row < 0).unsqueeze(1), 0.0)
    tol = TOLERANCES[OP_DEQUANT_GATHER]
    return Fixture(
        args={"cache": cache, "loc": query},
        expected=expected.to(torch.bfloat16),
        compare=functools.partial(compare_close, tol=tol),
        tolerance=tol,
    )


_BUILDERS = {OP_PACK_STORE: _build_pack_store, OP_DEQUANT_GATHER: _build_dequant_gather}


def build(spec: CaseSpec, device: torch.device, gen: torch.Generator) -> Fixture:
    """Fixture for one case; inputs drawn from `gen` (on gen's device), then placed on `device`."""
    return builder_for("cases_pack_store", _BUILDERS, spec)(spec, torch.device(device), gen)
