"""Unchecked mode keeps bad index-like arguments inside the caller's buffers (docs/unchecked-indices.md).

Each test puts every buffer an op reads or writes in guarded memory (tests/guard_memory.py), injects one bad
value (-1, another negative, or one past the end) into one index-like argument, and checks that the reference and
each portable Triton kernel touch nothing outside the buffers and give the documented result for it (a skipped
row, a zero row, a skipped key, a dropped route). Triton runs under its interpreter on the CPU, or on the GPU."""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch
from conftest import TRITON_DEVICE
from guard_memory import Guards, assert_confined

import dsv4hal
from dsv4hal.formats.indexer_cache import IndexerPagedCache
from dsv4hal.formats.v4_cache import V4PagedCache
from dsv4hal.kernels.triton import sparse_attention as triton_attention
from dsv4hal.ops.attention_metadata import AttentionMetadata
from dsv4hal.reference import attention_metadata as ref_meta
from dsv4hal.reference import indexer_store as ref_istore
from dsv4hal.reference import indexer_topk as ref_topk
from dsv4hal.reference import pack_store as ref_pack
from dsv4hal.reference import sparse_attention as ref_attn
from dsv4hal.reference.moe import ExpertWeights, quantize_experts
from dsv4hal.reference.moe import moe_experts as ref_moe

pytest.importorskip("triton")

DEV = TRITON_DEVICE
REF = "torch_reference"
BAD = ("minus_one", "other_negative", "end")  # -1, -7, the first value past the valid range


def bad_value(kind: str, end: int) -> int:
    return {"minus_one": -1, "other_negative": -7, "end": end}[kind]


def bound(op: str, impl: str) -> dsv4hal.Platform:
    """A platform whose `op` runs `impl` on DEV: the CPU platform (Triton under its interpreter) or the GPU's."""
    with dsv4hal.overrides(kernels={op: impl}):
        return dsv4hal.select_platform("cpu" if DEV.type == "cpu" else None)


def _gen() -> torch.Generator:
    return torch.Generator().manual_seed(0)


@functools.cache
def _full_cache(pages: int, page_size: int) -> V4PagedCache:
    """A CPU cache whose every slot holds a random key (never written: the tests copy it into guarded memory)."""
    cache = V4PagedCache.empty(pages, page_size)
    n = cache.num_slots
    ref_pack.pack_store(torch.randn(n, 512, generator=_gen()).bfloat16(), torch.arange(n), cache)
    return cache


