"""triton_chunked_topk (each chunk's exact top-k to a candidate buffer, then one program a row selects among the
candidates): the indexer_topk contract on rows wider than 16384 (both k, lengths 0, < k, == k, > S, random,
heavy ties, +-inf, with and without a page table), many chunks on short rows through a smaller chunk (where
its outputs must equal triton_row_topk's bit for bit, NaN rows included), ties across chunk boundaries, the
conformance catalog's size=large cases forced through the platform, the refusals and the registration. Under
the interpreter on CPU machines, natively on a GPU."""

from __future__ import annotations

import pytest
import torch
from topk_forced import DEV, assert_cell_passes, batch, check_rows, forced_platform, table, wide_catalog

import dsv4hal
from dsv4hal.errors import UnsupportedCaseError
from dsv4hal.hardware import simulated
from dsv4hal.ops.indexer_topk import case as topk_case
from dsv4hal.reference.indexer_topk import page_transform

pytest.importorskip("triton")
pytestmark = pytest.mark.slow  # minutes under the Triton interpreter: the whole suite runs it

from dsv4hal.kernels.triton import topk_row  # noqa: E402
from dsv4hal.kernels.triton.topk_chunked import MAX_CAND, indexer_topk, launch_config, max_width  # noqa: E402

NAME = "triton_chunked_topk"
CATALOG = wide_catalog(NAME)


