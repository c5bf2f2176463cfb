"""triton_row_topk (one program per row, the row in registers): the indexer_topk contract on every row width
it takes (1..16384), both k, lengths 0, < k, == k, > S, heavy ties, +-inf and NaN, with and without a page
table; its output layout (as in the radix kernel); the conformance catalog forced through the platform; and
the refusal of rows wider than 16384. Under the interpreter on CPU machines, natively on a GPU."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from topk_forced import assert_cell_passes, batch, check_rows, table

import dsv4hal
from dsv4hal.conformance.runner import load_catalog
from dsv4hal.errors import UnsupportedCaseError
from dsv4hal.hardware import simulated
from dsv4hal.ops.catalog import OPS_BY_NAME
from dsv4hal.ops.indexer_topk import case as topk_case
from dsv4hal.reference.indexer_topk import page_transform

pytest.importorskip("triton")

from dsv4hal.kernels.triton import registrations  # noqa: E402
from dsv4hal.kernels.triton.topk_row import MAX_ROW, indexer_topk  # noqa: E402

FORCED = {"indexer_topk": "triton_row_topk"}
DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")
WIDTHS = (1, 7, 511, 512, 513, 1000, 4096, 8192, 8256, 16384)  # 8256: a tail tile
CATALOG = [(s, b) for s, b in load_catalog(FORCED) if s.op == "indexer_topk" and int(s.params["s"]) <= MAX_ROW
           and (not s.gpu_only or torch.cuda.is_available())]


@pytest.mark.parametrize("k", [512, 1024])
@pytest.mark.parametrize("s", WIDTHS)
def test_matches_contract(s: int, k: int) -> None:
    """The row Triton top-k honours the indexer_topk contract at every width."""
    gen = torch.Generator().manual_seed(s * 7 + k)
    scores, lengths = batch(s, k, gen)
    pt = table(scores.shape[0], s, gen) if s % 2 == 0 or s == 1 else None  # both ways across the widths
    got = indexer_topk(scores.to(DEV), lengths.to(DEV), k, None if pt is None else pt.to(DEV), 64)
    check_rows(got, scores, lengths, pt, k)
    if pt is not None:  # the other way at this width too, on two rows (random, ties)
        got = indexer_topk(scores[[0, 4]].to(DEV), lengths[[0, 4]].to(DEV), k)
        check_rows(got, scores[[0, 4]], lengths[[0, 4]], None, k)


def test_row_stride_and_page_size() -> None:
    """The row top-k takes a free row stride and any page size."""
    gen = torch.Generator().manual_seed(3)
    wide = torch.randn(3, 5003, generator=gen)
    scores = wide[:, :5000]  # a free row stride
    lengths = torch.tensor([5000, 4000, 700], dtype=torch.int32)
    pt = torch.stack([torch.randperm(200, generator=gen)[:40] for _ in range(3)]).int()
    got = indexer_topk(scores.to(DEV), lengths.to(DEV), 512, pt.to(DEV), 128)
    raw, pages = (t.cpu() for t in got)
    check_rows((raw, None), scores, lengths, None, 512)
    assert torch.equal(pages, page_transform(raw, pt, 128))


def test_output_layout_is_the_radix_kernels() -> None:
    """Keys above the k-th fill [0, k - need) in index order, then the lowest-index `need` ties."""
    gen = torch.Generator().manual_seed(11)
    s, k = 3000, 512
    row = torch.randn(s, generator=gen) - 10
    top = torch.randperm(s, generator=gen)
    row[top[:300]] = 5 + torch.rand(300, generator=gen)  # 300 above the threshold ...
    row[top[300:1200]] = 2.0  # ... and 900 ties at it: 212 are taken
    raw = indexer_topk(row[None].to(DEV), torch.tensor([s], dtype=torch.int32, device=DEV), k)[0][0].cpu()
    assert torch.equal(raw[:300], top[:300].sort().values.int())
    assert torch.equal(raw[300:], top[300:1200].sort().values[: k - 300].int())


def test_nan_scores() -> None:
    """Unchecked input (checked mode refuses it). A NaN with the sign bit clear orders above +inf, as in the
    reference (torch.topk); one with the sign bit set orders below -inf, as in the radix kernel (the same keys;
    torch.topk takes it as the largest)."""
    from dsv4hal.kernels.triton.topk import indexer_topk as radix_topk

    gen = torch.Generator().manual_seed(5)
    s, k = 2000, 512
    scores = torch.randn(3, s, generator=gen)
    nan_at = torch.randperm(s, generator=gen)[:40]
    scores[0, nan_at] = float("nan")
    scores[1, nan_at] = -float("nan")
    many = torch.randperm(s, generator=gen)[:1700]  # more than s - k: some must be taken
    scores[2, many] = -float("nan")
    lengths = torch.full((3,), s, dtype=torch.int32)
    raw = indexer_topk(scores.to(DEV), lengths.to(DEV), k)[0].cpu()
    assert set(raw[0].tolist()) == set(scores[0].nan_to_num(nan=float("inf")).topk(k).indices.tolist())
    radix = radix_topk(scores[:2].to(DEV), lengths[:2].to(DEV), k)[0].cpu()
    for i in range(2):  # no ties among the selected keys: the sets are unique
        assert set(raw[i].tolist()) == set(radix[i].tolist())
    assert not set(nan_at.tolist()) & set(raw[1].tolist())
    finite = torch.ones(s, dtype=torch.bool).index_fill_(0, many, False).nonzero().flatten()
    assert torch.equal(raw[2, : s - 1700], finite.int())  # every other score first, then the lowest NaNs
    assert torch.equal(raw[2, s - 1700:], many.sort().values[: k - (s - 1700)].int())
    # the all-ones NaN has key 0, the smallest: the k-th key is 0 and the search keeps no bit
    low = torch.full((1, s), -1, dtype=torch.int32).view(torch.float32)
    low[0, :100] = torch.randn(100, generator=gen)
    raw = indexer_topk(low.to(DEV), torch.tensor([1500], dtype=torch.int32, device=DEV), k)[0][0].cpu()
    assert torch.equal(raw, torch.arange(k, dtype=torch.int32))


def test_no_write_past_the_row() -> None:
    """Exactly k outputs a row, ties or not: a guard past the row's k slots is left alone."""
    from dsv4hal.kernels.triton.topk_row import _row_topk_kernel, launch_config

    gen = torch.Generator().manual_seed(13)
    s, k, guard = 2100, 512, 64  # 2048 and a tail of 64 (launch_config keeps tails for wider rows: forced here)
    scores = torch.randn(3, s, generator=gen)
    scores[0, torch.randperm(s, generator=gen)[:900]] = 5.0  # 900 ties at the k-th key
    scores[1] = 1.0
    pt = torch.stack([torch.randperm(200, generator=gen)[:33] for _ in range(3)]).int().to(DEV)
    for row, n in ((0, s), (1, s), (2, 100)):  # one row a launch: nothing after it to cover a stray write
        raw = torch.full((k + guard,), -7, dtype=torch.int32, device=DEV)
        pages = torch.full_like(raw, -7)
        cfg = {**launch_config(s), "block": 2048, "tail": 64}
        _row_topk_kernel[(1,)](scores[row:row + 1].to(DEV), s, torch.tensor([n], dtype=torch.int32, device=DEV), raw,
                               pages, pt[row:row + 1], pt.stride(0), s, pt.shape[1], K=k, BLOCK=cfg["block"],
                               TAIL=cfg["tail"], PAGE_SHIFT=6, HAS_PT=True, num_warps=cfg["num_warps"])
        assert bool((raw[k:] == -7).all()) and bool((pages[k:] == -7).all())
        assert bool((raw[:k] != -7).all()) and bool((pages[:k] != -7).all())


