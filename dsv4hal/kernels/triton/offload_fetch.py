"""offload_fetch (dsv4hal.ops.offload) in Triton: the device-side plan of dsv4hal.offload.plan (torch ops, no host
sync), then one program per rank of the miss list copies its page, 16-byte words, from the pool to the working
slot (after writing a dirty victim back). On a GPU the pool is pinned host memory, which the kernel reads and
writes through its device mapping (zero-copy over the host link), so the fetch needs no copy-engine call whose
size the host must know: the grid is fixed (one program per possible miss), the ranks past the miss count exit
at once, and the whole fetch is CUDA-graph capturable. Bit-identical to the reference (a byte copy)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dsv4hal.formats.offload_state import OffloadState
from dsv4hal.formats.v4_cache import V4PagedCache
from dsv4hal.offload.plan import commit_fetch, plan_fetch

BLOCK = 1024  # int32 words a loop iteration moves per program (4 KiB)


@triton.jit
def _copy_pages_kernel(host_ptr, work_ptr, load_ptr, src_ptr, dst_ptr, old_ptr, wb_ptr, words,
                       BLOCK: tl.constexpr):
    r = tl.program_id(0)
    if tl.load(load_ptr + r) != 0:
        src = tl.load(src_ptr + r).to(tl.int64) * words
        dst = tl.load(dst_ptr + r).to(tl.int64) * words
        if tl.load(wb_ptr + r) != 0:
            old = tl.load(old_ptr + r).to(tl.int64) * words
            for start in range(0, words, BLOCK):
                off = start + tl.arange(0, BLOCK)
                m = off < words
                tl.store(host_ptr + old + off, tl.load(work_ptr + dst + off, mask=m), mask=m)
            tl.debug_barrier()  # the slot's bytes are out before the new page overwrites them
        for start in range(0, words, BLOCK):
            off = start + tl.arange(0, BLOCK)
            m = off < words
            tl.store(work_ptr + dst + off, tl.load(host_ptr + src + off, mask=m), mask=m)


def copy_pages(host: torch.Tensor, working: torch.Tensor, load: torch.Tensor, src: torch.Tensor, dst: torch.Tensor,
               old: torch.Tensor, writeback: torch.Tensor, programs: int) -> None:
    """Move pages by the plan's rows 0 .. programs - 1 (uint8 [pages, bytes] buffers, rows a multiple of 4)."""
    if programs == 0:
        return
    words = host.shape[1] // 4
    _copy_pages_kernel[(programs,)](host.view(torch.int32), working.view(torch.int32), load.to(torch.int8), src,
                                    dst, old, writeback.to(torch.int8), words, BLOCK=BLOCK, num_warps=4)


def offload_fetch(indices: torch.Tensor, host: V4PagedCache, working: V4PagedCache, state: OffloadState,
                  scores: torch.Tensor, write: bool = False) -> torch.Tensor:
    plan = plan_fetch(indices, state, scores, host.page_size)
    # misses form a prefix of the ranks, at most one per index entry and one per slot
    copy_pages(host.data, working.data, plan.load, plan.src, plan.dst, plan.old, plan.writeback,
               min(working.num_pages, indices.numel()))
    return commit_fetch(indices, state, plan, host.page_size, host.data.shape[1], write)
