"""triton_filter_topk (histogram, compact, select): forced through the platform on the indexer_topk
conformance catalog, plus rows built to hit ties at the threshold and a candidate-buffer overflow."""

from __future__ import annotations

import pytest
import torch

import dsv4hal
from dsv4hal.conformance.cases_indexer_topk import check_topk
from dsv4hal.conformance.runner import load_catalog, run_cell

pytest.importorskip("triton")

FORCED = {"indexer_topk": "triton_filter_topk"}
CATALOG = [(s, b) for s, b in load_catalog(FORCED) if s.op == "indexer_topk" and not s.gpu_only]


@pytest.fixture(scope="module")
def platform():  # noqa: ANN201
    with dsv4hal.overrides(kernels=FORCED):
        return dsv4hal.select_platform()


@pytest.mark.parametrize(("spec", "build"), CATALOG, ids=[s.name for s, _ in CATALOG])
def test_filter_topk_matches_reference(platform, spec, build) -> None:  # noqa: ANN001
    cell = run_cell(platform, spec, build, "eager")
    assert cell.implementation == "triton_filter_topk"
    assert cell.status == "pass", cell.detail


def _rows(dev: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    s = torch.randn(4, 3000, generator=g) - 10  # background far below the chosen values
    s[0, torch.randperm(3000, generator=g)[:300]] = 5 + torch.rand(300, generator=g)  # 300 above ...
    s[0, torch.randperm(3000, generator=g)[:900]] = 2.0  # ... and ties at the threshold (fits the buffer)
    s[1] = 1.0  # every key equal: 3000 candidates overflow the 2048-entry buffer
    s[2, :2500] = 3.0
    s[2, 2990:] = 4.0  # 10 above, then ties past the buffer; length 2995 cuts some off
    lengths = torch.tensor([3000, 3000, 2995, 2000], dtype=torch.int32)
    pt = torch.stack([torch.randperm(200, generator=g)[:47] for _ in range(4)]).int()
    return s.to(dev), lengths.to(dev), pt.to(dev)


@pytest.mark.parametrize("config", [None, {"cap_mult": 1}], ids=["buffer", "forced-overflow"])
def test_ties_and_overflow(config: dict | None) -> None:
    from dsv4hal.kernels.triton.topk_single_read import indexer_topk

    scores, lengths, pt = _rows(torch.device("cpu"))
    got = indexer_topk(scores, lengths, 512, pt, 64, config=config)
    wrong, ok, detail = check_topk(got, scores, lengths, pt, 512)
    assert ok, detail


def test_registered_below_radix() -> None:
    impls = {i.name: i for i in dsv4hal.load_registry().kernels_for("indexer_topk")}
    for plat in ("cpu", "cuda_sm90", "cuda_sm100", "rocm"):  # every platform: nothing changes until it is timed
        assert impls["triton_filter_topk"].priority_on(plat) < impls["triton_radix_topk"].priority_on(plat)
