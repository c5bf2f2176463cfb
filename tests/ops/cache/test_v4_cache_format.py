"""The 584-byte V4 paged KV record: geometry, quantizer, byte placement, flavour conversion."""

from __future__ import annotations

import pytest
import torch

from dsv4hal.errors import InvalidArgumentError
from dsv4hal.formats.fp8 import FP8_FLAVORS, FP8_MAX
from dsv4hal.formats.v4_cache import (
    AMAX_FLOOR,
    HEAD_DIM,
    NOPE_DIM,
    NUM_TILES,
    PAGE_SIZE_BY_RATIO,
    RECORD_BYTES,
    TILE,
    TOKEN_BYTES,
    V4PagedCache,
    V4TokenRecords,
    convert_cache,
    dequantize_records,
    exact_dequant,
    page_bytes,
    quantize_tokens,
    read_records,
    scale_offset,
    write_records,
)

OTHER = {"e4m3fn": "e4m3fnuz", "e4m3fnuz": "e4m3fn"}
SUBNORMAL_STEP = {"e4m3fn": 2.0**-9, "e4m3fnuz": 2.0**-10}


def _keys(n: int, seed: int = 0, spread: int = 6) -> torch.Tensor:
    """bf16 keys whose tiles have magnitudes 2**-spread..2**spread."""
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(n, HEAD_DIM, generator=g)
    mag = torch.exp2(torch.randint(-spread, spread + 1, (n, NUM_TILES), generator=g).float())
    k[:, :NOPE_DIM] *= mag.repeat_interleave(TILE, dim=1)
    return k.to(torch.bfloat16)


def _tile_amax(k: torch.Tensor) -> torch.Tensor:
    """[N, 448] amax of each element's tile (floored like the quantizer)."""
    t = k[:, :NOPE_DIM].float().reshape(-1, NUM_TILES, TILE).abs().amax(-1).clamp_min(AMAX_FLOOR)
    return t.repeat_interleave(TILE, dim=1)


# ----- geometry -----------------------------------------------------------------------------------------


def test_constants() -> None:
    """The V4 cache constants and page size per ratio match the spec."""
    assert (NOPE_DIM, HEAD_DIM, TILE, NUM_TILES, RECORD_BYTES, TOKEN_BYTES) == (448, 512, 64, 7, 576, 584)
    assert PAGE_SIZE_BY_RATIO == {0: 256, 4: 64, 128: 2}


@pytest.mark.parametrize(
    "page_size, padded, scales", [(256, 149760, 147456), (128, 74880, 73728), (64, 37440, 36864), (2, 1728, 1152)]
)
def test_page_geometry_matches_spec_table(page_size: int, padded: int, scales: int) -> None:
    """Page bytes and scale offsets match the spec for each page size."""
    assert page_bytes(page_size) == padded
    assert scale_offset(page_size) == scales
    assert padded % RECORD_BYTES == 0 and padded >= page_size * TOKEN_BYTES
    assert V4PagedCache.empty(3, page_size).data.shape == (3, padded)


def test_empty_cache_properties() -> None:
    """An empty V4 cache is zeroed uint8 with the expected pages, slots and fp8."""
    c = V4PagedCache.empty(5, 64, "e4m3fnuz")
    assert c.num_pages == 5 and c.num_slots == 320 and c.device == torch.device("cpu")
    assert c.data.dtype == torch.uint8 and int(c.data.count_nonzero()) == 0 and c.fp8 == "e4m3fnuz"


def test_flashmla_view_strides_and_aliasing() -> None:
    """flashmla_view is an aliasing view with FlashMLA's shape and strides."""
    c = V4PagedCache.empty(3, 64)
    v = c.flashmla_view()
    assert v.shape == (3, 64, 1, 584) and v.dtype == torch.uint8
    assert v.stride() == (37440, 584, 584, 1)
    c.data[1, 5 * 584 + 3] = 77  # the view is not a copy
    assert int(v[1, 5, 0, 3]) == 77


