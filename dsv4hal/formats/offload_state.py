"""The bookkeeping of a C4 pool offloaded to host memory (dsv4hal.offload): which host page each working-set slot
holds, per-slot recency for eviction, and counters, all as device tensors so that a fetch updates them without a
host sync.

A pool of N host pages and a working set of W slots (W <= N):
    page_map  int32 [N]: the working slot holding host page p, -1 if p is not resident;
    slot_page int32 [W]: the host page slot s holds, -1 if the slot is empty (page_map[slot_page[s]] == s);
    last_use  int64 [W]: the step at which slot s was last selected (-1 never), LRU's key;
    loaded_at int64 [W]: the step at which slot s was loaded (-1 never), FIFO's key;
    dirty     int32 [W]: 1 when the slot was written since it was loaded (written back to host before eviction);
    step      int64 [1]: the fetches done (the step counter the keys above hold);
    stats     int64 [4]: hits (selected pages already resident), misses (pages loaded), bytes moved host to
              device, bytes written back device to host.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dsv4hal.checks import check_count, check_device, check_tensor
from dsv4hal.errors import InvalidArgumentError

STATS = ("hits", "misses", "bytes_in", "bytes_out")


@dataclass
class OffloadState:
    """Page map, slot owners, recency, dirty flags, step counter and stats of an offloaded pool (module docstring)."""

    page_map: torch.Tensor
    slot_page: torch.Tensor
    last_use: torch.Tensor
    loaded_at: torch.Tensor
    dirty: torch.Tensor
    step: torch.Tensor
    stats: torch.Tensor

    @classmethod
    def empty(cls, num_pages: int, working_pages: int, device: torch.device | str = "cpu") -> OffloadState:
        """Nothing resident: every page absent, every slot empty, counters zero."""
        op = "OffloadState.empty"
        n = check_count(op, "num_pages", num_pages)
        w = check_count(op, "working_pages", working_pages)
        if w > n:
            raise InvalidArgumentError(op, "working_pages", f"at most num_pages ({n})", str(w),
                                       remedy="a working set larger than the pool holds nothing more: keep the "
                                              "pool resident instead")
        dev = check_device(op, "device", device)

        def full(size: int, value: int, dtype: torch.dtype) -> torch.Tensor:
            return torch.full((size,), value, dtype=dtype, device=dev)

        return cls(full(n, -1, torch.int32), full(w, -1, torch.int32), full(w, -1, torch.int64),
                   full(w, -1, torch.int64), full(w, 0, torch.int32), full(1, 0, torch.int64),
                   full(len(STATS), 0, torch.int64))

    @property
    def num_pages(self) -> int:
        return int(self.page_map.shape[0])

    @property
    def working_pages(self) -> int:
        return int(self.slot_page.shape[0])

    def validate(self, op: str, name: str, device: torch.device) -> None:
        """Raise InvalidArgumentError unless every field has its dtype and shape, on `device` (no value reads)."""
        check_tensor(op, f"{name}.page_map", self.page_map, dtype=torch.int32, shape=(None,), device=device,
                     contiguous=True)
        n = self.page_map.shape[0]
        check_tensor(op, f"{name}.slot_page", self.slot_page, dtype=torch.int32, shape=(None,), device=device,
                     contiguous=True)
        w = self.slot_page.shape[0]
        for field, dtype, size in (("last_use", torch.int64, w), ("loaded_at", torch.int64, w),
                                   ("dirty", torch.int32, w), ("step", torch.int64, 1),
                                   ("stats", torch.int64, len(STATS))):
            check_tensor(op, f"{name}.{field}", getattr(self, field), dtype=dtype, shape=(size,), device=device,
                         contiguous=True)
        if w > n:
            raise InvalidArgumentError(op, f"{name}.slot_page", f"at most {n} slots (the pool's pages)", str(w),
                                       remedy="build the state with OffloadState.empty(num_pages, working_pages)")

    def read_stats(self) -> dict[str, int]:
        """The counters as Python ints (reads them: a host sync on a GPU)."""
        return dict(zip(STATS, (int(v) for v in self.stats.tolist()), strict=True))