def _guarded_cache(guard: Guards, cache: V4PagedCache) -> V4PagedCache:
    return V4PagedCache(guard(cache.data.to(DEV)), cache.page_size, cache.fp8)


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal up to the rounding a different summation order gives (bf16 outputs); inf where the other is inf."""
    a, b = a.float().cpu(), b.float().cpu()
    return bool(torch.equal(a.isinf(), b.isinf()) and not a.isnan().any()
                and torch.allclose(a.nan_to_num(posinf=0.0), b.nan_to_num(posinf=0.0), atol=2e-2, rtol=2e-2))


# ----- pack_store / dequant_gather: loc -----

PACK_IMPLS = (REF, "triton_pack_store")
GATHER_IMPLS = (REF, "triton_dequant_gather")
PAGE, PAGES = 64, 2  # 128 slots


@pytest.mark.parametrize("bad", BAD)
@pytest.mark.parametrize("impl", PACK_IMPLS)
def test_pack_store_bad_loc_skips_the_row(impl: str, bad: str) -> None:
    """pack_store: a loc of -1, another negative or num_slots writes nothing, inside or outside the cache."""
    p = bound("pack_store", impl)
    base = V4PagedCache.empty(PAGES, PAGE)
    k = torch.randn(3, 512, generator=_gen()).bfloat16()
    loc = torch.tensor([5, bad_value(bad, base.num_slots), 70])

    def build(guard: Guards):  # noqa: ANN202
        cache, kk, ll = _guarded_cache(guard, base), guard(k.to(DEV)), guard(loc.to(DEV))
        return (lambda: (p.ops.pack_store(kk, ll, cache), cache.data)[1]), [cache.data]

    got = assert_confined(build)
    want = V4PagedCache.empty(PAGES, PAGE)
    ref_pack.pack_store(k[[0, 2]], loc[[0, 2]], want)
    assert torch.equal(got.cpu(), want.data)


@pytest.mark.parametrize("bad", BAD)
@pytest.mark.parametrize("impl", GATHER_IMPLS)
def test_dequant_gather_bad_loc_gives_a_zero_row(impl: str, bad: str) -> None:
    """dequant_gather: a loc of -1, another negative or num_slots gives a zero row and reads nothing outside."""
    p = bound("dequant_gather", impl)
    base = _full_cache(PAGES, PAGE)
    loc = torch.tensor([5, bad_value(bad, base.num_slots), 70])

    def build(guard: Guards):  # noqa: ANN202
        cache, ll = _guarded_cache(guard, base), guard(loc.to(DEV))
        return (lambda: p.ops.dequant_gather(cache, ll)), []

    got = assert_confined(build).cpu()
    assert torch.equal(got[1], torch.zeros(512, dtype=torch.bfloat16))
    assert torch.equal(got[[0, 2]], ref_pack.dequant_gather(base, loc[[0, 2]]))


# ----- indexer_store: loc -----

@pytest.mark.parametrize("bad", BAD)
@pytest.mark.parametrize("impl", (REF, "triton_indexer_store"))
def test_indexer_store_bad_loc_skips_the_row(impl: str, bad: str) -> None:
    """indexer_store: a loc of -1, another negative or num_slots writes nothing, inside or outside the cache."""
    p = bound("indexer_store", impl)
    k = torch.randn(3, 128, generator=_gen())
    loc = torch.tensor([5, bad_value(bad, 2 * 64), 70])

    def build(guard: Guards):  # noqa: ANN202
        cache = IndexerPagedCache(guard(torch.zeros(2, 8448, dtype=torch.uint8, device=DEV)))
        kk, ll = guard(k.to(DEV)), guard(loc.to(DEV))
        return (lambda: (p.ops.indexer_store(kk, ll, cache), cache.data)[1]), [cache.data]

    got = assert_confined(build)
    want = IndexerPagedCache.empty(2)
    ref_istore.indexer_store(k[[0, 2]], loc[[0, 2]], want)
    assert torch.equal(got.cpu(), want.data)


# ----- sparse attention: indices and lengths -----

H, W = 64, 64
SCALE = 512 ** -0.5
DECODE_ARGS = ("swa_indices", "swa_lengths", "extra_indices", "extra_lengths")


@pytest.fixture()
def one_split(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under the interpreter, the attention kernel's single-split launch (a third of the split-K launch's time);
    a GPU runs the tuned split-K launch with its combine kernel."""
    if DEV.type == "cpu":
        monkeypatch.setitem(triton_attention.CONFIG, "programs", 1)


def _decode_inputs() -> dict[str, object]:
    g = _gen()
    swa, extra = _full_cache(1, 256), _full_cache(2, 64)
    return dict(q=torch.randn(1, H, 512, generator=g).bfloat16(), swa_cache=swa,
                swa_indices=torch.randint(0, swa.num_slots, (1, W), generator=g, dtype=torch.int32),
                swa_lengths=torch.tensor([W], dtype=torch.int32), sink=torch.randn(H, generator=g),
                softmax_scale=SCALE, extra_cache=extra,
                extra_indices=torch.randint(0, extra.num_slots, (1, W), generator=g, dtype=torch.int32),
                extra_lengths=torch.tensor([W], dtype=torch.int32))


def _inject(args: dict[str, object], name: str, bad: str, end: int) -> tuple[dict, dict]:
    """(args with one bad value in `name`, the reference arguments of the documented result): a bad index of row 0
    is skipped (moved past the row's length: the same key set), a negative length is 0, one past W is W."""
    bad_args, want = dict(args), dict(args)
    t = args[name].clone()  # type: ignore[union-attr]
    if name.endswith("indices"):
        lengths = name.replace("indices", "lengths")
        t[0, 3] = bad_value(bad, end)
        bad_args[name] = t
        moved = t.clone()
        moved[0, 3], moved[0, W - 1] = t[0, W - 1], t[0, 3]  # the bad entry last, then cut by the length
        want[name] = moved
        want[lengths] = args[lengths].clone()  # type: ignore[union-attr]
        want[lengths][0] = W - 1
    else:
        t[0] = bad_value(bad, W + 1)
        bad_args[name] = t
        want[name] = t.clamp(0, W)
    return bad_args, want


def _decode_end(args: dict[str, object], name: str) -> int:
    cache = args["swa_cache" if name.startswith("swa") else "extra_cache"]
    return cache.num_slots  # type: ignore[union-attr]


