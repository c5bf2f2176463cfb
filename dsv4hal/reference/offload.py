"""Pure-PyTorch `offload_fetch` (contract in dsv4hal.ops.offload): the shared device-side plan
(dsv4hal.offload.plan), then the page moves as indexed copies. Those copies select the moving pages on the host
(a sync when the working set is on a GPU), so this path is not CUDA-graph capturable; the Triton kernel is."""

from __future__ import annotations

import torch

from dsv4hal.formats.offload_state import OffloadState
from dsv4hal.formats.v4_cache import V4PagedCache
from dsv4hal.offload.plan import commit_fetch, plan_fetch


def offload_fetch(indices: torch.Tensor, host: V4PagedCache, working: V4PagedCache, state: OffloadState,
                  scores: torch.Tensor, write: bool = False) -> torch.Tensor:
    """Write back the dirty victims, load the missing pages, update the state; return the remapped indices."""
    plan = plan_fetch(indices, state, scores, host.page_size)
    hdev = host.data.device
    wb = plan.writeback.nonzero().flatten()
    if wb.numel():
        host.data[plan.old[wb].to(hdev)] = working.data[plan.dst[wb]].to(hdev)
    ld = plan.load.nonzero().flatten()
    if ld.numel():
        working.data[plan.dst[ld]] = host.data[plan.src[ld].to(hdev)].to(working.data.device)
    return commit_fetch(indices, state, plan, host.page_size, host.data.shape[1], write)
