"""`OffloadedPool`: a C4 compressed-KV pool (V4PagedCache, pages of 64 compressed tokens) kept whole in pinned host
memory, with a working set of W pages on the device. Each step the engine passes the token slots its top-k
selected (`fetch`): the pages they touch become resident (platform op `offload_fetch`), optionally on a side stream
that the current stream then waits on, and the returned indices address the working set, so sparse attention runs
on `pool.working` unchanged. Writes (the compressed rows a step closes) go through `store_slots`, which makes their
pages resident and marks them dirty; a dirty page is written back before it is evicted, and `flush` writes all back.

Eviction is a policy the engine can replace (`EvictionPolicy`: a score per working slot, lower evicted first; LRU
by default). The indexer cache is not part of the pool: indexer_logits scores every compressed position each step,
so it stays resident (132 bytes a compressed token against the pool's 584).

What needs the host: nothing on the fetch path with the Triton kernel (plan and copies on the device, fixed grid:
CUDA-graph capturable, including the side-stream fork and join); the reference path selects its copies on the host
(a sync). Reading `stats` syncs."""

from __future__ import annotations

from typing import Any, Protocol

import torch

from dsv4hal.checks import check_alloc, check_count, check_device
from dsv4hal.errors import InvalidArgumentError, OffloadCapacityError
from dsv4hal.formats.offload_state import OffloadState
from dsv4hal.formats.v4_cache import PAGE_SIZE_BY_RATIO, V4PagedCache, page_bytes


class EvictionPolicy(Protocol):
    """Scores the working slots for eviction: int64 [W] on the state's device, lower evicted first. Called once a
    fetch, before it; it must not sync the host if the fetch is to be captured in a CUDA graph. A fresh tensor, not
    a view of the state (the op mutates the state)."""

    def scores(self, state: OffloadState) -> torch.Tensor: ...


class LRU:
    """Least recently used: the step at which each slot was last selected."""

    def scores(self, state: OffloadState) -> torch.Tensor:
        return state.last_use.clone()


class FIFO:
    """First in, first out: the step at which each slot was loaded."""

    def scores(self, state: OffloadState) -> torch.Tensor:
        return state.loaded_at.clone()


class OffloadedPool:
    """The pool in host memory, the working set on `device`, their OffloadState, and the policy (module docstring)."""

    def __init__(self, platform: Any, num_pages: int, working_pages: int, *, page_size: int = PAGE_SIZE_BY_RATIO[4],
                 fp8: str = "e4m3fn", device: torch.device | str | None = None, policy: EvictionPolicy | None = None,
                 min_step_pages: int = 0, host: V4PagedCache | None = None) -> None:
        """min_step_pages: the most distinct pages one fetch will select (top-k times the requests a call, at most
        the pool): refused now, with the remedy, if the working set cannot hold them. `host`: an existing pool to
        offload (moved to pinned memory when the device is a GPU), instead of a zero one of num_pages."""
        op = "OffloadedPool"
        self.platform = platform
        dev = check_device(op, "device", device if device is not None else platform.device_type)
        n = host.num_pages if host is not None else check_count(op, "num_pages", num_pages)
        w = check_count(op, "working_pages", working_pages, minimum=1)
        if w > n:
            raise OffloadCapacityError(op, "working_pages", f"at most num_pages ({n})", str(w),
                                       remedy="a working set as large as the pool gains nothing: keep it resident")
        need = min(check_count(op, "min_step_pages", min_step_pages), n)
        if need > w:
            raise OffloadCapacityError(op, "working_pages", f"at least {need} pages (min_step_pages, the distinct "
                                       "pages one fetch selects)", str(w),
                                       remedy=f"use working_pages >= {need}, or fetch fewer requests a call")
        host_dev = torch.device("cpu") if dev.type != "cpu" else dev
        if host is None:
            check_alloc(op, "num_pages (host pool size)", n * page_bytes(page_size), host_dev, kind="a pool")
            host = V4PagedCache.empty(n, page_size, fp8, host_dev)  # type: ignore[arg-type]
        elif host.data.device != host_dev:
            host = V4PagedCache(host.data.to(host_dev), host.page_size, host.fp8)
        if dev.type == "cuda" and not host.data.is_pinned():
            host = V4PagedCache(host.data.pin_memory(), host.page_size, host.fp8)
        self.host = host
        self.working = V4PagedCache.empty(w, host.page_size, host.fp8, dev)
        self.state = OffloadState.empty(n, w, dev)
        self.policy: EvictionPolicy = policy if policy is not None else LRU()
        self._side: torch.cuda.Stream | None = None

    @property
    def page_size(self) -> int:
        return self.host.page_size

    def _fetch(self, indices: torch.Tensor, write: bool, side_stream: bool) -> torch.Tensor:
        op = self.platform.ops.offload_fetch
        if not (side_stream and indices.is_cuda):
            return op(indices, self.host, self.working, self.state, self.policy.scores(self.state), write)
        if self._side is None:
            self._side = torch.cuda.Stream(indices.device)
        main = torch.cuda.current_stream(indices.device)
        self._side.wait_stream(main)  # the indices and the previous step's reads of the working set
        with torch.cuda.stream(self._side):
            out = op(indices, self.host, self.working, self.state, self.policy.scores(self.state), write)
        main.wait_stream(self._side)  # attention over the working set runs after the copies
        if not torch.cuda.is_current_stream_capturing():  # a captured graph's pool outlives its streams
            out.record_stream(main)  # allocated on the side stream, freed on the main one
        return out

    def fetch(self, indices: torch.Tensor, *, side_stream: bool = False) -> torch.Tensor:
        """Make the pages `indices` (token slots of the pool, -1 unused) select resident; returns the indices into
        `self.working` (int32). side_stream: run on the pool's own CUDA stream, joined back before returning."""
        return self._fetch(indices, False, side_stream)

    def store_slots(self, loc: torch.Tensor) -> torch.Tensor:
        """The working-set slots to write rows destined for pool slots `loc` (-1 skips): their pages become resident
        and dirty."""
        return self._fetch(loc, True, False)

    def flush(self) -> None:
        """Write every dirty resident page back to the host pool (selects them on the host: a sync)."""
        dirty = ((self.state.dirty != 0) & (self.state.slot_page >= 0)).nonzero().flatten()
        if dirty.numel():
            pages = self.state.slot_page[dirty].long().to(self.host.data.device)
            self.host.data[pages] = self.working.data[dirty].to(self.host.data.device)
            self.state.dirty[dirty] = 0

    def stats(self) -> dict[str, int]:
        """hits, misses, bytes_in, bytes_out so far, and the sizes (reads the counters: a host sync)."""
        return {**self.state.read_stats(), "pool_pages": self.host.num_pages, "working_pages": self.working.num_pages,
                "pool_bytes": self.host.data.numel(), "working_bytes": self.working.data.numel()}


def quarter(num_pages: int, min_step_pages: int = 0) -> int:
    """A working set of a quarter of the pool, at least min_step_pages (when the pool has that many)."""
    if num_pages <= 0:
        raise InvalidArgumentError("quarter", "num_pages", "a positive page count", str(num_pages))
    return max(1, num_pages // 4, min(min_step_pages, num_pages))
