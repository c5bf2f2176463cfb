"""offload_fetch and OffloadedPool: the Triton kernel against the reference on the conformance cases, LRU and a
replaced policy, never evicting a page the call selects, write-back of dirty pages, the typed errors, unchecked
indices kept inside the buffers, and a CUDA-graph capture on a GPU."""

from __future__ import annotations

import pytest
import torch
from conftest import TRITON_DEVICE
from guard_memory import Guards, assert_confined

import dsv4hal
from dsv4hal.conformance import cases_offload as cases
from dsv4hal.errors import InvalidArgumentError, OffloadCapacityError
from dsv4hal.formats.offload_state import OffloadState
from dsv4hal.formats.v4_cache import V4PagedCache
from dsv4hal.offload.pool import FIFO, OffloadedPool, quarter

REF, TRITON = "torch_reference", "triton_offload_fetch"


def _platform(impl: str, checked: bool = False, device: torch.device = TRITON_DEVICE) -> dsv4hal.Platform:
    with dsv4hal.overrides(kernels={"offload_fetch": impl}):
        return dsv4hal.select_platform("cpu" if device.type == "cpu" else None, checked=checked)


def _pool(impl: str = REF, pages: int = 8, working: int = 2, **kw: object) -> OffloadedPool:
    g = torch.Generator().manual_seed(0)
    host = V4PagedCache(torch.randint(0, 256, (pages, 37440), generator=g, dtype=torch.uint8), 64)
    return OffloadedPool(_platform(impl, kw.pop("checked", False)), 0, working, host=host, device=TRITON_DEVICE,
                         **kw)  # type: ignore[arg-type]


def _slots(*pages: int) -> torch.Tensor:
    return torch.tensor([p * 64 + 3 for p in pages], dtype=torch.int32, device=TRITON_DEVICE)


def _resident(pool: OffloadedPool) -> list[int]:
    return sorted(p for p in pool.state.slot_page.tolist() if p >= 0)


@pytest.mark.parametrize("spec", [c for c in cases.CASES if not c.gpu_only], ids=lambda c: c.name)
def test_triton_fetch_matches_reference_state_and_bytes(spec: cases.CaseSpec) -> None:
    """The Triton kernel passes the oracle and leaves the state, working set and remap the reference leaves."""
    pytest.importorskip("triton")
    runs = []
    for impl in (REF, TRITON):
        fx = cases.build(spec, TRITON_DEVICE, torch.Generator().manual_seed(3))
        ret = _platform(impl).ops.offload_fetch(**fx.args)
        err, ok, detail = fx.compare(fx.extract(ret, fx.args), fx.expected)
        assert ok, f"{impl}: {detail}"
        runs.append((ret, fx.args))
    (r0, a0), (r1, a1) = runs
    assert torch.equal(r0, r1) and torch.equal(a0["working"].data, a1["working"].data)
    assert torch.equal(a0["host"].data, a1["host"].data)
    for f in ("page_map", "slot_page", "last_use", "loaded_at", "dirty", "step", "stats"):
        assert torch.equal(getattr(a0["state"], f), getattr(a1["state"], f)), f


@pytest.mark.parametrize("impl", [REF, TRITON])
def test_lru_evicts_the_least_recently_used_page_never_a_selected_one(impl: str) -> None:
    """LRU replaces the page used longest ago and keeps the pages the same call selects."""
    pool = _pool(impl, pages=8, working=3)
    pool.fetch(_slots(0, 1, 2))
    pool.fetch(_slots(0))  # page 0 used again: 1 is now the least recent
    pool.fetch(_slots(1, 5))  # 1 is selected, so 2 goes (not 1, the LRU page)
    assert _resident(pool) == [0, 1, 5]
    pool.fetch(_slots(6))
    assert _resident(pool) == [1, 5, 6]  # 0 went: used at step 1, before 1 and 5 (step 2)
    assert pool.stats()["hits"] == 2 and pool.stats()["misses"] == 5


def test_replaced_policy_decides_the_victim() -> None:
    """A FIFO policy evicts the page loaded first even when it was used last."""
    pool = _pool(pages=8, working=2, policy=FIFO())
    pool.fetch(_slots(0))
    pool.fetch(_slots(1))
    pool.fetch(_slots(0))
    pool.fetch(_slots(2))
    assert _resident(pool) == [1, 2]


