"""What one `offload_fetch` does, decided on the device without a host sync (the reference and the Triton kernel
share it; they differ only in how the pages move).

For the token slots `indices` (-1 unused) of an N-page pool with a W-slot working set:
  1. needed[p]: host page p is selected (a scatter into N + 1 flags, the last one catching the skipped entries);
  2. misses (needed, not resident) get ranks 0.. by a cumulative sum, so the miss list is a dense prefix of a
     W-long buffer with no data-dependent size;
  3. victims: the slots sorted by key, empty slots first (key int64 min), then the eviction policy's scores,
     lower first, stable (ties by slot), slots holding a needed page last (key int64 max, never evicted);
  4. rank r loads miss r into victim slot order[r] when that slot is not needed (with too small a working set, the
     misses past the free slots are not loaded and their entries map to -1: checked mode refuses that case);
     a dirty victim is first written back to its host page.
Every update is a scatter with a trash index past the end of a copy one element longer, so masked rows write
nowhere and the whole plan is CUDA-graph capturable."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dsv4hal.formats.offload_state import OffloadState

_MAX = torch.iinfo(torch.int64).max
_MIN = torch.iinfo(torch.int64).min


@dataclass
class FetchPlan:
    """load[r]: rank r moves host page src[r] into working slot dst[r]; writeback[r]: slot dst[r] first goes back
    to host page old[r]. Ranks that load form a prefix (ranks 0 .. misses - 1)."""

    load: torch.Tensor
    src: torch.Tensor
    dst: torch.Tensor
    old: torch.Tensor
    writeback: torch.Tensor
    pages: torch.Tensor  # the host page of each index entry (N for an entry that is not a slot of the pool)
    needed: torch.Tensor  # [N] the pages the indices select
    hits: torch.Tensor  # selected pages resident before the fetch (0-dim)


def _scatter(base: torch.Tensor, index: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """base with base[index] = values where index < len(base); index == len(base) writes nowhere."""
    ext = torch.cat([base, base.new_zeros(1)])
    ext.index_put_((index,), values.to(base.dtype))
    return ext[:-1]


def plan_fetch(indices: torch.Tensor, state: OffloadState, scores: torch.Tensor, page_size: int) -> FetchPlan:
    """The plan (module docstring); reads the state, changes nothing."""
    n, w = state.num_pages, state.working_pages
    dev = state.page_map.device
    idx = indices.reshape(-1).long()
    pages = torch.where((idx >= 0) & (idx < n * page_size), idx // page_size, n)
    needed = torch.zeros(n + 1, dtype=torch.bool, device=dev).index_fill_(0, pages, True)[:n]
    resident = state.page_map >= 0
    miss = needed & ~resident
    slot_page = state.slot_page.long()
    needed_ext = torch.cat([needed, needed.new_zeros(1)])
    slot_needed = needed_ext.index_select(0, torch.where(slot_page >= 0, slot_page, n))
    key = torch.where(slot_needed, _MAX, torch.where(slot_page < 0, _MIN, scores.long()))
    order = torch.sort(key, stable=True).indices
    rank = torch.cumsum(miss.long(), 0) - 1
    take = miss & (rank < w)
    src = _scatter(torch.full((w,), -1, dtype=torch.long, device=dev), torch.where(take, rank, w),
                   torch.arange(n, device=dev))
    load = (src >= 0) & (key.index_select(0, order) != _MAX)
    old = slot_page.index_select(0, order)
    writeback = load & (old >= 0) & (state.dirty.index_select(0, order) != 0)
    return FetchPlan(load, src, order, old, writeback, pages, needed, (needed & resident).sum())


def commit_fetch(indices: torch.Tensor, state: OffloadState, plan: FetchPlan, page_size: int, page_bytes: int,
                 write: bool) -> torch.Tensor:
    """Apply the plan to the state (page map, owners, recency, dirty flags, counters, step) and return the
    indices remapped into the working set (int32, -1 for entries that are not resident)."""
    n, w = state.num_pages, state.working_pages
    dev = state.page_map.device
    load, step = plan.load, state.step
    evicted = torch.where(load & (plan.old >= 0), plan.old, n)
    page_map = _scatter(state.page_map, evicted, torch.full((w,), -1, dtype=torch.long, device=dev))
    page_map = _scatter(page_map, torch.where(load, plan.src, n), plan.dst)
    state.page_map.copy_(page_map)
    dst = torch.where(load, plan.dst, w)
    state.slot_page.copy_(_scatter(state.slot_page, dst, plan.src))
    state.loaded_at.copy_(_scatter(state.loaded_at, dst, step.expand(w)))
    state.dirty.copy_(_scatter(state.dirty, dst, torch.zeros_like(dst)))
    used = torch.where(plan.needed & (page_map >= 0), page_map.long(), w)
    state.last_use.copy_(_scatter(state.last_use, used, step.expand(n)))
    if write:
        state.dirty.copy_(_scatter(state.dirty, used, torch.ones_like(used)))
    loaded, written = load.sum(), plan.writeback.sum()
    state.stats.add_(torch.stack([plan.hits, loaded, loaded * page_bytes, written * page_bytes]))
    step.add_(1)
    slot = torch.cat([page_map, page_map.new_full((1,), -1)]).index_select(0, plan.pages).long()
    idx = indices.reshape(-1).long()
    out = torch.where(slot >= 0, slot * page_size + idx % page_size, -1)
    return out.to(torch.int32).reshape(indices.shape)


def distinct_pages(indices: torch.Tensor, num_pages: int, page_size: int) -> int:
    """How many distinct pool pages the indices select (reads the count: a host sync)."""
    idx = indices.reshape(-1).long()
    pages = idx[(idx >= 0) & (idx < num_pages * page_size)] // page_size
    return int(pages.unique().numel())
