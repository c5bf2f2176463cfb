"""The multi-token form of the Triton pack_store / dequant_gather kernels: every tokens-per-program choice
(BLOCK_T) writes the same cache bytes as one token per program and as the reference, and reads back the same
keys, on ragged n, random and contiguous locations, every page size, both FP8 flavours and extreme values."""

from __future__ import annotations

import pytest
import torch

from dsv4hal.conformance.cases_pack_store import _KEY_MAKERS
from dsv4hal.formats.fp8 import FP8_MAX, FP8Flavor
from dsv4hal.formats.v4_cache import AMAX_FLOOR, V4PagedCache
from dsv4hal.reference.pack_store import dequant_gather as ref_gather
from dsv4hal.reference.pack_store import pack_store as ref_store

pytest.importorskip("triton")
pytestmark = pytest.mark.slow  # minutes under the Triton interpreter: the whole suite runs it
from dsv4hal.kernels.triton import v4_cache_kernels as tk  # noqa: E402

BLOCK_TS = (1, 2, 4, 8, 16)
DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # the CPU under TRITON_INTERPRET=1


def _inputs(n: int, page_size: int, fp8: FP8Flavor, kind: str, layout: str, loc_dtype: torch.dtype,
            seed: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Keys of the catalog's kind, locations and a page count. random: distinct scattered slots with skipped rows
    (-1, another negative, one past the cache); contiguous: consecutive slots from an offset that is no multiple
    of any BLOCK_T and crosses pages, with one skipped row."""
    g = torch.Generator().manual_seed(seed)
    k = _KEY_MAKERS[kind](n, fp8, g).to(torch.bfloat16)
    pages = -(-(2 * n + 8) // page_size) + 1
    slots = pages * page_size
    if layout == "random":
        loc = torch.randperm(slots, generator=g)[:n]
        for i, bad in ((3, -1), (8, -5), (13, slots)):
            if i < n:
                loc[i] = bad
    else:
        start = min(page_size - 3, slots - n) if page_size > 3 else 1  # ends of pages: slots cross page boundaries
        loc = torch.arange(start, start + n)
        if n > 6:
            loc[6] = -1
    return k.to(DEV), loc.to(loc_dtype).to(DEV), pages


def _check(k: torch.Tensor, loc: torch.Tensor, pages: int, page_size: int, fp8: FP8Flavor, dirty: bool) -> None:
    want = V4PagedCache.empty(pages, page_size, fp8, DEV)
    if dirty:  # pre-existing bytes (pad, padding, skipped and unwritten slots) must survive
        want.data.copy_(torch.randint(0, 256, want.data.shape, generator=torch.Generator().manual_seed(1),
                                      dtype=torch.uint8))
    start = want.data.clone()
    ref_store(k, loc, want)
    keys = ref_gather(want, loc)
    one = None
    for bt in BLOCK_TS:
        got = V4PagedCache(start.clone(), page_size, fp8)
        tk.pack_store(k, loc, got, config={"block_t": bt})
        if one is None:
            one = got.data
        assert torch.equal(got.data, one), f"BLOCK_T={bt} differs from BLOCK_T=1"
        diff = (got.data != want.data).nonzero()
        assert diff.numel() == 0, f"BLOCK_T={bt}: {diff.shape[0]} bytes differ from the reference, first {diff[:3]}"
        read = tk.dequant_gather(want, loc, config={"block_t": bt})
        assert torch.equal(read.view(torch.int16), keys.view(torch.int16)), f"dequant_gather BLOCK_T={bt}"


# page size x flavour x layout; kinds and loc dtypes rotate so that each appears with several of them
MATRIX = [(p, fp8, layout) for p in (256, 64, 2) for fp8 in ("e4m3fn", "e4m3fnuz")
          for layout in ("random", "contiguous")]
KINDS = ("random", "zeros", "huge", "tiny", "pow2")


@pytest.mark.parametrize(("i", "page_size", "fp8", "layout"), [(i, *m) for i, m in enumerate(MATRIX)],
                         ids=[f"p{p}-{f}-{lay}" for p, f, lay in MATRIX])
def test_tiles_match_one_token_and_reference(i: int, page_size: int, fp8: FP8Flavor, layout: str) -> None:
    """The tiled pack_store writes the same bytes as the one-token kernel and the reference."""
    kind, loc_dtype = KINDS[i % len(KINDS)], (torch.int32, torch.int64)[i % 2]
    k, loc, pages = _inputs(37, page_size, fp8, kind, layout, loc_dtype, seed=i)  # 37: no multiple of any BLOCK_T
    _check(k, loc, pages, page_size, fp8, dirty=i % 3 == 0)


@pytest.mark.parametrize("fp8", ["e4m3fn", "e4m3fnuz"])
@pytest.mark.parametrize("kind", KINDS[1:])
def test_tiles_extreme_values(kind: str, fp8: FP8Flavor) -> None:
    """The tiled pack_store matches the reference on extreme values."""
    k, loc, pages = _inputs(21, 64, fp8, kind, "random", torch.int64, seed=len(kind))
    _check(k, loc, pages, 64, fp8, dirty=False)


@pytest.mark.parametrize("n", [0, 1, 2, 5])
@pytest.mark.parametrize("loc_dtype", [torch.int32, torch.int64])
def test_tiles_small_n(n: int, loc_dtype: torch.dtype) -> None:
    """n below BLOCK_T: the launch shrinks BLOCK_T to n's power of two, whose last tokens are masked (n = 5)."""
    k, loc, pages = _inputs(n, 2, "e4m3fn", "random", "contiguous", loc_dtype, seed=n)
    _check(k, loc, pages, 2, "e4m3fn", dirty=True)


def test_tiles_nonfinite_keys_match_one_token() -> None:
    """NaN and infinities (which checked mode refuses) give the same bytes whatever BLOCK_T: the per-tile amax is
    order-free, so the tile shape cannot change it."""
    k, loc, pages = _inputs(19, 64, "e4m3fn", "random", "random", torch.int64, seed=9)
    k[0, 5], k[1, 70], k[2, 130], k[4, 450], k[5] = float("nan"), float("inf"), -float("inf"), float("nan"), 3e38
    images = []
    for bt in BLOCK_TS:
        got = V4PagedCache.empty(pages, 64, device=DEV)
        tk.pack_store(k, loc, got, config={"block_t": bt})
        images.append(got.data)
    assert all(torch.equal(im, images[0]) for im in images[1:])


def test_tile_rows_past_n_are_masked() -> None:
    """A program wider than n (BLOCK_T = 16, n = 3, launched directly) writes only the n tokens' slots."""
    k, loc, pages = _inputs(3, 64, "e4m3fn", "random", "random", torch.int64, seed=3)
    want = V4PagedCache.empty(pages, 64, device=DEV)
    ref_store(k, loc, want)
    got = V4PagedCache.empty(pages, 64, device=DEV)
    tk._pack_store_kernel[(1,)](k, loc, got.data, 3, k.stride(0), got.data.stride(0), got.num_slots, P=64,
                                FP8_MAX_C=FP8_MAX["e4m3fn"], AMAX_FLOOR_C=AMAX_FLOOR, FNUZ=False, BLOCK_T=16,
                                HW_FP8=False)
    assert torch.equal(got.data, want.data)


def test_tokens_per_program() -> None:
    """The default holds for large n; a small n gets no more rows than its power of two."""
    assert tk._tokens_per_program(32768, tk.DEFAULT_TOKENS_PER_PROGRAM) == tk.DEFAULT_TOKENS_PER_PROGRAM
    assert tk._tokens_per_program(3, 16) == 4 and tk._tokens_per_program(1, 16) == 1
