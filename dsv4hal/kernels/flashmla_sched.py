"""FlashMLA's sparse-decode scheduler plan on SM90, made by one Triton program in parallel: the same bytes as the plan
sgl-flash-mla 1.0.0 makes itself (`legacy::smxx::decode::get_mla_metadata_kernel`, one warp whose lane 0 walks the
partitions one by one: 27 us a plan on the H200, three plans a V4 decode step), handed to its decode op.

The plan, as the vendor's kernel makes it (facts read from the sgl-flash-mla 1.0.0 wheel and checked on the H200):
- per request r, its key count s_r = topk_length[r] (or topk), 0 counted as 1; with extra keys (extra_topk > 0) s_r is
  rounded up to a multiple of 64 and extra_topk_length[r] (or extra_topk) added. nb_r = (max(s_r - 1, 0)) // 64 + 1
  blocks of 64 keys, and a request costs nb_r + OVERHEAD units (OVERHEAD = 5 on SM90);
- P = max(SMs // s_q // (h_q // 64), 1) partitions, each given W = ceil(total / P) + OVERHEAD units; in order, a
  partition finishes whole requests while its units last (a request it starts mid-way costs its overhead again),
  then takes what is left minus the overhead from the next request (a split), or stops when that is nothing;
- each partition's row: begin request, end request (inclusive), begin block, end block (exclusive), the number of
  splits of its begin request before it, whether its first and last requests are split (one flag for both when they
  are the same request), and a pad int the vendor leaves unwritten (written 0 here); num_splits [b + 1] the exclusive
  prefix sum of the partitions touching each request.

Why it parallelises: put request r on a line of units starting at C_r = sum_{i<r}(nb_i + OVERHEAD), and a partition's
start at v = C_r + (its begin block). From v a partition ends at e = v + W, and the next one starts at
h(v) = max(C_j, e - OVERHEAD) for the request j holding e (e - OVERHEAD when e lies past j's overhead: a split;
C_j when it lies within it: the units left are not enough for a block), or at the line's end once e reaches it. So
the partition starts are the orbit of 0 under h: h as a table over the line, composed with itself log2(P) times
(pointer doubling, in registers with tl.gather), gives all of them at once; every field follows from two consecutive
starts. `serial_plan` below is the vendor's walk, written out, which tests compare the kernel with.

Used by dsv4hal.kernels.flashmla_glue on SM90, inside a declared decode step and for a call captured into a CUDA
graph, when the line fits one program (planned_here: LINE_MAX units, MAX_PARTS partitions); otherwise the decode op
makes its plan itself."""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

BLOCK_N = 64  # keys a block
OVERHEAD_SM90 = 5  # fixed_overhead_num_blocks of the SM90 decode kernel
META_INTS = 8  # DecodingSchedMeta: 7 ints and a pad
# The longest line the program plans; a longer one is left to the op's own planner. The program's table grows with the
# line (a request's key blocks and overhead, times the requests): on the H100 its plan and the decode took 59.8 us
# against the op's own 78.5 us at 960 units (64 requests, C4) and 88.0 against 96.4 us at 1472, but 463.8 against
# 287.1 us at 8640 units (64 requests, C128 at 1M) and 928.4 against 460.9 us at 15360 (1024 requests, C4)
# (h100/bench-attention.json of commit 71a98cb, "parallel plan a call", run while the program took lines up to 16384
# units; on the H200 69.8 against 75.9 us at 1920 units, h200/check-flashmla-sched.json).
LINE_MAX = 1 << 11
MAX_PARTS = 511


def _keys(length: int, extra_width: int, extra_length: int) -> int:
    s = 1 if length == 0 else length
    if extra_width:
        s = (s + BLOCK_N - 1) // BLOCK_N * BLOCK_N + extra_length
    return s


def _blocks(s: int) -> int:
    return max(s - 1, 0) // BLOCK_N + 1