def test_validate_rejects_bad_caches() -> None:
    """Cache validation refuses a wrong dtype, width, rank or page size."""
    good = V4PagedCache.empty(2, 64)
    good.validate("op", "cache")
    bad = [
        V4PagedCache(good.data.to(torch.int8), 64),
        V4PagedCache(good.data[:, :-576], 64),
        V4PagedCache(good.data.flatten(), 64),
        V4PagedCache(good.data, 64, "e5m2"),  # type: ignore[arg-type]
        V4PagedCache(good.data, 0),
        V4PagedCache(torch.zeros(page_bytes(64), 2, dtype=torch.uint8).t(), 64),
    ]
    for cache in bad:
        with pytest.raises(InvalidArgumentError):
            cache.validate("op", "cache")


# ----- quantizer ----------------------------------------------------------------------------------------


def test_hand_computed_e4m3fn_token() -> None:
    """A hand-built token quantizes to the hand-computed e4m3fn codes and scale bytes."""
    k = torch.zeros(1, HEAD_DIM)
    k[0, 0:4] = torch.tensor([448.0, 1.0, -2.0, 0.5])  # tile 0: amax 448 -> scale 2**0 -> byte 127
    k[0, 64:67] = torch.tensor([1.0, 0.5, -0.25])  # tile 1: amax 1 -> 2**ceil(log2(1/448)) = 2**-8 -> byte 119
    # tile 2 all zero: amax floors at 1e-4 -> 2**ceil(log2(1e-4/448)) = 2**-22 -> byte 105
    k[0, 192:195] = torch.tensor([3.0, 42 * 2.0**-7, 42.5 * 2.0**-7])  # tile 3: amax 3 -> 2**-7 -> byte 120
    k[0, 448:450] = torch.tensor([1.0, -3.5])
    rec = quantize_tokens(k.to(torch.bfloat16), "e4m3fn")
    assert rec.scale_exp[0, :4].tolist() == [127, 119, 105, 120]
    assert rec.nope[0, 0:4].tolist() == [0x7E, 0x38, 0xC0, 0x30]
    assert rec.nope[0, 64:67].tolist() == [0x78, 0x70, 0xE8]  # 256, 128, -64
    # 384 = 1.5 * 2**8; 42 is the tie between 40 and 44 -> even (40); 42.5 rounds up to 44.
    assert rec.nope[0, 192:195].tolist() == [0x7C, 0x62, 0x63]
    assert int(rec.nope[0, 128:192].count_nonzero()) == 0
    assert rec.rope.dtype == torch.bfloat16 and rec.rope[0, :2].tolist() == [1.0, -3.5]


def test_e4m3fnuz_quantization_saturates_at_240() -> None:
    """e4m3fnuz quantization uses 240 as its maximum and raises the scale above it."""
    k = torch.zeros(1, HEAD_DIM)
    k[0, 0], k[0, 64], k[0, 128], k[0, 192] = 240.0, -240.0, 256.0, 1.0  # 256 needs scale 2**1
    rec = quantize_tokens(k.to(torch.bfloat16), "e4m3fnuz")
    assert rec.scale_exp[0, :4].tolist() == [127, 127, 128, 120]  # 1/240 -> 2**-7
    assert rec.nope[0, [0, 64, 192]].tolist() == [0x7F, 0xFF, 0x78]  # +-240 codes; 1 * 2**7 = 128
    assert dequantize_records(rec, "e4m3fnuz")[0, [0, 64, 128, 192]].tolist() == [240.0, -240.0, 256.0, 1.0]
    assert FP8_MAX["e4m3fnuz"] == 240.0


@pytest.mark.parametrize("fp8", FP8_FLAVORS)
def test_quantization_error_bound(fp8: str) -> None:
    """Quantized keys stay within each tile's FP8 error bound, rope untouched."""
    k = _keys(256, seed=1)
    deq = exact_dequant(k, fp8)
    x = k.float()
    assert torch.isfinite(deq).all()
    assert torch.equal(deq[:, NOPE_DIM:], x[:, NOPE_DIM:])  # rope untouched
    x, deq = x[:, :NOPE_DIM], deq[:, :NOPE_DIM]
    err = (x - deq).abs()
    amax = _tile_amax(k)
    assert (err <= amax / 16).all()
    scale = torch.exp2(quantize_tokens(k, fp8).scale_exp.float() - 127).repeat_interleave(TILE, dim=1)
    # The scale is the smallest power of two that keeps amax within FP8_MAX.
    assert (amax / scale <= FP8_MAX[fp8]).all() and (amax / scale > FP8_MAX[fp8] / 2).all()
    # RNE: at most half an fp8 spacing (3 mantissa bits: |x| * 2**-4), or half the subnormal step.
    bound = torch.maximum(x.abs() * 2.0**-4, scale * SUBNORMAL_STEP[fp8] / 2)
    assert (err <= bound).all()
    assert float(err.max()) > 0  # the bound is not vacuous: rounding happened


