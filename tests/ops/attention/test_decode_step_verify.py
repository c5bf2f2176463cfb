"""MTP verify steps through the decode step (pack store, compress_decode on doubled rings, the compressed and indexer
stores, sparse attention): the conformance cells, the ragged accept against a clean run, the rings' sizes, and the
refusal of tree speculation."""

from __future__ import annotations

import pytest
import torch

import dsv4hal
from dsv4hal.conformance.decode_step_verify import Layout, verify_run
from dsv4hal.conformance.runner import run_conformance
from dsv4hal.errors import InvalidArgumentError
from dsv4hal.speculative import chain_rows, check_chain, compress_ring, swa_ring


@pytest.fixture(scope="module")
def cpu() -> dsv4hal.Platform:
    return dsv4hal.select_platform("cpu")


@pytest.mark.slow
def test_verify_cells_pass_for_ratios_0_4_128_on_the_cpu() -> None:
    """`conformance --ops decode_step` lists a verify cell per ratio and tokens per request; on the CPU the eager ones
    pass and the graph ones are not run."""
    report = run_conformance("cpu", ops=["decode_step"], cases="tpr")
    cells = {c.case: c for c in report.cells if c.mode == "verify"}
    eager = {f"ratio{r}/tpr{t}/eager" for r in (0, 4, 128) for t in (2, 4)}
    assert eager <= set(cells)
    assert all(cells[n].status == "pass" and cells[n].max_error < 2e-2 for n in eager), [
        (n, cells[n].status, cells[n].detail) for n in eager]
    assert {c.status for n, c in cells.items() if n.endswith("/graph")} == {"not-run"}


@pytest.mark.parametrize("ratio", [4, 128])
def test_rejected_drafts_leave_the_live_state_of_a_clean_run(cpu: dsv4hal.Platform, ratio: int) -> None:
    """With the doubled compressor ring, four tokens a request and ragged accepts, every live row after each rewind
    (SWA, compressed and indexer caches, rings) equals the clean run's, and attention matches both oracles."""
    verdict = verify_run(cpu, ratio, Layout.recipe(ratio, 4))["eager"]
    assert verdict.ok, verdict.detail


@pytest.mark.parametrize("ratio", [4, 128])
def test_a_compressor_ring_not_doubled_fails_the_clean_run_check(cpu: dsv4hal.Platform, ratio: int) -> None:
    """A ring of the bare window (C4 8, C128 128 rows) lets a rejected draft overwrite a row the next group pools:
    the live-state check and the compressor oracle both catch it."""
    window = 8 if ratio == 4 else 128
    verdict = verify_run(cpu, ratio, Layout(4, swa_ring(4), window))["eager"]
    assert not verdict.ok
    text = "; ".join(verdict.detail)
    assert "'rings'" in text and "compress_decode main" in text


def test_an_swa_ring_without_room_for_the_drafts_fails(cpu: dsv4hal.Platform) -> None:
    """An SWA ring of 128 rows: the chain's last draft overwrites a key its first query attends to."""
    verdict = verify_run(cpu, 0, Layout(4, 128, 0))["eager"]
    assert not verdict.ok and any("attention" in d for d in verdict.detail)
    assert any("'swa'" in d for d in verdict.detail)


def test_ring_sizes_follow_the_recipes() -> None:
    """Rings: SWA 128 + k; compressor C4 8 -> 16 and C128 128 -> 256 under speculation, unchanged without."""
    assert [swa_ring(n) for n in (1, 2, 4)] == [128, 129, 131]
    assert [compress_ring(4, n) for n in (1, 2, 4)] == [8, 16, 16]
    assert [compress_ring(128, n) for n in (1, 2, 4)] == [128, 256, 256]


def test_tree_speculation_is_refused_with_a_typed_error() -> None:
    """Two drafts of one request at the same position (a tree) raise InvalidArgumentError naming positions and the
    chain-only remedy; a gap and split request rows too; a chain passes."""
    req, pos = chain_rows(2, 4, torch.tensor([10, 300]))
    check_chain(req, pos)
    assert pos.tolist() == [10, 11, 12, 13, 300, 301, 302, 303]
    tree = pos.clone()
    tree[2] = 11  # drafts 11 and 11: two branches at one position
    with pytest.raises(InvalidArgumentError, match=r"(?s)'positions'.*tree speculation.*chain speculation only"):
        check_chain(req, tree)
    gap = pos.clone()
    gap[3] = 20
    with pytest.raises(InvalidArgumentError, match="a gap"):
        check_chain(req, gap)
    with pytest.raises(InvalidArgumentError, match="request-major"):
        check_chain(torch.tensor([0, 1, 0]), torch.tensor([5, 9, 6]))


class _ReplayedCall:
    """A CUDA graph's stand-in on the CPU: replay runs the captured call again on its static buffers and writes the
    result into the first call's output tensors."""

    def __init__(self, fn) -> None:  # noqa: ANN001
        self.fn, self.out = fn, fn()

    def replay(self) -> None:
        from dsv4hal.conformance.cells import copy_into

        copy_into(self.out, self.fn())


def _capture(fn):  # noqa: ANN001, ANN202
    fn()  # the warm-up
    g = _ReplayedCall(fn)
    return g, g.out


def test_verify_graph_protocol_replays_new_steps_in_the_captured_buffers(cpu: dsv4hal.Platform) -> None:
    """One capture on step 0's buffers, later steps' inputs written in place and replayed: the replays match the
    oracle, eager and the clean run's live state (the GPU graph cells' protocol, run here with a stand-in)."""
    verdicts = verify_run(cpu, 128, Layout.recipe(128, 4), capture=_capture)
    assert verdicts["graph"].ok and verdicts["eager"].ok, verdicts["graph"].detail
