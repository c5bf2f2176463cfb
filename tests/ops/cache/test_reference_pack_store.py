"""Reference pack_store / dequant_gather, their contracts, and the conformance catalog run on the reference."""

from __future__ import annotations

import pytest
import torch

from dsv4hal.conformance import cases_pack_store as catalog
from dsv4hal.conformance.types import CaseSpec
from dsv4hal.errors import InvalidArgumentError
from dsv4hal.formats.fp8 import FP8_FLAVORS
from dsv4hal.formats.v4_cache import (
    AMAX_FLOOR,
    HEAD_DIM,
    NOPE_DIM,
    NUM_TILES,
    TILE,
    V4PagedCache,
    exact_dequant,
    page_bytes,
)
from dsv4hal.ops.pack_store import (
    case_dequant_gather,
    case_pack_store,
    validate_dequant_gather,
    validate_pack_store,
)
from dsv4hal.reference.pack_store import dequant_gather, pack_store

REFERENCE = {"pack_store": pack_store, "dequant_gather": dequant_gather}


def _keys(n: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(n, HEAD_DIM, generator=g)
    mag = torch.exp2(torch.randint(-5, 6, (n, NUM_TILES), generator=g).float())
    k[:, :NOPE_DIM] *= mag.repeat_interleave(TILE, dim=1)
    return k.to(torch.bfloat16)


def _setup(n: int = 50, page_size: int = 64, fp8: str = "e4m3fn", loc_dtype: torch.dtype = torch.int64):
    cache = V4PagedCache.empty(-(-2 * n // page_size) + 1, page_size, fp8)
    g = torch.Generator().manual_seed(n + page_size)
    loc = torch.randperm(cache.num_slots, generator=g)[:n].to(loc_dtype)
    loc[::7] = -1
    return _keys(n), loc, cache


# ----- reference semantics ------------------------------------------------------------------------------


@pytest.mark.parametrize("fp8", FP8_FLAVORS)
@pytest.mark.parametrize("page_size, loc_dtype", [(256, torch.int64), (64, torch.int32), (2, torch.int64)])
def test_store_then_gather_is_exact_dequant(fp8: str, page_size: int, loc_dtype: torch.dtype) -> None:
    """pack_store then dequant_gather returns the exact dequantized keys and leaves k unchanged."""
    k, loc, cache = _setup(100, page_size, fp8, loc_dtype)
    k_before = k.clone()
    assert pack_store(k, loc, cache) is None
    assert torch.equal(k, k_before)
    out = dequant_gather(cache, loc)
    assert out.dtype == torch.bfloat16 and out.shape == (100, HEAD_DIM)
    keep = loc >= 0
    want = exact_dequant(k, fp8)
    assert torch.equal(out[keep].float(), want[keep])  # bf16 holds the dequantized values exactly
    assert int(out[~keep].count_nonzero()) == 0
    assert not torch.isnan(out).any()


@pytest.mark.parametrize("fp8", FP8_FLAVORS)
def test_round_trip_within_quantization_bound(fp8: str) -> None:
    """The pack_store round trip stays within each tile's FP8 quantization bound."""
    k, loc, cache = _setup(80, 64, fp8)
    pack_store(k, loc, cache)
    keep = loc >= 0
    out, x = dequant_gather(cache, loc)[keep].float(), k[keep].float()
    amax = x[:, :NOPE_DIM].reshape(-1, NUM_TILES, TILE).abs().amax(-1).clamp_min(AMAX_FLOOR)
    err = (out - x)[:, :NOPE_DIM].abs()
    assert (err <= amax.repeat_interleave(TILE, dim=1) / 16).all()
    assert (err <= x[:, :NOPE_DIM].abs() / 16 + 2.0**-10 * amax.repeat_interleave(TILE, dim=1) / 224).all()
    assert torch.equal(out[:, NOPE_DIM:], x[:, NOPE_DIM:])


def test_store_overwrites_and_leaves_other_slots() -> None:
    """pack_store overwrites its slots and leaves every other slot's bytes."""
    k, loc, cache = _setup(30, 2)
    pack_store(k, loc, cache)
    first = cache.data.clone()
    k2 = _keys(30, seed=9)
    only = torch.full_like(loc, -1)
    only[3] = loc[3] if loc[3] >= 0 else loc[4]
    pack_store(k2, only, cache)
    row = 3 if loc[3] >= 0 else 4
    got = dequant_gather(cache, loc)
    assert torch.equal(got[row].float(), exact_dequant(k2[3:4], "e4m3fn")[0])
    others = (loc >= 0) & (torch.arange(30) != row)
    assert torch.equal(got[others].float(), exact_dequant(k, "e4m3fn")[others])
    assert int((cache.data != first).sum()) > 0


def test_gather_of_unwritten_and_negative_slots_is_zero() -> None:
    """dequant_gather of unwritten or negative slots gives zero rows."""
    cache = V4PagedCache.empty(2, 64, "e4m3fnuz")
    out = dequant_gather(cache, torch.tensor([0, 127, -1, -9], dtype=torch.int32))
    assert out.shape == (4, HEAD_DIM) and int(out.count_nonzero()) == 0


# ----- contracts ----------------------------------------------------------------------------------------


def test_validators_accept_good_arguments() -> None:
    """pack_store and dequant_gather validation accepts good and empty arguments."""
    k, loc, cache = _setup()
    validate_pack_store(k, loc, cache, checked=True)
    validate_pack_store(k, loc.to(torch.int32), cache)
    validate_dequant_gather(cache, loc, checked=True)
    validate_pack_store(k[:0], loc[:0], cache, checked=True)


def _bad_pack_store_args(k: torch.Tensor, loc: torch.Tensor, cache: V4PagedCache) -> dict[str, tuple]:
    return {
        "k float32": (k.float(), loc, cache),
        "k shape": (k[:, :NOPE_DIM].contiguous(), loc, cache),
        "k rank": (k.reshape(-1), loc, cache),
        "k strided": (torch.cat([k, k], dim=1)[:, ::2], loc, cache),
        "k not a tensor": (k.tolist(), loc, cache),
        "loc float": (k, loc.float(), cache),
        "loc int16": (k, loc.to(torch.int16), cache),
        "loc length": (k, loc[1:], cache),
        "loc rank": (k, loc.unsqueeze(1), cache),
        "cache raw tensor": (k, loc, cache.data),
        "cache None": (k, loc, None),
        "cache bad bytes": (k, loc, V4PagedCache(cache.data[:, 1:].contiguous(), cache.page_size)),
        "cache bad flavour": (k, loc, V4PagedCache(cache.data, cache.page_size, "e5m2")),
    }


def test_validate_pack_store_rejects_bad_arguments() -> None:
    """pack_store validation refuses each bad argument, naming the op and argument."""
    for what, args in _bad_pack_store_args(*_setup()).items():
        with pytest.raises(InvalidArgumentError) as info:
            validate_pack_store(*args)
        assert info.value.op == "pack_store", what
        assert info.value.argument.split(".")[0] in what.split()[0], what


def test_validate_dequant_gather_rejects_bad_arguments() -> None:
    """dequant_gather validation refuses bad loc dtype or shape and bad caches."""
    _, loc, cache = _setup()
    bad = [(cache, loc.float()), (cache, loc.unsqueeze(0)), (cache.data, loc), (cache, None)]
    bad.append((V4PagedCache(cache.data.t(), cache.page_size), loc))
    for args in bad:
        with pytest.raises(InvalidArgumentError) as info:
            validate_dequant_gather(*args)
        assert info.value.op == "dequant_gather"


def test_checked_mode_reads_values() -> None:
    """Checked pack_store refuses a slot past the end; unchecked mode does not read values."""
    k, loc, cache = _setup()
    far = loc.clone()
    far[1] = cache.num_slots  # one past the end
    validate_pack_store(k, far, cache)  # unchecked mode never reads values
    with pytest.raises(InvalidArgumentError, match="slot id"):
        validate_pack_store(k, far, cache, checked=True)
    with pytest.raises(InvalidArgumentError, match="slot id"):
        validate_dequant_gather(cache, far, checked=True)
    very_negative = loc.clone()
    very_negative[0] = -(2**40)
    validate_pack_store(k, very_negative, cache)  # unchecked: not read
    with pytest.raises(InvalidArgumentError, match="slot id"):  # only -1 skips; other negatives are invalid
        validate_pack_store(k, very_negative, cache, checked=True)
    for poison in (float("nan"), float("inf")):
        bad = k.clone()
        bad[3, 100] = poison
        validate_pack_store(bad, loc, cache)
        with pytest.raises(InvalidArgumentError) as info:
            validate_pack_store(bad, loc, cache, checked=True)
        assert info.value.argument == "k"


def test_case_features() -> None:
    """pack_store and dequant_gather cases report fp8, page size and size class."""
    k, loc, cache = _setup(10, 2, "e4m3fnuz")
    f = case_pack_store(k, loc, cache)
    assert f == {"fp8": "e4m3fnuz", "page_size": 2, "size": "small"}
    hash(tuple(sorted(f.items())))
    big = torch.zeros(4096, dtype=torch.int64)
    assert case_dequant_gather(cache, big)["size"] == "large"
    assert case_dequant_gather(cache, big[:4095])["size"] == "small"
    assert case_pack_store(torch.zeros(4096, HEAD_DIM, dtype=torch.bfloat16), big, cache)["size"] == "large"


# ----- conformance catalog ------------------------------------------------------------------------------


def _run(spec: CaseSpec, seed: int = 0):
    fx = catalog.build(spec, torch.device("cpu"), torch.Generator().manual_seed(seed))
    ret = REFERENCE[spec.op](**fx.args)
    got = fx.extract(ret, fx.args) if fx.extract else ret
    return fx, got


def test_catalog_covers_the_matrix() -> None:
    """The cache catalogs cover the page size, ratio, fp8, kind and count matrix once each."""
    assert all(c.op == "pack_store" for c in catalog.CASES_PACK_STORE)
    assert all(c.op == "dequant_gather" for c in catalog.CASES_DEQUANT_GATHER)
    for cases in (catalog.CASES_PACK_STORE, catalog.CASES_DEQUANT_GATHER):
        names = [c.name for c in cases]
        assert len(names) == len(set(names))
        cells = {(c.params["page_size"], c.compress_ratio, c.params["fp8"], c.params["kind"], c.params["n"])
                 for c in cases}
        for ratio, p in ((0, 256), (4, 64), (128, 2)):
            for fp8 in FP8_FLAVORS:
                for n in (1, 64, 1000):
                    assert (p, ratio, fp8, "random", n) in cells
                for kind in ("zeros", "huge", "tiny", "pow2"):
                    assert any(c[:4] == (p, ratio, fp8, kind) for c in cells)
        assert all(set(c.modes) >= {"eager", "graph"} for c in cases)
    assert catalog.TOLERANCES["pack_store"].atol == 0 and catalog.TOLERANCES["pack_store"].rtol == 0
    assert catalog.TOLERANCES["dequant_gather"].atol == 0 and catalog.TOLERANCES["pack_store"].reason


ALL_CASES = catalog.CASES_PACK_STORE + catalog.CASES_DEQUANT_GATHER


@pytest.mark.parametrize("spec", ALL_CASES, ids=lambda s: f"{s.op}:{s.name}")
def test_reference_passes_conformance(spec: CaseSpec) -> None:
    """The reference passes every cache catalog case exactly, skipped rows exercised."""
    fx, got = _run(spec)
    err, ok, detail = fx.compare(got, fx.expected)
    assert ok and err == 0, detail
    if spec.params["n"] > 1:
        loc = fx.args["loc"]
        assert bool((loc < 0).any()) and bool((loc >= 0).any())  # skipped rows are exercised


def test_fixtures_are_deterministic_and_nontrivial() -> None:
    """Cache fixtures are deterministic per seed and an untouched cache fails them."""
    spec = next(c for c in catalog.CASES_PACK_STORE if c.params["kind"] == "random" and c.params["n"] == 64)
    a = catalog.build(spec, torch.device("cpu"), torch.Generator().manual_seed(5))
    b = catalog.build(spec, torch.device("cpu"), torch.Generator().manual_seed(5))
    assert torch.equal(a.args["k"], b.args["k"]) and torch.equal(a.args["loc"], b.args["loc"])
    assert torch.equal(a.expected, b.expected)
    assert int((a.expected != a.args["cache"].data).sum()) > 0  # the untouched cache does not already pass
    assert a.args["loc"].dtype == getattr(torch, spec.params["loc_dtype"])
    z = next(c for c in catalog.CASES_PACK_STORE if c.params["kind"] == "zeros")
    zk = catalog.build(z, torch.device("cpu"), torch.Generator().manual_seed(0)).args["k"]
    assert bool((zk == 0).all(dim=1).any())


def test_pack_store_compare_detects_one_wrong_byte() -> None:
    """The pack_store comparison fails one flipped byte, in data or page padding."""
    spec = next(c for c in catalog.CASES_PACK_STORE if c.params["page_size"] == 2 and c.params["n"] == 64)
    fx, got = _run(spec)
    for where in (0, fx.expected.shape[1] - 1):  # a nope byte; page padding
        bad = got.clone()
        bad[1, where] ^= 0x01
        err, ok, detail = fx.compare(bad, fx.expected)
        assert not ok and err == 1 and "page 1" in detail
    pad = 2 * 576 + 7  # slot 0's pad byte
    bad = got.clone()
    bad[0, pad] ^= 0xFF
    err, ok, detail = fx.compare(bad, fx.expected)
    assert not ok and "pad" in detail


def test_dirty_cache_case_keeps_foreign_bytes() -> None:
    """In the dirty-cache case the expected cache keeps every padding byte as it was."""
    spec = next(c for c in catalog.CASES_PACK_STORE if c.params.get("prefill") == "random")
    fx = catalog.build(spec, torch.device("cpu"), torch.Generator().manual_seed(0))
    before = fx.args["cache"].data.clone()
    p = spec.params["page_size"]
    pad = torch.tensor([p * 576 + t * 8 + 7 for t in range(p)] + list(range(p * 584, page_bytes(p))))
    assert torch.equal(fx.expected[:, pad], before[:, pad])
    assert int(before.count_nonzero()) > before.numel() // 2


def test_dequant_compare_rejects_nan_and_wrong_values() -> None:
    """The dequant_gather comparison fails NaN and wrong values."""
    spec = next(c for c in catalog.CASES_DEQUANT_GATHER if c.params["n"] == 64)
    fx, got = _run(spec)
    bad = got.clone()
    bad[0, 0] = float("nan")
    assert not fx.compare(bad, fx.expected)[1]
    row = int((fx.expected != 0).any(dim=1).nonzero()[0])
    bad = got.clone()
    bad[row, 5] = bad[row, 5] * 2 + 1
    assert not fx.compare(bad, fx.expected)[1]