@pytest.mark.parametrize("fp8", FP8_FLAVORS)
def test_powers_of_two_and_zeros_are_exact(fp8: str) -> None:
    """Powers of two and zeros round-trip exactly."""
    g = torch.Generator().manual_seed(2)
    j = torch.randint(-8, 9, (32, HEAD_DIM), generator=g).float()
    sign = torch.where(torch.rand(32, HEAD_DIM, generator=g) < 0.5, -1.0, 1.0)
    k = (sign * torch.exp2(j)).to(torch.bfloat16)
    k[::4] = 0.0
    # A tile spans at most 2**-8..2**8, so after scaling even the smallest lands on an fp8 (subnormal) code.
    deq = exact_dequant(k, fp8)
    assert torch.equal(deq, k.float())


def test_quantize_accepts_float32_input() -> None:
    """quantize_tokens gives the same records for fp32 and bf16 input."""
    k = _keys(4)
    a, b = quantize_tokens(k, "e4m3fn"), quantize_tokens(k.float(), "e4m3fn")
    assert torch.equal(a.nope, b.nope) and torch.equal(a.scale_exp, b.scale_exp) and torch.equal(a.rope, b.rope)


# ----- byte placement -----------------------------------------------------------------------------------


def _dirty_cache(num_pages: int, page_size: int, fp8: str = "e4m3fn") -> V4PagedCache:
    c = V4PagedCache.empty(num_pages, page_size, fp8)
    c.data.fill_(0xAB)
    return c


def test_write_places_bytes_per_layout() -> None:
    """write_records places each field at its layout offset and touches nothing else."""
    p = 64
    cache = _dirty_cache(3, p)
    before = cache.data.clone()
    k = _keys(2, seed=3)
    k[0, NOPE_DIM] = 1.0  # bf16 0x3F80 -> little-endian bytes 0x80, 0x3F
    rec = quantize_tokens(k, "e4m3fn")
    loc = torch.tensor([2 * p + 5, -1], dtype=torch.int32)  # page 2, offset 5; row 1 skipped
    write_records(cache, loc, rec)
    page = cache.data[2]
    assert torch.equal(page[5 * 576 : 5 * 576 + 448], rec.nope[0])
    rope_bytes = page[5 * 576 + 448 : 6 * 576]
    assert rope_bytes[:2].tolist() == [0x80, 0x3F]
    assert torch.equal(rope_bytes, rec.rope[0].contiguous().view(torch.uint8))
    assert torch.equal(page[p * 576 + 5 * 8 : p * 576 + 5 * 8 + 7], rec.scale_exp[0])
    assert int(page[p * 576 + 5 * 8 + 7]) == 0xAB  # pad byte never written
    # Nothing else changed: exactly 576 + 7 bytes of page 2 may differ.
    changed = torch.ones_like(before, dtype=torch.bool)
    changed[2, 5 * 576 : 6 * 576] = False
    changed[2, p * 576 + 40 : p * 576 + 47] = False
    assert torch.equal(cache.data[changed], before[changed])


