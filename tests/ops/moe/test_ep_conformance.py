"""Expert-parallel conformance cells (dsv4hal.distributed.conformance) on 1, 2 and 4 gloo processes."""

from __future__ import annotations

import pytest

from dsv4hal.distributed.conformance import case_names, run_ep_cells

# one cell per layout x dtype x routing x mode, the variants in turn: every feature on every world size
QUICK = [f"ep{n}-{layout}-{dtype}-{routing}-{mode}-{variant}" for n in (1, 2, 4)
         for (layout, dtype, routing, mode), variant in zip(
             [("standard", "bf16", "score", "normal"), ("batched", "fp8", "hash", "decode"),
              ("standard", "fp8", "hash", "decode"), ("batched", "bf16", "score", "normal")],
             ("dropped", "empty-rank", "replicas", "dropped"))]


def _failures(cells: list) -> list[str]:
    return [f"{c.case} [{c.implementation}]: {c.detail}" for c in cells if c.status != "pass"]


def test_ep_cells_match_single_rank_moe_experts_on_1_2_4_ranks() -> None:
    """Dispatch + moe_experts + combine equals single-rank moe_experts (bit for bit on one rank) for a cell of each
    layout, dtype, routing, mode and variant on 1, 2 and 4 gloo ranks, with both torch backends."""
    cells = run_ep_cells((1, 2, 4), names=QUICK)
    assert len(cells) == 4 + 8 + 8  # one backend on one rank, two on more
    assert not _failures(cells)
    assert all(c.max_error == 0.0 for c in cells if c.case.startswith("ep1-standard")), "ep1 standard: bit for bit"


@pytest.mark.slow
def test_ep_every_cell_passes_on_1_2_4_ranks() -> None:
    """Every ep<N> cell (both layouts, bf16/fp8, score/hash routing, normal/decode, every variant) passes."""
    cells = run_ep_cells((1, 2, 4))
    assert len(cells) == sum(len(case_names(n)) for n in (1, 2, 4))
    assert not _failures(cells)
