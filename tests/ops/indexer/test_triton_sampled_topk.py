"""triton_sampled_topk (a threshold from sampled scores, one filtering read into a candidate tile, the exact select
there, and for the rows whose estimate missed the chunked top-k inside the same launch): the indexer_topk contract
on wide rows (both k, lengths 0, < k, == k, > S, random, heavy ties, all equal, +-inf, NaN, with and without a page
table), which rows take the fast path and which fall back, the fallback's exact outputs and order (every row forced
onto it; equal to triton_row_topk's), small tiles through the config, the conformance catalog's size=large cases
forced through the platform, and the registration. Under the interpreter on CPU machines, natively on a GPU."""

from __future__ import annotations

import pytest
import torch
from topk_forced import DEV, assert_cell_passes, batch, check_rows, forced_platform, table, wide_catalog

import dsv4hal
from dsv4hal.reference.indexer_topk import page_transform

pytest.importorskip("triton")

pytestmark = pytest.mark.slow  # minutes under the Triton interpreter: the whole suite runs it

from dsv4hal.kernels.triton import topk_chunked, topk_row, topk_sampled  # noqa: E402

NAME = "triton_sampled_topk"
CATALOG = wide_catalog(NAME)


def _run(scores: torch.Tensor, lengths: torch.Tensor, k: int, pt: torch.Tensor | None = None, page_size: int = 64,
         config: dict | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    return topk_sampled.indexer_topk(scores.to(DEV), lengths.to(DEV), k, None if pt is None else pt.to(DEV),
                                     page_size, config=config)


def _run_flagged(scores: torch.Tensor, lengths: torch.Tensor, k: int, pt: torch.Tensor | None = None,
                 config: dict | None = None) -> tuple[tuple[torch.Tensor, torch.Tensor | None], list[int]]:
    """_run, and which rows the fallback computed (config "flags": 1 for those, 0 for the others)."""
    flags = torch.full((scores.shape[0],), -1, dtype=torch.int32, device=DEV)
    got = _run(scores, lengths, k, pt, config={**(config or {}), "flags": flags})
    return got, flags.cpu().tolist()


def _check_fallback_order(raw: torch.Tensor, scores: torch.Tensor, lengths: torch.Tensor, k: int,
                          flags: list[int]) -> None:
    """Flagged rows of widths the chunked fallback holds equal triton_row_topk's outputs, order included (another
    kernel: one register tile a row, no chunks; triton_chunked_topk past its 16384 scores), as the fallback's
    contract says: deterministic, unlike the fast path."""
    s = scores.shape[1]
    if topk_sampled.fallback_chunk(s, k) is None:
        return  # the radix kernel's launches: its order is the arrival order of its atomics
    other = topk_row if s <= topk_row.MAX_ROW else topk_chunked
    want = other.indexer_topk(scores.to(DEV), lengths.to(DEV), k)[0].cpu()
    for got, exp, flag in zip(raw.cpu(), want, flags, strict=True):
        if flag:
            assert got.tolist() == exp.tolist()


@pytest.mark.parametrize("k", [512, 1024])
@pytest.mark.parametrize("s", [16385, 20000, 65536])
def test_matches_contract(s: int, k: int) -> None:
    """The sampled Triton top-k honours the indexer_topk contract on wide rows."""
    gen = torch.Generator().manual_seed(s * 7 + k)
    scores, lengths = batch(s, k, gen)
    pt = table(scores.shape[0], s, gen) if (s + k // 512) % 2 == 0 else None
    got, flags = _run_flagged(scores, lengths, k, pt)
    check_rows(got, scores, lengths, pt, k)
    # rows: 4 random, heavy ties, all equal, +-inf, rounded; lengths s, 0, k-1, k, k+1, s+5, s, random. Only the
    # all-equal row (every key a candidate: more than the tile holds) falls back
    assert flags == [0, 0, 0, 0, 0, 1, 0, 0]
    _check_fallback_order(got[0], scores, lengths, k, flags)


@pytest.mark.parametrize(("s", "k", "paged", "chunk"), [(5000, 512, True, 2048), (5000, 512, False, 256),
                                                        (16385, 1024, True, 2048), (20000, 512, False, 2048),
                                                        (1100, 1024, True, 256)])
def test_every_row_forced_onto_the_fallback(s: int, k: int, paged: bool, chunk: int) -> None:
    """A tile of exactly k and a threshold of 0 (the margin past any sample count: every key a candidate) flag every
    row of more than k scores: the fallback alone gives the contract (lengths past S, <= k, widths that are not a
    multiple of its step, ties, all equal, +-inf, NaNs of both signs, the all-ones NaN), in its exact order."""
    gen = torch.Generator().manual_seed(s + k + chunk)
    scores, lengths = batch(s, k, gen)
    nan = torch.randn(3, s, generator=gen)
    nan[0, torch.randperm(s, generator=gen)[:40]] = float("nan")  # sign bit clear: above +inf
    nan[1, torch.randperm(s, generator=gen)[:40]] = -float("nan")  # sign bit set: below -inf
    nan[2, torch.randperm(s, generator=gen)[: s - 100]] = torch.full((), -1, dtype=torch.int32).view(
        torch.float32)  # the all-ones NaN (key 0, the smallest) almost everywhere: some are taken
    scores = torch.cat([scores, nan])
    lengths = torch.cat([lengths, torch.tensor([s, s - 1, s], dtype=torch.int32)])
    pt = table(scores.shape[0], s, gen) if paged else None
    got, flags = _run_flagged(scores, lengths, k, pt, config={"cap": k, "margin": 1 << 20, "fallback_chunk": chunk})
    assert flags == [int(n > k) for n in lengths.clamp(max=s).tolist()]
    rows = slice(0, -3)  # the checker orders no NaN: those rows are held to the kernels' key order below
    check_rows((got[0][rows], None if pt is None else got[1][rows]), scores[rows], lengths[rows],
               None if pt is None else pt[rows], k)
    _check_fallback_order(got[0], scores, lengths, k, flags)
    if pt is not None:
        assert torch.equal(got[1].cpu(), page_transform(got[0].cpu(), pt, 64))


@pytest.mark.parametrize("lean", [False, True])
def test_half_tile_select(lean: bool) -> None:
    """half_tile: rows with at most CAP / 2 candidates select over a tile of half the size, the others over the whole
    tile: the contract either way, the same rows fall back."""
    gen = torch.Generator().manual_seed(23)
    s, k = 20000, 256
    scores, lengths = batch(s, k, gen)
    pt = table(scores.shape[0], s, gen)
    # no margin: ~2k = 512 candidates a row, half the tile's 1024 (rows 0, 6 and 7 have 456, 578 and 586)
    cfg = {"lean": lean, "cap": 1024, "nsample": 1024, "margin": 0}
    assert topk_sampled.default_config(64, s, k)["half_tile"]
    (got, pages), flags = _run_flagged(scores, lengths, k, pt, config={**cfg, "half_tile": True})
    _, want_flags = _run_flagged(scores, lengths, k, pt, config={**cfg, "half_tile": False})
    assert flags == want_flags
    check_rows((got, pages), scores, lengths, pt, k)


def test_spread_scores_take_the_fast_path_only() -> None:
    """Spread score distributions take the sampled top-k's fast path only."""
    gen = torch.Generator().manual_seed(11)
    s, k = 100000, 512
    scores = torch.cat([torch.randn(3, s, generator=gen), torch.rand(2, s, generator=gen) * 100,
                        torch.randn(1, s, generator=gen).exp()])  # normal, uniform, heavy-tailed
    lengths = torch.tensor([s, 70000, 40000, s, 3000, s], dtype=torch.int32)
    pt = table(scores.shape[0], s, gen)
    (raw, pages), flags = _run_flagged(scores, lengths, k, pt)
    check_rows((raw, pages), scores, lengths, pt, k)
    assert flags == [0] * 6
    assert torch.equal(pages.cpu(), page_transform(raw.cpu(), pt, 64))


def test_unrepresentative_samples_and_wide_ties_fall_back_exactly() -> None:
    """Too few candidates (samples unlike the rest of the row: the threshold above the k-th key) or too many (a tie
    wider than the tile) flag the row; the fallback's outputs are exact."""
    gen = torch.Generator().manual_seed(4)
    s, k = 40000, 512
    hidden = torch.randn(s, generator=gen) - 5
    # the sampled positions hold the largest keys: the threshold (~113th largest sample) has only ~113 keys >= it
    hidden[(torch.arange(topk_sampled.NSAMPLE) * s) // topk_sampled.NSAMPLE] = 10 + torch.rand(topk_sampled.NSAMPLE,
                                                                                             generator=gen)
    tie = torch.randn(s, generator=gen)
    tie[torch.randperm(s, generator=gen)[:6000]] = 3.0  # 6000 tied keys at the top
    scores = torch.stack([hidden, tie, torch.randn(s, generator=gen)])
    lengths = torch.full((3,), s, dtype=torch.int32)
    got, flags = _run_flagged(scores, lengths, k)
    check_rows(got, scores, lengths, None, k)
    assert flags == [1, 1, 0]
    _check_fallback_order(got[0], scores, lengths, k, flags)


def test_past_the_chunked_width_the_radix_kernel_falls_back() -> None:
    """Past the chunked kernel's width the select launch only flags the row; the radix kernel's launches, gated on
    the flags, compute it (its ties in the arrival order of its atomics: the contract's set, checked)."""
    s, k = topk_chunked.max_width(1024) + 7, 1024
    assert topk_sampled.fallback_chunk(s, k) is None
    gen = torch.Generator().manual_seed(8)
    scores = torch.stack([torch.randn(s, generator=gen), torch.ones(s)])
    lengths = torch.tensor([s, s - 100], dtype=torch.int32)
    got, flags = _run_flagged(scores, lengths, k)
    check_rows(got, scores, lengths, None, k)
    assert flags == [0, 1]


@pytest.mark.parametrize(("s", "k", "cfg"), [(5000, 512, {"nsample": 256, "cap": 1024, "chunk": 1024, "block": 256}),
                                             (3000, 512, {"nsample": 4096, "cap": 512}),
                                             (20000, 1024, {"nsample": 1024, "cap": 2048, "margin": 0}),
                                             (9000, 512, {"chunk": 4096, "block": 1024, "filter_stages": 2,
                                                          "filter_warps": 2}),
                                             (20000, 512, {"per_key": True, "count_stride": 32}),
                                             (9000, 1024, {"per_key": True, "cap": 1024, "chunk": 4096,
                                                           "filter_stages": 2}),
                                             (20000, 512, {"lean": True}),
                                             (20001, 512, {"lean": True, "per_key": True, "count_stride": 32})])
def test_small_tiles(s: int, k: int, cfg: dict[str, int]) -> None:
    """Samples, tiles and filter steps smaller than the defaults (a tile of exactly k, no margin), the filter of
    many-row calls (a chunk of several pipelined steps, the last one partial), a slot an atomic a key and the row
    counts on separate cache lines (one overflowing the candidate tile: the fallback), the lean filter (indices
    only, raw bits compared; a width no multiple of 4): still exact."""
    gen = torch.Generator().manual_seed(s + k)
    scores, lengths = batch(s, k, gen)
    pt = table(scores.shape[0], s, gen)
    check_rows(_run(scores, lengths, k, pt, config=cfg), scores, lengths, pt, k)


@pytest.mark.parametrize("lean", [False, True])
def test_nan_scores_and_row_stride(lean: bool) -> None:
    """The sampled top-k ranks NaN scores above +inf and takes a free row stride."""
    gen = torch.Generator().manual_seed(5)
    s, k = 30000, 512
    wide = torch.randn(3, s + 3, generator=gen)
    scores = wide[:, :s]  # a free row stride
    nan_at = torch.randperm(s, generator=gen)[:40]
    scores[0, nan_at] = float("nan")  # sign bit clear: above +inf
    scores[1, nan_at] = -float("nan")  # sign bit set: below -inf
    scores[2, torch.randperm(s, generator=gen)[: s - 100]] = torch.full((), -1, dtype=torch.int32).view(
        torch.float32)  # the all-ones NaN, key 0, almost everywhere: some are taken
    lengths = torch.full((3,), s, dtype=torch.int32)
    (raw, _), flags = _run_flagged(scores, lengths, k, config={"lean": lean})
    raw = raw.cpu()
    want = topk_chunked.indexer_topk(scores.to(DEV), lengths.to(DEV), k)[0].cpu()
    for got_row, want_row in zip(raw, want, strict=True):  # the same set as the chunked kernel's (order differs)
        assert sorted(got_row.tolist()) == sorted(want_row.tolist())
    assert flags == [0, 0, 1]  # key 0 almost everywhere: every key a candidate, the fallback reads the strided row
    _check_fallback_order(raw, scores, lengths, k, flags)


@pytest.mark.parametrize("per_key", [False, True])
def test_lean_filter_with_negative_and_mixed_thresholds(per_key: bool) -> None:
    """The lean filter compares raw bits as signed ints only when the threshold is a non-negative float's key; rows
    whose threshold is negative (all scores negative; -0.0 and +0.0 around it; lengths short of the width, so keys
    past the length are loaded but refused) take the order-key compare: the contract holds (ties at -0.0 may be
    taken in any order, so the check is the contract's, not another kernel's indices)."""
    gen = torch.Generator().manual_seed(11)
    s, k = 20000, 512
    scores = torch.randn(4, s, generator=gen)
    scores[0] -= 100.0  # every score negative: a negative threshold
    scores[1] = -scores[1].abs()
    scores[1, torch.randperm(s, generator=gen)[:300]] = 0.0
    scores[1, torch.randperm(s, generator=gen)[:300]] = -0.0
    scores[2] = scores[2].abs() * 1e-30  # tiny positive floats (denormals among them)
    scores[3, 15000:] = 1e6  # past the length: loaded, never candidates
    lengths = torch.tensor([s, s, s, 15000], dtype=torch.int32)
    cfg = {"lean": True, "per_key": per_key, "count_stride": 32 if per_key else 1}
    got, flags = _run_flagged(scores, lengths, k, config=cfg)
    check_rows(got, scores, lengths, None, k)
    assert flags[0] == 0 and flags[2] == 0 and flags[3] == 0


def test_many_rows_take_the_default_lean_per_key_filter() -> None:
    """A call of LEAN_MIN_ROWS rows runs the defaults for many rows (per-key slots, lean filter) end to end: the
    contract on rows of every kind _batch makes (ties, all equal, +-inf, lengths 0 to past S), with a page table."""
    gen = torch.Generator().manual_seed(21)
    s, k = 16400, 512
    rows = topk_sampled.LEAN_MIN_ROWS
    cfg = topk_sampled.default_config(rows, s, k)
    assert cfg["lean"] and cfg["per_key"]
    parts = [batch(s, k, gen) for _ in range(-(-rows // 8))]
    scores = torch.cat([p[0] for p in parts])[:rows]
    lengths = torch.cat([p[1] for p in parts])[:rows]
    pt = table(rows, s, gen)
    check_rows(_run(scores, lengths, k, pt), scores, lengths, pt, k)


@pytest.mark.parametrize(("spec", "build"), CATALOG, ids=[s.name for s, _ in CATALOG])
def test_conformance_catalog(spec, build) -> None:  # noqa: ANN001
    """The sampled top-k passes every indexer_topk catalog case it takes."""
    assert_cell_passes(forced_platform(NAME), spec, build, NAME)


def test_registration() -> None:
    """The sampled top-k is registered for every platform."""
    impls = {i.name: i for i in dsv4hal.load_registry().kernels_for("indexer_topk")}
    assert "topk_sampled:indexer_topk" in impls["triton_sampled_topk"].target
    for plat in ("cpu", "cuda_sm90", "cuda_sm100", "rocm"):
        assert impls["triton_sampled_topk"].applies_to(plat)


@pytest.mark.parametrize(("s", "k", "coarse"), [(20000, 512, 0), (65536, 1024, 0), (20000, 512, 14)])
def test_bisection_from_the_common_high_bits(s: int, k: int, coarse: int) -> None:
    """config range=True: both bisections start below the bits every valid key shares (with coarse, the sample
    threshold is resolved to that many bits only); the contract holds, the same rows fall back, and a row of close
    keys (one exponent) takes the fast path."""
    gen = torch.Generator().manual_seed(s - k)
    scores, lengths = batch(s, k, gen)
    close = 1.0 + torch.rand(2, s, generator=gen)  # [1, 2): keys share their sign and exponent bits
    scores, lengths = torch.cat([scores, close]), torch.cat([lengths, torch.tensor([s, s // 2], dtype=torch.int32)])
    pt = table(scores.shape[0], s, gen)
    got, flags = _run_flagged(scores, lengths, k, pt, config={"range": True, "coarse": coarse})
    check_rows(got, scores, lengths, pt, k)
    assert flags == [0, 0, 0, 0, 0, 1, 0, 0, 0, 0]


def test_samples_by_batch_and_expected_candidates() -> None:
    """Fewer samples (cheaper; a fallback for ~6.6e-4 of rows at k=512 over 256K) for calls of up to FEW_ROWS rows
    whose expected candidates (2k + MARGIN * width / samples) fill at most half the tile; otherwise the sample that
    practically never falls back (at k=1024 over 256K, 2048 samples expect 3072 of the 4096 slots)."""
    rows, cfg = topk_sampled.FEW_ROWS, topk_sampled.default_config
    few = topk_sampled.NSAMPLE_FEW_ROWS
    assert cfg(rows, 262144, 512)["nsample"] == cfg(1, 65536, 512)["nsample"] == few < topk_sampled.NSAMPLE
    for shape in ((rows + 1, 262144, 512), (1, 262144, 1024), (1, 65536, 1024), (64, 65536, 512)):
        assert cfg(*shape)["nsample"] == topk_sampled.NSAMPLE
    many = cfg(rows + 1, 262144, 512)
    filter_opts = ("nsample", "per_key", "count_stride", "lean")
    assert {k: v for k, v in cfg(1, 262144, 512).items() if k not in filter_opts} == {
        k: v for k, v in many.items() if k not in filter_opts}


def test_filter_slots_by_batch() -> None:
    """From PER_KEY_MIN_ROWS rows each selected key takes its slot with an atomic of its own, on row counts a cache
    line apart; fewer rows reserve a block's slots with one atomic and a prefix sum, counts adjacent; from
    LEAN_MIN_ROWS rows the filter is lean. Every call filters CHUNK scores a program, in one step."""
    cfg, rows = topk_sampled.default_config, topk_sampled.PER_KEY_MIN_ROWS
    for shape in ((1, 262144, 512), (rows - 1, 262144, 1024), (rows - 1, 8192, 512)):
        assert (cfg(*shape)["per_key"], cfg(*shape)["count_stride"]) == (False, 1)
    for shape in ((rows, 262144, 512), (64, 65536, 1024)):
        assert (cfg(*shape)["per_key"], cfg(*shape)["count_stride"]) == (True, topk_sampled.COUNT_STRIDE)
    lean = topk_sampled.LEAN_MIN_ROWS
    assert [cfg(b, 262144, 512)["lean"] for b in (1, rows, lean - 1, lean, 64)] == [False, False, False, True, True]
    for shape in ((1, 262144, 512), (64, 262144, 512)):
        assert (cfg(*shape)["chunk"], cfg(*shape)["filter_stages"]) == (topk_sampled.CHUNK, 1)


def test_passes_stop_early_for_timing() -> None:
    """passes < 3 (bench/tune_triton.py's per-pass timing) leaves the select pass out; 3 (the default) is the whole
    op, the fallback included: the three launches are all there is."""
    s, k = 20000, 512
    scores, lengths = torch.ones(1, s), torch.tensor([s], dtype=torch.int32)  # every key a candidate: falls back
    assert topk_sampled.default_config(1, s, k)["passes"] == 3
    _, flags = _run_flagged(scores, lengths, k, config={"passes": 2})
    assert flags == [-1]  # untouched: no select pass
    (raw, _), flags = _run_flagged(scores, lengths, k, config={"passes": 3})
    assert flags == [1] and raw[0].tolist() == list(range(k))