def serial_plan(lengths: list[int], width: int, extra_lengths: list[int] | None, extra_width: int, parts: int,
                overhead: int = OVERHEAD_SM90) -> tuple[list[list[int]], list[int]]:
    """The vendor's walk, partition by partition: (rows [parts][7], num_splits [b + 1]). lengths: per request, or
    the width for each when the engine passes none (the caller expands them)."""
    b = len(lengths)
    seq = [_keys(lengths[r], extra_width, (extra_lengths[r] if extra_lengths is not None else extra_width))
           for r in range(b)]
    nb = [_blocks(s) for s in seq]
    total = sum(n + overhead for n in nb)
    payload = (total + parts - 1) // parts + overhead
    req = blk = nsplit = cum = 0
    splits = [0] * (b + 1)
    rows = []
    for _ in range(parts):
        begin_req, begin_blk, begin_split = req, blk, nsplit
        first = blk != 0
        rem = payload
        while req < b:
            remain = nb[req] - blk
            if rem >= remain + overhead:
                cum += nsplit + 1
                splits[req + 1] = cum
                rem -= remain + overhead
                req, blk, nsplit = req + 1, 0, 0
            else:
                if rem - overhead > 0:
                    blk += rem - overhead
                    nsplit += 1
                break
        end_req = req if blk > 0 else req - 1
        end_blk = blk if blk > 0 else (0 if seq[req - 1] == 0 else nb[req - 1])
        last = end_blk != nb[end_req] and seq[end_req] != 0
        if begin_req == end_req:
            first = last = first or last
        rows.append([begin_req, end_req, begin_blk, end_blk, begin_split, int(first), int(last)])
    assert req == b and blk == 0, "every request is assigned"
    return rows, splits