@pytest.mark.parametrize("bad", BAD)
@pytest.mark.parametrize("name", DECODE_ARGS)
@pytest.mark.parametrize("impl", (REF, "triton_sparse_decode"))
@pytest.mark.usefixtures("one_split")
def test_sparse_decode_bad_index_or_length_stays_inside(impl: str, name: str, bad: str) -> None:
    """sparse_attention_decode: a bad index is a skipped key, a negative length no key, a length past W all W."""
    p = bound("sparse_attention_decode", impl)
    args = _decode_inputs()
    if name.startswith("swa"):  # SWA-only decode (the kernel's variant without the extra list): half the keys
        args = {k: v for k, v in args.items() if not k.startswith("extra")}
    bad_args, want_args = _inject(args, name, bad, _decode_end(args, name))

    def build(guard: Guards):  # noqa: ANN202
        kw = {k: _guarded_cache(guard, v) if isinstance(v, V4PagedCache) else
              guard(v.to(DEV)) if isinstance(v, torch.Tensor) else v for k, v in bad_args.items()}
        return (lambda: p.ops.sparse_attention_decode(**kw)), []

    out, lse = assert_confined(build)
    want_out, want_lse = ref_attn.sparse_attention_decode(**want_args)
    assert _close(out, want_out) and _close(lse, want_lse)


def _prefill_inputs() -> dict[str, object]:
    g = _gen()
    s = 100
    return dict(q=torch.randn(1, H, 512, generator=g).bfloat16(), kv=torch.randn(s, 512, generator=g).bfloat16(),
                indices=torch.randint(0, s, (1, W), generator=g, dtype=torch.int32),
                lengths=torch.tensor([W], dtype=torch.int32), sink=torch.randn(H, generator=g),
                softmax_scale=SCALE)


@pytest.mark.parametrize("bad", BAD)
@pytest.mark.parametrize("name", ("indices", "lengths"))
@pytest.mark.parametrize("impl", (REF, "triton_sparse_prefill"))
@pytest.mark.usefixtures("one_split")
def test_sparse_prefill_bad_index_or_length_stays_inside(impl: str, name: str, bad: str) -> None:
    """sparse_attention_prefill: a bad index is a skipped key, a negative length no key, a length past W all W."""
    p = bound("sparse_attention_prefill", impl)
    args = _prefill_inputs()
    bad_args, want_args = _inject(args, name, bad, args["kv"].shape[0])  # type: ignore[union-attr]

    def build(guard: Guards):  # noqa: ANN202
        kw = {k: guard(v.to(DEV)) if isinstance(v, torch.Tensor) else v for k, v in bad_args.items()}
        return (lambda: p.ops.sparse_attention_prefill(**kw)), []

    out, lse = assert_confined(build)
    want_out, want_lse = ref_attn.sparse_attention_prefill(**want_args)
    assert _close(out, want_out) and _close(lse, want_lse)


# ----- indexer_topk: lengths and the page table's width -----

K_TOPK = 512
# score width per kernel: 10 pages of 64 candidates, or past 16384 for the kernel that takes only wide rows
TOPK_WIDTH = {REF: 640, "triton_radix_topk": 640, "triton_row_topk": 640, "triton_sampled_topk": 640,
              "triton_chunked_topk": 16384 + 640}


def _topk_call(p: dsv4hal.Platform, scores: torch.Tensor, lengths: torch.Tensor, table: torch.Tensor):  # noqa: ANN202
    def build(guard: Guards):  # noqa: ANN202
        s, n, pt = guard(scores.to(DEV)), guard(lengths.to(DEV)), guard(table.to(DEV))

        def call() -> tuple[torch.Tensor, torch.Tensor]:
            # a row's order is unspecified (the radix kernel places ties by atomics on a GPU): compared sorted
            raw, pages = p.ops.indexer_topk(s, n, K_TOPK, pt)
            order = raw.argsort(dim=1)
            return raw.gather(1, order), pages.gather(1, order)
        return call, []

    raw, pages = assert_confined(build)
    return raw.cpu(), pages.cpu()


def _sorted(t: torch.Tensor) -> torch.Tensor:
    return t.sort(dim=1).values


