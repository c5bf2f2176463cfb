"""Portable Triton route alignment: the moe_align_block_size contract of dsv4hal.kernels.aligned_routes, bit-identical
to the torch version in dsv4hal.kernels.moe_align, in one launch (at most FUSED_MAX_ROUTES routes), two or three,
with no host sync and output sizes that depend on shapes only, so it can be captured in a CUDA graph and replayed
with new routing.

Routes are walked in sub-chunks of C, in order. A route's stable rank inside its expert is the count of that
expert's routes before its sub-chunk (a per-expert counter vector in registers: tl.gather reads it, tl.histogram
advances it) plus the number of earlier routes of that expert inside the sub-chunk (a [C, C] comparison).

  COUNT: per-expert route counts of this program's routes.
  SCAN:  (its own small launch, from SCAN_MIN_PROGRAMS programs) each expert's counts over the programs turned into
         each program's prefix, and the totals; with fewer programs PLACE sums the histogram itself.
  PLACE: from the totals the padded offsets (cumsum over experts), plus this program's prefix; then this program's
         routes, its share of the padding and tail, and the experts of the used blocks (program 0 also writes
         num_padded and each expert's unaligned end, start + count).
One program runs COUNT and PLACE in one launch (decode sizes), or COUNT, (SCAN) and PLACE are launches over NC
programs that meet through an [NC + 1, E] histogram in global memory. Every output element has exactly one writer
(routes, padding and tail are disjoint), so nothing relies on ordering memory between threads inside a program."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dsv4hal.kernels.aligned_routes import AlignedRoutes, route_blocks

C = 64  # routes per sub-chunk: the [C, C] rank tile stays spill-free (ptxas sm_90: 128 registers at 2 warps)
# Up to this many routes one program does everything in one launch. Its sub-chunks run one after another: on the H200 (E
# 256, blocks of 8; bench/results/h200/sweep-moe-align.json, "one_program") one program took 6.8 / 8.6 / 13.9 / 17.5 us
# at 96 / 192 / 384 / 512 routes, two launches over several programs 6.6-6.8 us at every count from 96
FUSED_MAX_ROUTES = 2 * C
MAX_PROGRAMS = 128  # each PLACE program reads all NC histogram rows, so NC stays modest
FILL = 1024
SCAN_ELEMENTS = 4096  # histogram entries a _scan_kernel program holds (32 a thread at 4 warps)
# From this many programs the SCAN launch runs between COUNT and PLACE; with fewer, each PLACE program sums the NC
# histogram rows itself. H200, E 256, CUDA graphs, both ways in turns (sweep-moe-align.json,
# "scan_prefill" and "scan_decode"; identical outputs): NC 128 (T = 4096, blocks of 128) 15.2-15.3 -> 12.7 us, NC 96
# (T = 1024) 10.2-10.3 -> 9.1; NC 48 (T = 512) 8.3-8.5 -> 8.8-9.0, NC 3-8 (decode, blocks of 8) 6.4-6.7 -> 7.4-7.9.
SCAN_MIN_PROGRAMS = 64


def _num_warps() -> int:
    """One thread a route of a sub-chunk: tl.histogram's input is then not replicated across threads (older
    Triton miscounted some replicated layouts)."""
    return max(1, C // (64 if torch.version.hip else 32))


@triton.jit
def _load_ids(ids_ptr, start, end, C: tl.constexpr):
    i = start + tl.arange(0, C)
    return tl.load(ids_ptr + i, mask=i < end, other=-1)


@triton.jit
def _chunk(x, start, end, E, C: tl.constexpr):
    """Ids x of routes [start, start + C) clipped to end: (route ids, in range, valid, expert (0 where not
    valid), rank among the earlier routes of the same expert in this sub-chunk)."""
    i = start + tl.arange(0, C)
    inside = i < end
    valid = inside & (x >= 0) & (x < E)  # compared in the ids' own dtype: huge int64 ids are dropped, not wrapped
    key = tl.where(valid, x, -1).to(tl.int32)  # dropped and out-of-range routes match nothing
    same = (key[:, None] == key[None, :]) & (tl.arange(0, C)[None, :] < tl.arange(0, C)[:, None])
    rank = tl.sum(same.to(tl.int32), axis=1)
    return i, inside, valid, tl.maximum(key, 0), rank


# no specialisation on the sizes: one compiled kernel per (BLOCK_E, phase), whatever T a graph is captured at
@triton.jit(do_not_specialize=["numel", "E", "block", "rows", "nb", "per_prog", "NC"])
def _align_kernel(ids_ptr, sorted_ptr, block_expert_ptr, num_padded_ptr, row_ptr, expert_end_ptr, hist_ptr, numel,
                  E, block, rows, nb, per_prog, NC, C: tl.constexpr, BLOCK_E: tl.constexpr,
                  QB: tl.constexpr, MB: tl.constexpr, JT: tl.constexpr, FILL: tl.constexpr, COUNT: tl.constexpr,
                  PLACE: tl.constexpr, SCANNED: tl.constexpr):
    p = tl.program_id(0)
    e_ar = tl.arange(0, BLOCK_E)
    start = p * per_prog
    end = tl.minimum(start + per_prog, numel)
    cnt = tl.zeros([BLOCK_E], tl.int32)
    if COUNT:
        x = _load_ids(ids_ptr, start, end, C)
        for s in range(start, end, C):
            x_next = _load_ids(ids_ptr, s + C, end, C)  # in flight while this sub-chunk is counted
            i, inside, valid, e, rank = _chunk(x, s, end, E, C)
            cnt += tl.histogram(e, BLOCK_E, mask=valid)
            x = x_next
        if not PLACE:
            tl.store(hist_ptr + p * BLOCK_E + e_ar, cnt)
    if PLACE:
        if COUNT:  # one program: its counts are everything
            tot = cnt
            pre = tl.zeros([BLOCK_E], tl.int32)
        elif SCANNED:  # _scan_kernel left this program's prefix in its row and the totals in row NC
            pre = tl.load(hist_ptr + p * BLOCK_E + e_ar)
            tot = tl.load(hist_ptr + NC * BLOCK_E + e_ar)
        else:  # few programs: each sums the NC rows itself (a launch less)
            tot = tl.zeros([BLOCK_E], tl.int32)
            pre = tl.zeros([BLOCK_E], tl.int32)
            for q0 in range(0, NC, QB):
                q = q0 + tl.arange(0, QB)
                h = tl.load(hist_ptr + q[:, None] * BLOCK_E + e_ar[None, :], mask=(q < NC)[:, None], other=0)
                tot += tl.sum(h, axis=0)
                pre += tl.sum(tl.where((q < p)[:, None], h, 0), axis=0)
        padded = (tot + block - 1) // block * block  # 0 past E: no route has a key there
        ends = tl.cumsum(padded, axis=0)
        starts = ends - padded
        total = tl.sum(padded, axis=0)
        tl.store(num_padded_ptr, total, mask=p == 0)
        if p == 0:  # each expert's unaligned end: DeepGEMM's psum layout
            tl.store(expert_end_ptr + e_ar, starts + tot, mask=e_ar < E)
        base = starts + pre
        x = _load_ids(ids_ptr, start, end, C)
        for s in range(start, end, C):
            x_next = _load_ids(ids_ptr, s + C, end, C)
            i, inside, valid, e, rank = _chunk(x, s, end, E, C)
            dest = tl.gather(base, e, 0) + rank
            tl.store(sorted_ptr + dest, i, mask=valid)
            tl.store(row_ptr + i, tl.where(valid, dest, rows).to(tl.int64), mask=inside)
            base += tl.histogram(e, BLOCK_E, mask=valid)
            x = x_next
        # padding after each expert's routes (fewer than block), shared out over the programs
        fill_from = starts + tot
        npad = padded - tot
        for j0 in range(p * JT, tl.max(npad, axis=0), NC * JT):
            j = j0 + tl.arange(0, JT)
            tl.store(sorted_ptr + fill_from[:, None] + j[None, :], tl.full([BLOCK_E, JT], 0, tl.int32) + numel,
                     mask=j[None, :] < npad[:, None])
        # used blocks, from the experts' side: expert e owns padded[e] / block blocks from starts[e] / block
        nblk = padded // block
        for m0 in range(p * MB, tl.max(nblk, axis=0), NC * MB):
            m = m0 + tl.arange(0, MB)
            tl.store(block_expert_ptr + (starts // block)[:, None] + m[None, :],
                     e_ar[:, None] + tl.zeros([BLOCK_E, MB], tl.int32), mask=m[None, :] < nblk[:, None])
        f = tl.arange(0, FILL)
        for off in range(total + p * FILL, rows, NC * FILL):
            tl.store(sorted_ptr + off + f, tl.full([FILL], 0, tl.int32) + numel, mask=off + f < rows)
        for off in range(total // block + p * FILL, nb, NC * FILL):
            tl.store(block_expert_ptr + off + f, tl.full([FILL], -1, tl.int32), mask=off + f < nb)


@triton.jit(do_not_specialize=["NC"])
def _scan_kernel(hist_ptr, NC, BLOCK_E: tl.constexpr, NCP: tl.constexpr, SE: tl.constexpr):
    """Between COUNT and PLACE: for SE experts, the counts of programs [0, NC) in hist rows replaced by their
    exclusive prefix over programs, and row NC set to the totals. PLACE then reads two rows, where each of its programs
    read all NC rows in a loop of [8, E] tiles (16 dependent rounds through L2 at NC = 128)."""
    q = tl.arange(0, NCP)
    e = tl.program_id(0) * SE + tl.arange(0, SE)
    h = tl.load(hist_ptr + q[:, None] * BLOCK_E + e[None, :], mask=(q < NC)[:, None], other=0)
    inclusive = tl.cumsum(h, axis=0)
    tl.store(hist_ptr + q[:, None] * BLOCK_E + e[None, :], inclusive - h, mask=(q < NC)[:, None])
    tl.store(hist_ptr + NC * BLOCK_E + e, tl.sum(h, axis=0))


def align_routes_triton(topk_ids: torch.Tensor, num_experts: int, block: int,
                        fused_max_routes: int = FUSED_MAX_ROUTES, max_programs: int | None = None,
                        scan_min_programs: int = SCAN_MIN_PROGRAMS) -> AlignedRoutes:
    """align_routes (dsv4hal.kernels.moe_align) in one or two Triton launches; identical results.
    max_programs: the COUNT and PLACE launches' programs at most (default MAX_PROGRAMS); scan_min_programs: from how
    many of them the SCAN launch runs (default SCAN_MIN_PROGRAMS)."""
    dev = topk_ids.device
    numel = topk_ids.numel()
    nb = route_blocks(numel, num_experts, block)
    rows = nb * block
    sorted_routes = torch.empty(rows, dtype=torch.int32, device=dev)
    block_expert = torch.empty(nb, dtype=torch.int32, device=dev)
    row_of_route = torch.empty(numel, dtype=torch.int64, device=dev)
    if numel == 0:
        return AlignedRoutes(sorted_routes, block_expert, torch.zeros(1, dtype=torch.int32, device=dev),
                             row_of_route, torch.zeros(num_experts, dtype=torch.int32, device=dev), block)
    expert_end = torch.empty(num_experts, dtype=torch.int32, device=dev)
    num_padded = torch.empty(1, dtype=torch.int32, device=dev)
    flat = topk_ids.reshape(-1)
    block_e = triton.next_power_of_2(max(num_experts, 1))
    nsub = triton.cdiv(numel, C)
    nc = 1 if numel <= fused_max_routes else min(nsub, max_programs or MAX_PROGRAMS)
    per_prog = triton.cdiv(nsub, nc) * C
    nc = triton.cdiv(numel, per_prog)  # no empty programs
    hist = torch.empty((nc + 1) * block_e if nc > 1 else 1, dtype=torch.int32, device=dev)
    args = (flat, sorted_routes, block_expert, num_padded, row_of_route, expert_end, hist, numel, num_experts, block,
            rows, nb, per_prog, nc)
    tile = max(1, 2048 // block_e)  # rows of [tile, BLOCK_E] tiles over programs, blocks and padding
    scanned = nc >= scan_min_programs
    meta = dict(C=C, BLOCK_E=block_e, QB=tile, MB=tile, SCANNED=scanned, JT=tile, FILL=FILL, num_warps=_num_warps())
    if nc == 1:
        _align_kernel[(1,)](*args, COUNT=True, PLACE=True, **meta)
    else:
        _align_kernel[(nc,)](*args, COUNT=True, PLACE=False, **meta)
        if scanned:
            se = min(block_e, max(1, SCAN_ELEMENTS // triton.next_power_of_2(nc)))
            _scan_kernel[(block_e // se,)](hist, nc, BLOCK_E=block_e, NCP=triton.next_power_of_2(nc), SE=se,
                                           num_warps=4)
        _align_kernel[(nc,)](*args, COUNT=False, PLACE=True, **meta)
    return AlignedRoutes(sorted_routes, block_expert, num_padded, row_of_route, expert_end, block)