def test_a_row_just_past_a_power_of_two_takes_a_tail_tile() -> None:
    """A row at most 1/2 past a power of two of 8192+ keys is held as that tile and a short tail (8256 = 8192 + 64:
    the indexer's 129 pages at 32K context), which gives the outputs of the tile twice as wide, key for key: ties
    across the two tiles, the whole top-k in the tail, lengths ending in either tile. Narrower rows keep one padded
    tile (tails were measured on 8192-key tiles only); the kernel takes a tail at any width when forced."""
    from dsv4hal.kernels.triton.topk_row import launch_config, tile_warps

    assert launch_config(8256) == {"block": 8192, "tail": 64, "num_warps": 8}
    assert launch_config(12288) == {"block": 8192, "tail": 4096, "num_warps": 8}
    assert launch_config(8192)["tail"] == 0 and launch_config(12289)["tail"] == 0  # a power of two; > 1/2 past one
    assert launch_config(4100)["tail"] == 0 and launch_config(200)["tail"] == 0  # below 8192 keys: one tile
    gen = torch.Generator().manual_seed(17)
    for s, k in ((1030, 512), (2100, 1024), (8256, 512)):
        scores, lengths = batch(s, k, gen)
        tail_top = torch.randn(s, generator=gen)
        tail_top[-(s - 1024 if s < 2048 else s % 1024):] += 100  # the largest keys all in the tail
        ties = torch.zeros(s)
        ties[::7] = 1.0  # ties at the k-th key on both sides of the boundary
        scores = torch.cat([scores, tail_top[None], ties[None]])
        lengths = torch.cat([lengths, torch.tensor([s, s - 3], dtype=torch.int32)])
        block = 1 << (s.bit_length() - 1)
        cfg = {"block": block, "tail": 64 if s - block <= 64 else 1024, "num_warps": tile_warps(block)}
        assert cfg == launch_config(s) or block < 8192
        wide = {"block": block * 2, "tail": 0, "num_warps": tile_warps(block * 2)}
        pt = table(scores.shape[0], s, gen)
        got = indexer_topk(scores.to(DEV), lengths.to(DEV), k, pt.to(DEV), 64, config=cfg)
        want = indexer_topk(scores.to(DEV), lengths.to(DEV), k, pt.to(DEV), 64, config=wide)
        check_rows(got, scores, lengths, pt, k)
        assert torch.equal(got[0].cpu(), want[0].cpu()) and torch.equal(got[1].cpu(), want[1].cpu())