@pytest.mark.parametrize("page_size", [256, 64, 2, 3])
def test_write_read_round_trip(page_size: int) -> None:
    """write_records then read_records round-trips for every page size."""
    n = 40
    cache = V4PagedCache.empty(-(-2 * n // page_size) + 1, page_size)
    g = torch.Generator().manual_seed(4)
    loc = torch.randperm(cache.num_slots, generator=g)[:n]
    loc[::5] = -1
    k = _keys(n, seed=5)
    rec = quantize_tokens(k, "e4m3fn")
    write_records(cache, loc, rec)
    back = read_records(cache, loc)
    keep = loc >= 0
    assert torch.equal(back.nope[keep], rec.nope[keep])
    assert torch.equal(back.scale_exp[keep], rec.scale_exp[keep])
    assert torch.equal(back.rope[keep], rec.rope[keep])
    assert int(back.nope[~keep].count_nonzero()) == 0 and int(back.scale_exp[~keep].count_nonzero()) == 0
    assert int(back.rope[~keep].count_nonzero()) == 0
    # Each record lands where page/offset arithmetic says.
    for i in (1, 2):
        page, off = divmod(int(loc[i]), page_size)
        assert torch.equal(cache.data[page, off * 576 : off * 576 + 448], rec.nope[i])


def test_negative_locations_are_skipped() -> None:
    """Negative locations are skipped and leave the cache's bytes."""
    cache = _dirty_cache(2, 64)
    before = cache.data.clone()
    rec = quantize_tokens(_keys(3), "e4m3fn")
    write_records(cache, torch.tensor([-1, -5, -1000]), rec)
    assert torch.equal(cache.data, before)
    write_records(cache, torch.tensor([7, -1, -3]), rec)
    assert torch.equal(read_records(cache, torch.tensor([7])).nope[0], rec.nope[0])
    untouched = torch.ones_like(before, dtype=torch.bool)
    untouched[0, 7 * 576 : 8 * 576] = False
    untouched[0, 64 * 576 + 56 : 64 * 576 + 63] = False
    assert torch.equal(cache.data[untouched], before[untouched])


def test_write_with_no_rows_is_a_no_op() -> None:
    """Writing no rows leaves the cache unchanged."""
    cache = _dirty_cache(1, 2)
    before = cache.data.clone()
    write_records(cache, torch.empty(0, dtype=torch.int64), quantize_tokens(torch.zeros(0, HEAD_DIM), "e4m3fn"))
    assert torch.equal(cache.data, before)


# ----- flavour conversion -------------------------------------------------------------------------------


def _written_cache(fp8: str, k: torch.Tensor, page_size: int = 64) -> tuple[V4PagedCache, torch.Tensor]:
    cache = V4PagedCache.empty(-(-2 * k.shape[0] // page_size) + 1, page_size, fp8)
    loc = torch.arange(k.shape[0]) * 2 + 1  # every other slot stays unwritten
    write_records(cache, loc, quantize_tokens(k, fp8))
    return cache, loc


def _decoded(cache: V4PagedCache) -> torch.Tensor:
    return dequantize_records(read_records(cache, torch.arange(cache.num_slots)), cache.fp8)


def test_convert_fn_to_fnuz_is_lossless_and_round_trips() -> None:
    """Converting e4m3fn to e4m3fnuz is lossless, -0 included, and round-trips."""
    k = _keys(100, seed=6, spread=10)
    k[3, :TILE] = -0.0  # -0 codes (0x80) are NaN in fnuz
    k[4, :4] = -1e-30  # rounds to -0 as well
    fn, _ = _written_cache("e4m3fn", k)
    assert int((read_records(fn, torch.tensor([7, 9])).nope == 0x80).sum()) > 0
    fnuz = convert_cache(fn, "e4m3fnuz")
    assert fnuz.fp8 == "e4m3fnuz" and fnuz.data.data_ptr() != fn.data.data_ptr()
    assert torch.equal(_decoded(fnuz), _decoded(fn))
    assert not torch.isnan(_decoded(fnuz)).any()
    back = convert_cache(fnuz, "e4m3fn")
    assert torch.equal(_decoded(back), _decoded(fn))
    # Bytes round-trip too, except -0 codes, which become +0.
    slots = torch.arange(fn.num_slots)
    a, b = read_records(fn, slots), read_records(back, slots)
    assert torch.equal(b.nope, torch.where(a.nope == 0x80, 0, a.nope))
    assert torch.equal(b.scale_exp, a.scale_exp) and torch.equal(b.rope, a.rope)
    # In fnuz the written scale bytes are one higher (same bits, half the value).
    c = read_records(fnuz, slots)
    assert torch.equal(c.scale_exp, torch.where(a.scale_exp == 0, 0, a.scale_exp + 1))


def test_convert_fnuz_to_fn_handles_240_tiles() -> None:
    """Converting e4m3fnuz to e4m3fn keeps 240 tiles and tiny values."""
    k = _keys(50, seed=7)
    k[0, :TILE] = 0.0
    k[0, 0], k[0, 1], k[0, 2] = 240.0, -240.0, 2.0**-10  # 0x7F/0xFF codes, and a value below fn's subnormal step
    fnuz, loc = _written_cache("e4m3fnuz", k)
    slots = torch.arange(fnuz.num_slots)
    src = read_records(fnuz, slots)
    assert src.nope[1, :3].tolist() == [0x7F, 0xFF, 0x01]  # slot 1 holds row 0
    fn = convert_cache(fnuz, "e4m3fn")
    assert fn.fp8 == "e4m3fn"
    dst = read_records(fn, slots)
    tiles = src.nope.reshape(-1, NUM_TILES, TILE)
    recast = (((tiles & 0x7F) == 0x7F) | (tiles == 0x80)).any(-1)
    assert bool(recast[1, 0]) and int((~recast & (src.scale_exp > 0)).sum()) > 300
    # Re-cast tiles keep their exponent, the others shift by one; unwritten slots (byte 0) stay 0.
    want_scale = torch.where(recast | (src.scale_exp == 0), src.scale_exp, src.scale_exp - 1)
    assert torch.equal(dst.scale_exp, want_scale)
    got, want = _decoded(fn), _decoded(fnuz)
    assert not torch.isnan(got).any()
    assert got[1, :3].tolist() == [240.0, -240.0, 0.0]  # 2**-10 is a tie between 0 and 2**-9: even -> 0
    # Lossy only below e4m3fn's subnormal step 2**-9 (half of it, scaled); exact in shifted tiles.
    src_scale = torch.exp2(src.scale_exp.float() - 127).repeat_interleave(TILE, dim=1)
    err = (got - want)[:, :NOPE_DIM].abs()
    assert (err <= src_scale * 2.0**-10).all()
    shifted = (~recast).repeat_interleave(TILE, dim=1)
    assert torch.equal(got[:, :NOPE_DIM][shifted], want[:, :NOPE_DIM][shifted])
    assert torch.equal(got[:, NOPE_DIM:], want[:, NOPE_DIM:])


def test_convert_keeps_unwritten_slots_rope_pad_and_padding() -> None:
    """Cache conversion keeps unwritten slots, rope pad and page padding bytes."""
    for fp8 in FP8_FLAVORS:
        cache, loc = _written_cache(fp8, _keys(10, seed=8), page_size=2)
        p, pb = 2, page_bytes(2)
        pad = torch.tensor([p * 576 + t * 8 + 7 for t in range(p)] + list(range(p * 584, pb)))
        cache.data[:, pad] = 0x5A
        out = convert_cache(cache, OTHER[fp8])
        assert torch.equal(out.data[:, pad], cache.data[:, pad])
        slots = torch.arange(cache.num_slots)
        a, b = read_records(cache, slots), read_records(out, slots)
        assert torch.equal(a.rope, b.rope)
        unwritten = torch.ones(cache.num_slots, dtype=torch.bool)
        unwritten[loc] = False
        assert int(b.nope[unwritten].count_nonzero()) == 0 and int(b.scale_exp[unwritten].count_nonzero()) == 0
        same = convert_cache(cache, fp8)
        assert torch.equal(same.data, cache.data) and same.data.data_ptr() != cache.data.data_ptr()


def test_convert_never_turns_nan_into_a_number() -> None:
    """Cache conversion keeps NaN codes NaN."""
    cache = V4PagedCache.empty(1, 2, "e4m3fn")
    cache.data[0, 0:3] = torch.tensor([0x7F, 0xFF, 0x10], dtype=torch.uint8)  # NaN, NaN, a value
    cache.data[0, 2 * 576 : 2 * 576 + 7] = 120
    fnuz = convert_cache(cache, "e4m3fnuz")
    vals = _decoded(fnuz)[0, :3]
    assert torch.isnan(vals[:2]).all() and torch.equal(vals[2:], _decoded(cache)[0, 2:3])
    fn = convert_cache(fnuz, "e4m3fn")
    assert torch.isnan(_decoded(fn)[0, :2]).all()


def test_records_dataclass_fields() -> None:
    """V4TokenRecords fields have the spec's shapes and dtypes."""
    rec = quantize_tokens(_keys(3), "e4m3fn")
    assert isinstance(rec, V4TokenRecords)
    assert (rec.nope.shape, rec.scale_exp.shape, rec.rope.shape) == ((3, 448), (3, 7), (3, 64))
    assert (rec.nope.dtype, rec.scale_exp.dtype, rec.rope.dtype) == (torch.uint8, torch.uint8, torch.bfloat16)