@pytest.mark.parametrize("bad", BAD)
@pytest.mark.parametrize("impl", TOPK_WIDTH)
def test_indexer_topk_bad_length_stays_inside(impl: str, bad: str) -> None:
    """indexer_topk: a negative length selects nothing (all -1), a length past S selects among the S scores."""
    p, width = bound("indexer_topk", impl), TOPK_WIDTH[impl]
    g = _gen()
    scores = torch.randn(2, width, generator=g)
    table = torch.randint(0, 50, (2, width // 64), generator=g, dtype=torch.int32)
    lengths = torch.tensor([bad_value(bad, width + 1), width - 40], dtype=torch.int32)
    raw, pages = _topk_call(p, scores, lengths, table)
    want_raw, want_pages = ref_topk.indexer_topk(scores, lengths.clamp(0, width), K_TOPK, table)
    assert torch.equal(_sorted(raw), _sorted(want_raw)) and torch.equal(_sorted(pages), _sorted(want_pages))


@pytest.mark.parametrize("impl", TOPK_WIDTH)
def test_indexer_topk_short_page_table_gives_minus_one_slots(impl: str) -> None:
    """indexer_topk: a candidate whose page is past the page table's width gets page slot -1, read nothing."""
    p, width = bound("indexer_topk", impl), TOPK_WIDTH[impl]
    g = _gen()
    scores = torch.randn(2, width, generator=g)
    scores[:, -64:] += 10.0  # the last page's candidates are selected
    table = torch.randint(0, 50, (2, width // 64 - 1), generator=g, dtype=torch.int32)  # one page short
    lengths = torch.tensor([width, width], dtype=torch.int32)
    raw, pages = _topk_call(p, scores, lengths, table)
    assert bool((raw >= width - 64).any())
    assert bool((pages[raw >= width - 64] == -1).all()) and bool((pages[(raw >= 0) & (raw < width - 64)] >= 0).all())


@pytest.mark.parametrize("bad", BAD)
@pytest.mark.parametrize("impl", TOPK_WIDTH)
def test_indexer_topk_bad_page_id_is_only_a_value(impl: str, bad: str) -> None:
    """indexer_topk: a page id of -1, another negative or past the pool addresses no memory; its candidates' slots
    are page * 64 + offset, as the reference gives them."""
    p, width = bound("indexer_topk", impl), TOPK_WIDTH[impl]
    g = _gen()
    scores = torch.randn(2, width, generator=g)
    scores[0, :64] += 10.0  # row 0's first page's candidates are selected
    table = torch.randint(0, 50, (2, width // 64), generator=g, dtype=torch.int32)
    table[0, 0] = bad_value(bad, 50)
    lengths = torch.tensor([width, width], dtype=torch.int32)
    raw, pages = _topk_call(p, scores, lengths, table)
    want_raw, want_pages = ref_topk.indexer_topk(scores, lengths, K_TOPK, table)
    assert torch.equal(_sorted(raw), _sorted(want_raw)) and torch.equal(_sorted(pages), _sorted(want_pages))
    first = (raw[0] >= 0) & (raw[0] < 64)
    assert bool(first.any()) and torch.equal(pages[0][first], table[0, 0] * 64 + raw[0][first])


# ----- moe_experts: topk_ids -----

E_MOE = 8


@functools.cache
def _moe_weights() -> ExpertWeights:
    """MXFP4 experts, H 128, I 64, on the CPU."""
    g = _gen()
    return quantize_experts(torch.randn(E_MOE, 128, 128, generator=g) / 11,
                            torch.randn(E_MOE, 128, 64, generator=g) / 8, "mxfp4", "e4m3fn")


@pytest.mark.parametrize("bad", BAD)
@pytest.mark.parametrize("impl", (REF, "triton_fused_moe"))
def test_moe_experts_bad_id_is_a_dropped_route(impl: str, bad: str) -> None:
    """moe_experts: an id of -1, another negative or E is a dropped route (contributes 0), read nothing outside."""
    p = bound("moe_experts", impl)
    g = _gen()
    w = _moe_weights()
    x = torch.randn(3, 128, generator=g).bfloat16()
    ids = torch.tensor([[1, bad_value(bad, E_MOE)], [2, 5], [7, 0]], dtype=torch.int32)
    weights = torch.rand(3, 2, generator=g) + 0.5
    prepared = p.ops.moe_experts.prepare_weights(dataclasses.replace(
        w, **{f.name: getattr(w, f.name).to(DEV) for f in dataclasses.fields(w)
              if isinstance(getattr(w, f.name), torch.Tensor)}))

    def build(guard: Guards):  # noqa: ANN202
        payload = prepared.payload
        moved = dataclasses.replace(payload, **{f.name: guard(getattr(payload, f.name))
                                                for f in dataclasses.fields(payload)
                                                if isinstance(getattr(payload, f.name), torch.Tensor)})
        xx, ii, ww = guard(x.to(DEV)), guard(ids.to(DEV)), guard(weights.to(DEV))
        return (lambda: p.ops.moe_experts(xx, ii, ww, dataclasses.replace(prepared, payload=moved))), []

    got = assert_confined(build).cpu().float()
    valid = (ids >= 0) & (ids < E_MOE)
    want = ref_moe(x, torch.where(valid, ids, 0), weights * valid, w).float()  # the route at zero weight
    assert torch.allclose(got, want, atol=3e-2, rtol=3e-2) and not got.isnan().any()


# ----- build_attention_metadata: positions and page ids -----

META_PAGES, META_F2S = 2, 4 * 256  # page table width; full_to_swa covers 4 pages


def _meta_inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    positions = torch.tensor([300, 130, 511], dtype=torch.int32)
    table = torch.tensor([[0, 3], [2, 1], [1, 0]], dtype=torch.int32)
    return positions, table, torch.arange(META_F2S, dtype=torch.int32) % 384


def _meta_call(p: dsv4hal.Platform, positions: torch.Tensor, table: torch.Tensor, f2s: torch.Tensor):  # noqa: ANN202
    def build(guard: Guards):  # noqa: ANN202
        out = AttentionMetadata(*(guard(getattr(e, f.name).to(DEV)) for e in [AttentionMetadata.empty(3, META_PAGES)]
                                  for f in dataclasses.fields(AttentionMetadata)))
        pos, pt, m = guard(positions.to(DEV)), guard(table.to(DEV)), guard(f2s.to(DEV))
        return (lambda: dataclasses.astuple(p.ops.build_attention_metadata(pos, pt, m, 512, out))), []

    return [t.cpu() for t in assert_confined(build)]


@pytest.mark.parametrize("bad", BAD)
@pytest.mark.parametrize("impl", (REF, "triton_attention_metadata"))
def test_attention_metadata_bad_position_stays_inside(impl: str, bad: str) -> None:
    """build_attention_metadata: a position that is negative or past the page table gives -1 SWA entries for the
    positions outside the table and output locations 0, and reads nothing outside."""
    p = bound("build_attention_metadata", impl)
    positions, table, f2s = _meta_inputs()
    positions[1] = bad_value(bad, META_PAGES * 256)
    got = _meta_call(p, positions, table, f2s)
    want = dataclasses.astuple(ref_meta.build_attention_metadata(positions, table, f2s, 512))
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    swa, c4_out, c128_out = got[0], got[6], got[7]
    assert int(swa[1, 0]) == -1 and int(c4_out[1]) == 0 and int(c128_out[1]) == 0
    if bad != "end":  # any negative position is an unused row, as -1: no SWA key, no compressed position
        assert bool((swa[1] == -1).all()) and int(got[1][1]) == 0 and int(got[2][1]) == 0


@pytest.mark.parametrize("bad", BAD)
@pytest.mark.parametrize("impl", (REF, "triton_attention_metadata"))
def test_attention_metadata_bad_page_id_gives_minus_one_swa_entries(impl: str, bad: str) -> None:
    """build_attention_metadata: a page id of -1, another negative or past full_to_swa makes that page's SWA entries
    -1 and reads nothing outside full_to_swa."""
    p = bound("build_attention_metadata", impl)
    positions, table, f2s = _meta_inputs()
    table[1, 0] = bad_value(bad, META_F2S // 256)  # row 1's position 130 lies on page 0
    got = _meta_call(p, positions, table, f2s)
    want = dataclasses.astuple(ref_meta.build_attention_metadata(positions, table, f2s, 512))
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    assert bool((got[0][1, :128] == -1).all())  # positions 130 .. 3: all on the bad page



@pytest.mark.parametrize("bad", BAD)
@pytest.mark.parametrize("impl", (REF, "triton_attention_metadata"))
def test_attention_metadata_bad_full_to_swa_entry_is_only_a_value(impl: str, bad: str) -> None:
    """build_attention_metadata: a full_to_swa entry of -1, another negative or past the SWA pool is copied into
    swa_indices as it is (whose consumers skip it), and addresses no memory."""
    p = bound("build_attention_metadata", impl)
    positions, table, f2s = _meta_inputs()
    f2s[2 * 256 + 130] = bad_value(bad, 384)  # row 1's position 130 on its page 2
    got = _meta_call(p, positions, table, f2s)
    want = dataclasses.astuple(ref_meta.build_attention_metadata(positions, table, f2s, 512))
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
    assert int(got[0][1, 0]) == bad_value(bad, 384)