@pytest.mark.slow
@settings(max_examples=30, deadline=None, database=None, derandomize=True)
@given(block_log=st.integers(9, 11), tail_log=st.integers(6, 9), extra=st.integers(1, 512),
       k=st.sampled_from([512, 1024]), levels=st.integers(1, 9), cut=st.integers(0, 640), seed=st.integers(0, 2**16))
def test_a_tail_tile_at_any_split_keeps_the_contract(block_log: int, tail_log: int, extra: int, k: int, levels: int,
                                                     cut: int, seed: int) -> None:
    """Property: for a row held as a tile of 2^block_log keys and a forced tail, whatever the split of the keys, the
    ties (scores drawn from a few levels), where the length ends (past the tile, inside it, at most k) and k, the
    outputs are the contract's and the same as one padded tile's."""
    from dsv4hal.kernels.triton.topk_row import tile_warps

    block, tail = 1 << block_log, 1 << tail_log
    s = block + min(extra, tail)
    gen = torch.Generator().manual_seed(seed)
    scores = torch.randint(0, levels, (3, s), generator=gen).float()
    scores[1] = torch.randn(s, generator=gen)
    lengths = torch.tensor([s, max(s - cut, 0), min(block, s)], dtype=torch.int32)
    pt = table(3, s, gen)
    tailed = {"block": block, "tail": tail, "num_warps": tile_warps(block)}
    padded = {"block": 2 * block, "tail": 0, "num_warps": tile_warps(2 * block)}
    got = indexer_topk(scores.to(DEV), lengths.to(DEV), k, pt.to(DEV), 64, config=tailed)
    check_rows(got, scores, lengths, pt, k)
    want = indexer_topk(scores.to(DEV), lengths.to(DEV), k, pt.to(DEV), 64, config=padded)
    assert torch.equal(got[0].cpu(), want[0].cpu()) and torch.equal(got[1].cpu(), want[1].cpu())


@pytest.fixture(scope="module")
def platform():  # noqa: ANN201
    """The platform with triton_row_topk forced: binding accepts it because decode at 32K context (S = 8192,
    size=small) is one of the op's typical cases."""
    assert any(c.get("size") == "small" for c in OPS_BY_NAME["indexer_topk"].alternate_cases)
    with dsv4hal.overrides(kernels=FORCED):
        return dsv4hal.select_platform()


@pytest.mark.parametrize(("spec", "build"), CATALOG, ids=[s.name for s, _ in CATALOG])
def test_conformance_catalog(platform, spec, build) -> None:  # noqa: ANN001
    """The row top-k passes every indexer_topk catalog case it takes."""
    assert_cell_passes(platform, spec, build, "triton_row_topk")


def test_rows_wider_than_16384_are_refused(platform) -> None:  # noqa: ANN001
    """The row top-k refuses rows wider than 16384, which are the large size class."""
    assert MAX_ROW == registrations.ROW_TOPK_MAX == 16384
    small, large = torch.zeros(1, MAX_ROW), torch.zeros(1, MAX_ROW + 1)
    lengths = torch.ones(1, dtype=torch.int32)
    assert topk_case(small, lengths, 512)["size"] == "small" and topk_case(large, lengths, 512)["size"] == "large"
    impl = {i.name: i for i in dsv4hal.load_registry().kernels_for("indexer_topk")}["triton_row_topk"]
    gpu = simulated("sm90", libraries={"torch": "2", "triton": "3"})
    assert impl.supports(topk_case(small, lengths, 512), gpu) == []
    (reason,) = impl.supports(topk_case(large, lengths, 1024), gpu)
    assert "16384" in reason and "triton_radix_topk" in reason
    with pytest.raises(UnsupportedCaseError, match="16384"):
        platform.ops.indexer_topk(large.to(DEV), lengths.to(DEV), 512)
    with pytest.raises(ValueError, match="16384"):
        indexer_topk(large, lengths, 512)


def test_registered_above_radix() -> None:
    """Measured 3.1-3.7x faster than the radix kernel in every size=small bucket on the H200 (cuda_sm90.lock.json)."""
    impls = {i.name: i for i in dsv4hal.load_registry().kernels_for("indexer_topk")}
    for plat in ("cpu", "cuda_sm90", "cuda_sm100", "rocm"):
        assert impls["triton_row_topk"].priority_on(plat) > impls["triton_radix_topk"].priority_on(plat)