# the request count, widths and partitions vary with the batch: one compile a power-of-two bucket, not a value
@triton.jit(do_not_specialize=["b", "width", "extra_width", "parts"])
def _plan_kernel(len_ptr, xlen_ptr, len_out_ptr, xlen_out_ptr, meta_ptr, splits_ptr, b, width, extra_width, parts,
                 HAS_LEN: tl.constexpr, HAS_XLEN: tl.constexpr, OVH: tl.constexpr, B_BLOCK: tl.constexpr,
                 N_BLOCK: tl.constexpr, P_BLOCK: tl.constexpr, LOG_P: tl.constexpr):
    r = tl.arange(0, B_BLOCK)
    rm = r < b
    if HAS_LEN:
        # the lengths the plan and the decode both read: within [0, width], whatever the engine's buffer held
        s = tl.minimum(tl.maximum(tl.load(len_ptr + r, mask=rm, other=0), 0), width)
        tl.store(len_out_ptr + r, s, mask=rm)
    else:
        s = tl.zeros([B_BLOCK], tl.int32) + width
    s = tl.where(s == 0, 1, s)
    if extra_width != 0:
        if HAS_XLEN:
            xs = tl.minimum(tl.maximum(tl.load(xlen_ptr + r, mask=rm, other=0), 0), extra_width)
            tl.store(xlen_out_ptr + r, xs, mask=rm)
        else:
            xs = tl.zeros([B_BLOCK], tl.int32) + extra_width
        s = (s + 63) // 64 * 64 + xs
    nb = tl.maximum(s - 1, 0) // 64 + 1
    cost = tl.where(rm, nb + OVH, 0)
    total = tl.sum(cost, axis=0)
    w = (total + parts - 1) // parts + OVH
    start = tl.cumsum(cost, axis=0) - cost  # C_r: where request r begins on the line
    # which request holds each unit of the line: one mark where each request (but the first) begins, summed
    x = tl.arange(0, N_BLOCK)
    marks = tl.histogram(tl.where(rm & (r > 0), tl.minimum(start, N_BLOCK - 1), 0), N_BLOCK)
    holder = tl.cumsum(tl.where(x == 0, 1, marks), axis=0) - 1  # [N_BLOCK] request index
    # h: where the partition starting at unit x leaves the next one to start
    e = x + w
    je = tl.minimum(tl.maximum(tl.gather(holder, tl.minimum(e, N_BLOCK - 1), 0), 0), B_BLOCK - 1)
    h = tl.where(e >= total, total, tl.maximum(tl.gather(start, je, 0), e - OVH))
    h = tl.minimum(h, N_BLOCK - 1)
    # the starts v_0 .. v_{P_BLOCK - 1}: v_{p + 2^k} = h^(2^k)(v_p), h^(2^k) by doubling
    p = tl.arange(0, P_BLOCK)
    v = tl.zeros([P_BLOCK], tl.int32)
    hk = h
    for k in tl.static_range(LOG_P):
        lo = 1 << k
        grow = (p >= lo) & (p < 2 * lo)
        prev = tl.gather(v, tl.maximum(p - lo, 0), 0)
        v = tl.where(grow, tl.gather(hk, prev, 0), v)
        if k + 1 < LOG_P:
            hk = tl.gather(hk, hk, 0)
    # a partition's fields from its start v_p and the next start v_{p+1}
    ve = tl.gather(v, tl.minimum(p + 1, P_BLOCK - 1), 0)
    done_b = v >= total
    ib = tl.where(done_b, b, tl.gather(holder, v, 0))
    blk_b = tl.where(done_b, 0, v - tl.gather(start, tl.minimum(ib, B_BLOCK - 1), 0))
    done_e = ve >= total
    ie = tl.where(done_e, b, tl.gather(holder, ve, 0))
    ie_c = tl.minimum(ie, B_BLOCK - 1)
    blk_e = tl.where(done_e, 0, ve - tl.gather(start, ie_c, 0))
    end_req = tl.where(blk_e > 0, ie, ie - 1)
    er = tl.minimum(tl.maximum(end_req, 0), B_BLOCK - 1)
    nb_end = tl.gather(nb, er, 0)
    s_end = tl.gather(s, er, 0)
    end_blk = tl.where(blk_e > 0, blk_e, tl.where(s_end == 0, 0, nb_end))
    first = blk_b != 0
    last = (end_blk != nb_end) & (s_end != 0)
    same = ib == end_req
    both = first | last
    first = tl.where(same, both, first)
    last = tl.where(same, both, last)
    # splits: the ends v_1 .. v_P on the line, counted up to each unit
    ends = (p >= 1) & (p <= parts)
    on_line = tl.histogram(tl.where(ends, v, N_BLOCK - 1), N_BLOCK)
    upto = tl.cumsum(on_line, axis=0)  # [N_BLOCK]: ends at or before unit x (the top unit also holds the unused)
    nsplit = tl.where(blk_b > 0, p - tl.gather(upto, tl.minimum(tl.gather(start, tl.minimum(ib, B_BLOCK - 1), 0),
                                                                   N_BLOCK - 1), 0), 0)
    row = meta_ptr + p * 8
    pm = p < parts
    tl.store(row + 0, ib, mask=pm)
    tl.store(row + 1, end_req, mask=pm)
    tl.store(row + 2, blk_b, mask=pm)
    tl.store(row + 3, end_blk, mask=pm)
    tl.store(row + 4, nsplit, mask=pm)
    tl.store(row + 5, first.to(tl.int32), mask=pm)
    tl.store(row + 6, last.to(tl.int32), mask=pm)
    tl.store(row + 7, tl.zeros([P_BLOCK], tl.int32), mask=pm)
    # partitions touching request r: one, and one more for each split ending inside it
    lo_u = tl.minimum(start, N_BLOCK - 1)
    hi_u = tl.minimum(start + nb - 1, N_BLOCK - 1)
    touching = 1 + tl.gather(upto, hi_u, 0) - tl.gather(upto, lo_u, 0)
    tl.store(splits_ptr + 1 + r, tl.cumsum(tl.where(rm, touching, 0), axis=0), mask=rm)
    tl.store(splits_ptr + r, tl.zeros([B_BLOCK], tl.int32), mask=r == 0)


