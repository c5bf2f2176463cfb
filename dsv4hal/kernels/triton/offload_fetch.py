"""offload_fetch (dsv4hal.ops.offload) in Triton: the device-side plan of dsv4hal.offload.plan (torch ops, no host
sync), then one program per (rank of the miss list, 8 KiB chunk of the page) copies its chunk from the pool to the
working slot, after writing that chunk of a dirty victim back: many small independent programs keep enough reads in
flight over the host link even when a step misses only a few pages. On a GPU the pool is pinned host memory, which
the kernel reads and writes through its device mapping (zero-copy), so the fetch needs no copy-engine call whose
size the host must know: the grid is fixed (one row of programs per possible miss), the ranks past the miss count
exit at once, and the whole fetch is CUDA-graph capturable. Bit-identical to the reference (a byte copy)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dsv4hal.formats.offload_state import OffloadState
from dsv4hal.formats.v4_cache import V4PagedCache
from dsv4hal.offload.plan import commit_fetch, plan_fetch

BLOCK = 2048  # int32 words a program moves (8 KiB): a C4 page (37440 bytes) is 5 programs


@triton.jit
def _copy_pages_kernel(host_ptr, work_ptr, load_ptr, src_ptr, dst_ptr, old_ptr, wb_ptr, words,
                       BLOCK: tl.constexpr):
    r = tl.program_id(0)
    if tl.load(load_ptr + r) != 0:
        off = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        m = off < words
        src = tl.load(src_ptr + r).to(tl.int64) * words
        dst = tl.load(dst_ptr + r).to(tl.int64) * words
        if tl.load(wb_ptr + r) != 0:
            old = tl.load(old_ptr + r).to(tl.int64) * words
            tl.store(host_ptr + old + off, tl.load(work_ptr + dst + off, mask=m), mask=m)
            tl.debug_barrier()  # the slot's bytes are out before the new page overwrites them
        tl.store(work_ptr + dst + off, tl.load(host_ptr + src + off, mask=m), mask=m)


def copy_pages(host: torch.Tensor, working: torch.Tensor, load: torch.Tensor, src: torch.Tensor, dst: torch.Tensor,
               old: torch.Tensor, writeback: torch.Tensor, programs: int, *, block: int = BLOCK,
               num_warps: int = 8) -> None:
    """Move pages by the plan's rows 0 .. programs - 1 (uint8 [pages, bytes] buffers, rows a multiple of 4). block
    (int32 words a program moves, a power of two) and num_warps: the launch's shape (benchmarks sweep them)."""
    if programs == 0:
        return
    words = host.shape[1] // 4
    grid = (programs, triton.cdiv(words, block))
    _copy_pages_kernel[grid](host.view(torch.int32), working.view(torch.int32), load.to(torch.int8), src, dst, old,
                             writeback.to(torch.int8), words, BLOCK=block, num_warps=num_warps)


def offload_fetch(indices: torch.Tensor, host: V4PagedCache, working: V4PagedCache, state: OffloadState,
                  scores: torch.Tensor, write: bool = False) -> torch.Tensor:
    plan = plan_fetch(indices, state, scores, host.page_size)
    # misses form a prefix of the ranks, at most one per index entry and one per slot
    copy_pages(host.data, working.data, plan.load, plan.src, plan.dst, plan.old, plan.writeback,
               min(working.num_pages, indices.numel()))
    return commit_fetch(indices, state, plan, host.page_size, host.data.shape[1], write)