def _run(scores: torch.Tensor, lengths: torch.Tensor, k: int, pt: torch.Tensor | None = None, page_size: int = 64,
         config: dict | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    return indexer_topk(scores.to(DEV), lengths.to(DEV), k, None if pt is None else pt.to(DEV), page_size,
                        config=config)


@pytest.mark.parametrize("k", [512, 1024])
@pytest.mark.parametrize("s", [16385, 20000, 65536])
def test_matches_contract(s: int, k: int) -> None:
    """The chunked Triton top-k honours the indexer_topk contract on wide rows."""
    gen = torch.Generator().manual_seed(s * 7 + k)
    scores, lengths = batch(s, k, gen)
    pt = table(scores.shape[0], s, gen) if (s + k // 512) % 2 == 0 else None  # both ways across the cases
    check_rows(_run(scores, lengths, k, pt), scores, lengths, pt, k)


@pytest.mark.parametrize(("s", "k", "chunk"), [(600, 512, 1024), (5000, 512, 1024), (5000, 1024, 1024),
                                               (16384, 512, 1024), (16384, 1024, 2048), (3000, 1024, 512),
                                               (8192, 1024, None), (16384, 512, None)])
def test_many_chunks_equal_the_row_kernel(s: int, k: int, chunk: int | None) -> None:
    """Rows the row kernel also takes, cut into many chunks (a chunk smaller than k too, and the default chunk):
    the same bits as triton_row_topk, ties, +-inf, short chunks and lengths past S included."""
    gen = torch.Generator().manual_seed(s + k + (chunk or 0))
    scores, lengths = batch(s, k, gen)
    pt = table(scores.shape[0], s, gen)
    got = _run(scores, lengths, k, pt, config=None if chunk is None else {"chunk": chunk})
    want = topk_row.indexer_topk(scores.to(DEV), lengths.to(DEV), k, pt.to(DEV))
    check_rows(got, scores, lengths, pt, k)
    assert torch.equal(got[0].cpu(), want[0].cpu()) and torch.equal(got[1].cpu(), want[1].cpu())


def test_ties_across_chunk_boundaries() -> None:
    """Keys above the k-th and ties at it spread over every chunk, straddling the boundaries: the output is keys
    above in index order, then the lowest-index ties, whichever chunk they came from."""
    gen = torch.Generator().manual_seed(17)
    s, k, chunk = 20000, 512, 1024
    row = torch.randn(s, generator=gen) - 10
    top = torch.randperm(s, generator=gen)
    row[top[:300]] = 5 + torch.rand(300, generator=gen)  # 300 above the threshold ...
    row[top[300:1200]] = 2.0  # ... and 900 ties at it: 212 are taken
    edge = torch.arange(1, 20) * chunk
    row[edge - 1] = 2.0  # ties on both sides of every boundary, the lowest ones included
    row[edge] = 2.0
    row[edge[:5] + 1] = 7.0  # some above it right after a boundary
    above = (row > 2.0).nonzero().flatten().int()
    ties = (row == 2.0).nonzero().flatten().int()
    for cfg in ({"chunk": chunk}, None):
        raw = _run(row[None], torch.tensor([s], dtype=torch.int32), k, config=cfg)[0][0].cpu()
        assert torch.equal(raw[: above.numel()], above)
        assert torch.equal(raw[above.numel():], ties[: k - above.numel()])
    # all equal over a length past S and one ending mid-chunk: 0..k-1
    flat = torch.ones(2, s)
    raw = _run(flat, torch.tensor([s + 9, 3 * chunk + 5], dtype=torch.int32), k, config={"chunk": chunk})[0].cpu()
    assert torch.equal(raw, torch.arange(k, dtype=torch.int32).expand(2, k))


def test_nan_scores() -> None:
    """Unchecked input: the keys are the row kernel's (NaN with the sign bit clear above +inf, with it set below
    -inf), so the outputs equal its; a real all-ones NaN has key 0, like an unused candidate slot, and must
    still be selectable (validity comes from the candidate's index, not its key)."""
    gen = torch.Generator().manual_seed(5)
    s, k = 5000, 512
    scores = torch.randn(3, s, generator=gen)
    nan_at = torch.randperm(s, generator=gen)[:40]
    scores[0, nan_at] = float("nan")
    scores[1, nan_at] = -float("nan")
    scores[2, torch.randperm(s, generator=gen)[:4700]] = -float("nan")  # more than s - k: some are taken
    lengths = torch.full((3,), s, dtype=torch.int32)
    raw = _run(scores, lengths, k, config={"chunk": 1024})[0].cpu()
    assert torch.equal(raw, topk_row.indexer_topk(scores.to(DEV), lengths.to(DEV), k)[0].cpu())
    assert set(raw[0].tolist()) == set(scores[0].nan_to_num(nan=float("inf")).topk(k).indices.tolist())
    low = torch.full((2, 20000), -1, dtype=torch.int32).view(torch.float32)  # key 0 everywhere ...
    low[:, :100] = torch.randn(2, 100, generator=gen)  # ... but 100 real scores in the first chunk
    for cfg in ({"chunk": 1024}, None):
        raw = _run(low, torch.tensor([1500, 20000], dtype=torch.int32), k, config=cfg)[0].cpu()
        assert torch.equal(raw, torch.arange(k, dtype=torch.int32).expand(2, k))


def test_row_stride_and_page_size() -> None:
    """The chunked top-k takes a free row stride and any page size."""
    gen = torch.Generator().manual_seed(3)
    wide = torch.randn(2, 20003, generator=gen)
    scores = wide[:, :20000]  # a free row stride
    lengths = torch.tensor([20000, 9000], dtype=torch.int32)
    pt = torch.stack([torch.randperm(400, generator=gen)[:157] for _ in range(2)]).int()
    raw, pages = (t.cpu() for t in _run(scores, lengths, 1024, pt, 128))
    check_rows((raw, None), scores, lengths, None, 1024)
    assert torch.equal(pages, page_transform(raw, pt, 128))


def test_launch_config_fits_stage_two() -> None:
    """The chunked top-k launch config keeps stage two's candidates within its limit."""
    for k in (512, 1024):
        for s in (16385, 65536, 131072, 262144, max_width(k)):
            cfg = launch_config(s, k)
            assert -(-s // cfg["chunk"]) * k <= MAX_CAND and cfg["chunk"] <= topk_row.MAX_ROW
    assert max_width(1024) == 262144 and max_width(512) == 524288
    assert launch_config(262144, 512)["chunk"] == 8192 and launch_config(262144, 1024)["chunk"] == 16384


@pytest.fixture(scope="module")
def platform():  # noqa: ANN201
    return forced_platform(NAME)


@pytest.mark.parametrize(("spec", "build"), CATALOG, ids=[s.name for s, _ in CATALOG])
def test_conformance_catalog(platform, spec, build) -> None:  # noqa: ANN001
    """The chunked top-k passes every indexer_topk catalog case it takes."""
    assert_cell_passes(platform, spec, build, NAME)


def test_refusals(platform) -> None:  # noqa: ANN001
    """The chunked top-k refuses rows narrow enough for the row kernel, saying so."""
    small, large = torch.zeros(1, topk_row.MAX_ROW), torch.zeros(1, topk_row.MAX_ROW + 1)
    lengths = torch.ones(1, dtype=torch.int32)
    impl = {i.name: i for i in dsv4hal.load_registry().kernels_for("indexer_topk")}["triton_chunked_topk"]
    gpu = simulated("sm90", libraries={"torch": "2", "triton": "3"})
    assert impl.supports(topk_case(large, lengths, 1024), gpu) == []
    (reason,) = impl.supports(topk_case(small, lengths, 512), gpu)
    assert "triton_row_topk" in reason and "size=small" in reason
    with pytest.raises(UnsupportedCaseError, match="triton_row_topk"):
        platform.ops.indexer_topk(small.to(DEV), lengths.to(DEV), 512)
    too_wide = torch.zeros(1, max_width(1024) + 1)
    with pytest.raises(UnsupportedCaseError, match=r"(?s)262144.*triton_radix_topk"):
        indexer_topk(too_wide, lengths, 1024)


def test_static_priority_row_sampled_radix_chunked() -> None:
    """The measured row kernel first where it fits, then the sampled kernel (any width); the width-limited chunked
    kernel only by lock or override."""
    impls = {i.name: i for i in dsv4hal.load_registry().kernels_for("indexer_topk")}
    assert impls["triton_chunked_topk"].priority_on("cuda_sm90") == 99
    assert impls["triton_row_topk"].priority_on("cuda_sm90") == 102
    assert impls["triton_sampled_topk"].priority_on("cuda_sm90") == 101
    names = ("triton_row_topk", "triton_sampled_topk", "triton_radix_topk", "triton_chunked_topk")
    for plat in ("cpu", "cuda_sm90", "cuda_sm100", "rocm"):
        prio = [impls[n].priority_on(plat) for n in names]
        assert prio == sorted(prio, reverse=True) and len(set(prio)) == 4, (plat, prio)
