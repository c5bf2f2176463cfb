"""Op contract: `offload_fetch`, the page fetch of a C4 pool kept in host memory (dsv4hal.offload).

offload_fetch(indices, host, working, state, scores, write=False) -> remapped
    indices  int32/int64, any shape, on the working set's device: token slots of the pool (page i // P, offset
             i % P; the sparse attention's extra_indices, or a store's locations), -1 = unused;
    host     V4PagedCache of N pages, the whole pool: pinned host memory when the working set is on a GPU (the same
             device otherwise);
    working  V4PagedCache of W <= N pages of the same page size and flavour: the device's working set;
    state    OffloadState (page map, slot owners, recency, dirty flags, step, stats) of N pages and W slots;
    scores   int64 [W] on the working device: the eviction policy's key per slot, lower evicted first (LRU: the
             step of last use, state.last_use);
    write    the caller writes the selected pages after the fetch (a store): they are marked dirty and written
             back to the host before they are evicted.
Every page the indices select becomes resident: a missing page is copied into a working slot, which is an empty
slot, else the lowest-scored slot holding no page this call selects (a dirty one written back first). The
selected slots' last use becomes the step, the step advances, and the stats count hits (selected pages resident
before), misses (pages loaded), bytes in and bytes written back. Returns int32 of the indices' shape: each
entry's slot in the working set (page map * P + offset), -1 for -1, so sparse_attention_decode over `working`
with the remapped indices reads the rows it would read over the whole pool, bit for bit.

Rejected: a working set larger than the pool or of another page size or flavour. Checked mode also refuses
indices other than -1 outside [0, N * P) and a call selecting more distinct pages than W
(OffloadCapacityError, naming the minimum working set); both read the indices (a host sync). Unchecked, an
entry that is not a slot of the pool is skipped (remapped to -1), and with too small a working set the pages
past the free slots are not loaded (their entries remap to -1): no access outside the buffers either way.
"""

from __future__ import annotations

import torch

from dsv4hal.checks import check_index_range, check_tensor, describe
from dsv4hal.errors import InvalidArgumentError, OffloadCapacityError
from dsv4hal.formats.offload_state import OffloadState
from dsv4hal.formats.v4_cache import V4PagedCache
from dsv4hal.ops.signatures import define

OP = "offload_fetch"
INDEX_DTYPES = (torch.int32, torch.int64)


def _check_cache(name: str, cache: object) -> V4PagedCache:
    if not isinstance(cache, V4PagedCache):
        raise InvalidArgumentError(OP, name, "a V4PagedCache", describe(cache),
                                   remedy="allocate with V4PagedCache.empty(num_pages, page_size)")
    cache.validate(OP, name)
    return cache


def host_kind(host: V4PagedCache, working: V4PagedCache) -> str:
    """Where the pool lives relative to the working set: "same" device, "pinned" or "pageable" host memory."""
    if host.data.device == working.data.device:
        return "same"
    return "pinned" if host.data.is_pinned() else "pageable"


def validate(indices: object, host: object, working: object, state: object, scores: object, write: object = False,
             *, checked: bool = False) -> None:
    """Raise InvalidArgumentError unless the arguments meet the offload_fetch contract (module docstring)."""
    host, working = _check_cache("host", host), _check_cache("working", working)
    dev = working.data.device
    if working.page_size != host.page_size or working.fp8 != host.fp8:
        raise InvalidArgumentError(OP, "working", f"page size {host.page_size} and fp8 {host.fp8} (the host pool's)",
                                   f"page size {working.page_size}, fp8 {working.fp8}",
                                   remedy="allocate the working set like the pool, with fewer pages")
    if host.data.device.type != "cpu" and host.data.device != dev:
        raise InvalidArgumentError(OP, "host", f"a pool in host memory or on {dev}", describe(host.data))
    if not isinstance(state, OffloadState):
        raise InvalidArgumentError(OP, "state", "an OffloadState", describe(state),
                                   remedy="build it with OffloadState.empty(num_pages, working_pages, device)")
    state.validate(OP, "state", dev)
    if state.num_pages != host.num_pages or state.working_pages != working.num_pages:
        raise InvalidArgumentError(OP, "state", f"{host.num_pages} pages and {working.num_pages} slots (the caches')",
                                   f"{state.num_pages} pages and {state.working_pages} slots",
                                   remedy="build the state with OffloadState.empty(host pages, working pages)")
    indices = check_tensor(OP, "indices", indices, dtype=INDEX_DTYPES, device=dev)
    check_tensor(OP, "scores", scores, dtype=torch.int64, shape=(working.num_pages,), device=dev)
    if not isinstance(write, bool):
        raise InvalidArgumentError(OP, "write", "a bool", describe(write))
    if checked:
        check_index_range(OP, "indices", indices, host.num_slots)
        idx = indices.reshape(-1).long()
        distinct = int((idx[idx >= 0] // host.page_size).unique().numel())
        if distinct > working.num_pages:
            raise OffloadCapacityError(
                OP, "working", f"a working set of at least {distinct} pages (the distinct pages this call selects)",
                f"{working.num_pages} pages",
                remedy=f"build the pool with working_pages >= {distinct}, or fetch fewer requests a call")


def case(indices: torch.Tensor, host: V4PagedCache, working: V4PagedCache, state: OffloadState, scores: torch.Tensor,
         write: bool = False) -> dict[str, object]:
    """Hashable features for kernel selection: where the pool lives, the page size."""
    return {"host": host_kind(host, working), "page_size": host.page_size}


def fake(indices: torch.Tensor, host: V4PagedCache, working: V4PagedCache, state: OffloadState, scores: torch.Tensor,
         write: bool = False) -> torch.Tensor:
    return indices.new_empty(indices.shape, dtype=torch.int32)


@define(validate=validate, case=case, fake=fake, mutates=("host", "working", "state"))
def offload_fetch(indices: torch.Tensor, host: V4PagedCache, working: V4PagedCache, state: OffloadState,
                  scores: torch.Tensor, write: bool = False) -> torch.Tensor:
    """Make the pool pages the indices select resident in the working set and remap the indices into it.

    Arguments:
        indices: any shape, torch.int32 or torch.int64, on the working set's device: token slots of the pool
            (page i // P, offset i % P); -1 is unused.
        host: V4PagedCache of N pages, the whole pool (pinned host memory for a GPU working set). Written only by
            write-backs of dirty pages.
        working: V4PagedCache of W <= N pages, same page size and flavour, on the device. Mutated.
        state: OffloadState of N pages and W slots on the working device (page map, owners, recency, dirty flags,
            step, stats). Mutated.
        scores: (W,), torch.int64: the eviction policy's key per slot, lower evicted first.
        write: the caller writes the selected pages after the fetch: mark them dirty.

    Returns:
        torch.int32 of the indices' shape: each entry's slot in the working set, -1 for -1.

    Rejected (InvalidArgumentError): caches of other page sizes or flavours, a working set larger than the pool, a
    state of other sizes, other dtypes or devices. Checked mode also refuses indices outside [0, N * P) other than
    -1, and a call selecting more than W distinct pages (OffloadCapacityError, naming the minimum).
    """