@functools.cache
def _sm90(device: torch.device) -> tuple[bool, int]:
    """(the device is SM90, its SM count): asked once per device."""
    props = torch.cuda.get_device_properties(device)
    return (props.major, props.minor) == (9, 0), props.multi_processor_count


def plan_warps(n_block: int) -> int:
    """Warps for a line of n_block units."""
    return 4 if n_block <= 4096 else 8


def line_bound(b: int, width: int, extra_width: int) -> int:
    """The most units the line can hold for requests within their widths (the contract's lengths)."""
    return b * (_blocks(_keys(width, extra_width, extra_width)) + OVERHEAD_SM90)


def line_block(b: int, width: int, extra_width: int) -> int:
    """The table the program holds: the smallest power of two (16 at least) above the line's last unit."""
    return max(triton.next_power_of_2(line_bound(b, width, extra_width) + 1), 16)


def parts_sm90(num_sms: int, s_q: int, h_q: int) -> int:
    return max(num_sms // s_q // (h_q // 64), 1)


Plan = tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]


def plan(q: torch.Tensor, lengths: torch.Tensor | None, width: int, extra_lengths: torch.Tensor | None,
         extra_width: int) -> Plan | None:
    """(tile_scheduler_metadata int32 [P, 8], num_splits int32 [b + 1], lengths, extra_lengths) for FlashMLA's SM90
    sparse decode of q [b, h_q, d] (one query token a request), or None where the decode op should plan itself (not
    SM90, heads other than 64 or 128, a line too long for one program). lengths / extra_lengths int32 [b] (None: the
    widths); the plan returns them clamped into [0, width] / [0, extra_width], the lengths it was made for, which the
    decode must be given with it (FlashMLA's scheduler asserts, and its decode reads past the index rows, on lengths
    outside them)."""
    if q.device.type != "cuda":
        return None
    is_sm90, sms = _sm90(q.device)
    b, s_q, h_q = q.shape[0], 1, q.shape[1]
    if not is_sm90 or h_q not in (64, 128) or b == 0 or width <= 0:
        return None
    parts = parts_sm90(sms, s_q, h_q)
    if not planned_here(b, width, extra_width, parts):
        return None
    return make_plan(b, parts, lengths, width, extra_lengths, extra_width, q.device)


def planned_here(b: int, width: int, extra_width: int, parts: int) -> bool:
    """Whether the parallel program makes the plan of b requests (else the op plans itself): a line of at most
    LINE_MAX units and at most MAX_PARTS partitions."""
    return line_block(b, width, extra_width) <= LINE_MAX and parts <= MAX_PARTS


def make_plan(b: int, parts: int, lengths: torch.Tensor | None, width: int, extra_lengths: torch.Tensor | None,
              extra_width: int, device: torch.device, num_warps: int | None = None
              ) -> Plan:
    """The plan of b >= 1 requests over `parts` partitions (plan's launch; tests call it with any part count;
    num_warps: the launch's, for sweeps)."""
    meta = torch.empty(parts, META_INTS, dtype=torch.int32, device=device)
    splits = torch.empty(b + 1, dtype=torch.int32, device=device)
    lens = torch.empty(b, dtype=torch.int32, device=device) if lengths is not None else None
    xlens = torch.empty(b, dtype=torch.int32, device=device) if extra_lengths is not None and extra_width else None
    p_block = triton.next_power_of_2(parts + 1)
    n_block = line_block(b, width, extra_width)
    _plan_kernel[(1,)](lengths if lengths is not None else splits,
                       extra_lengths if extra_lengths is not None else splits,
                       lens if lens is not None else splits, xlens if xlens is not None else splits, meta, splits, b,
                       width, extra_width, parts, HAS_LEN=lengths is not None, HAS_XLEN=xlens is not None,
                       OVH=OVERHEAD_SM90, B_BLOCK=max(triton.next_power_of_2(b), 16), N_BLOCK=n_block,
                       P_BLOCK=p_block, LOG_P=p_block.bit_length() - 1, num_warps=num_warps or plan_warps(n_block))
    return meta, splits, lens, xlens