@pytest.mark.parametrize("impl", [REF, TRITON])
def test_dirty_page_is_written_back_before_eviction_and_by_flush(impl: str) -> None:
    """A page stored through the pool reaches the host when evicted, and every dirty page on flush."""
    pool = _pool(impl, pages=4, working=2)
    slot = pool.store_slots(_slots(1)).long()
    pool.working.data[slot // 64] = 7
    pool.fetch(_slots(2))
    pool.fetch(_slots(3))  # evicts page 1 (least recent): written back
    assert bool((pool.host.data[1] == 7).all())
    slot = pool.store_slots(_slots(0)).long()
    pool.working.data[slot // 64] = 9
    pool.flush()
    assert bool((pool.host.data[0] == 9).all()) and pool.stats()["bytes_out"] == 37440
    assert int(pool.state.dirty.sum()) == 0


def test_remapped_entries_keep_offsets_and_minus_one() -> None:
    """Remapped slots keep each entry's offset in its page, and -1 stays -1."""
    pool = _pool(pages=8, working=4)
    idx = torch.tensor([[5 * 64 + 17, -1, 2 * 64 + 63]], dtype=torch.int32, device=TRITON_DEVICE)
    out = pool.fetch(idx)
    assert out.dtype == torch.int32 and out[0, 1] == -1
    assert (out[0, [0, 2]] % 64).tolist() == [17, 63]
    assert torch.equal(pool.working.data[out[0, 0].long() // 64].cpu(), pool.host.data[5].cpu())


def test_pool_refuses_a_working_set_larger_than_the_pool() -> None:
    """A working set above the pool's pages is a typed error naming working_pages."""
    with pytest.raises(OffloadCapacityError, match="working_pages"):
        _pool(pages=4, working=5)
    with pytest.raises(InvalidArgumentError, match="working_pages"):
        OffloadState.empty(4, 5)


def test_pool_refuses_a_working_set_below_one_step_and_names_the_minimum() -> None:
    """min_step_pages above the working set is refused with the minimum in the remedy."""
    with pytest.raises(OffloadCapacityError, match="working_pages >= 3"):
        _pool(pages=8, working=2, min_step_pages=3)
    assert quarter(4096, 512) == 1024 and quarter(1024, 512) == 512 and quarter(100, 512) == 100


def test_checked_fetch_refuses_more_distinct_pages_than_the_working_set() -> None:
    """Checked mode refuses a call selecting more pages than the working set holds, naming the minimum."""
    pool = _pool(pages=8, working=2, checked=True)
    with pytest.raises(OffloadCapacityError, match="working_pages >= 3"):
        pool.fetch(_slots(0, 1, 2))


@pytest.mark.parametrize("bad", [-7, 8 * 64])
def test_checked_fetch_refuses_indices_out_of_range(bad: int) -> None:
    """Checked mode refuses an index below -1 or past the pool."""
    pool = _pool(pages=8, working=2, checked=True)
    with pytest.raises(InvalidArgumentError, match="indices"):
        pool.fetch(torch.tensor([3, bad], dtype=torch.int32, device=TRITON_DEVICE))


def test_fetch_refuses_mismatched_caches() -> None:
    """A working set of another page size is refused naming `working`."""
    pool = _pool()
    wrong = V4PagedCache.empty(2, 2, device=TRITON_DEVICE)
    with pytest.raises(InvalidArgumentError, match="working"):
        pool.platform.ops.offload_fetch(_slots(0), pool.host, wrong, pool.state, pool.policy.scores(pool.state))


@pytest.mark.parametrize("bad", ["minus_one", "other_negative", "end", "too_many_pages"])
@pytest.mark.parametrize("impl", [REF, TRITON])
def test_unchecked_bad_indices_stay_inside_the_buffers(impl: str, bad: str) -> None:
    """Unchecked: -1, other negatives, indices past the pool and a call needing more pages than the working set
    touch nothing outside the buffers; the entries the working set cannot hold remap to -1."""
    pytest.importorskip("triton")
    p = _platform(impl)
    pages, working = 4, 2
    value = {"minus_one": -1, "other_negative": -7, "end": pages * 64, "too_many_pages": 2 * 64 + 1}[bad]
    idx = torch.tensor([0 * 64 + 5, value, 1 * 64 + 9], dtype=torch.int32)
    host0 = torch.randint(0, 256, (pages, 37440), generator=torch.Generator().manual_seed(1), dtype=torch.uint8)

    def build(guard: Guards):  # noqa: ANN202
        host = V4PagedCache(guard(host0.to(TRITON_DEVICE)), 64)
        work = V4PagedCache(guard(torch.zeros(working, 37440, dtype=torch.uint8, device=TRITON_DEVICE)), 64)
        s = OffloadState.empty(pages, working, TRITON_DEVICE)
        state = OffloadState(*(guard(getattr(s, f)) for f in ("page_map", "slot_page", "last_use", "loaded_at",
                                                               "dirty", "step", "stats")))
        ii, scores = guard(idx.to(TRITON_DEVICE)), guard(s.last_use.clone())
        return (lambda: p.ops.offload_fetch(ii, host, work, state, scores)), [work.data, host.data]

    out = assert_confined(build).cpu()
    assert out[1] == -1 and (out[[0, 2]] % 64).tolist() == [5, 9]


@pytest.mark.gpu
def test_triton_fetch_is_captured_in_a_cuda_graph_and_replays() -> None:
    """On a GPU the Triton fetch (plan and copies from pinned memory) is captured and replays new indices."""
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    from dsv4hal.cuda_graphs import capture

    pool = _pool(TRITON, pages=64, working=16)
    assert pool.host.data.is_pinned()
    idx = _slots(*range(8))
    pool.fetch(idx)  # warm-up (Triton compiles)
    graph, out = capture(lambda: pool.fetch(idx))
    idx.copy_(_slots(*range(20, 28)))
    graph.replay()
    torch.cuda.synchronize()
    got = pool.working.data[out.long() // 64].cpu()
    assert torch.equal(got, pool.host.data[20:28])
