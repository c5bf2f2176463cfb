"""Single-launch top-k for the indexer (spec 4.3) when a row fits in registers (S <= 16384) in Triton.

The radix kernel (topk.py) spends ~9 launches on a row of 8192 scores, so under CUDA graphs its time is
launch latency. Here one program owns one row (grid = (B,)): it loads the row once as a register tile of
order-preserving 32-bit keys and never goes back to global memory until it writes its outputs:
  1. select: a bisection over the key bits finds the exact k-th largest key T. Step i tries
     thr | 2^(31-i) and keeps it when at least k keys are >= it: one compare a key (~4 SASS instructions
     on sm_90) and one block reduction. Radix levels of 8-bit tl.histogram cost ~60 instructions a key a
     level (9 ballots, 8 popcounts: Triton's lowering), about twice the ALU work per resolved bit, in fewer
     but heavier barrier rounds. The search stops once exactly k keys are >= the trial value (T's ties
     are then all taken), which for distinct scores comes after ~20 of the 32 steps;
  2. write: keys > T and the first `need` keys == T (lowest index first) get their output slot from one
     prefix sum over the row (both counts packed in one int32: a row has < 2^16 keys), applying the page
     transform on the way.
A row a little past a power of two (8256 scores: 129 pages at 32K context) is held as that power of two and a
short tail tile (launch_config): each bisection step then counts both (two reductions), and the tail's slots
follow the first tile's counts; 1.17-1.45x faster on the H200 than the tile twice as wide.
Output contract as in the radix kernel: keys above T fill [0, k - need) in index order, the ties
[k - need, k); rows with n <= k get 0..n-1 in order, then -1; a length past S selects among the S scores
there are, and a position whose page is past the table gets slot -1. One fixed-grid launch, no scratch
buffers, no host sync: CUDA-graph safe."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dsv4hal.kernels.triton.topk import _order_key, _store_selected, topk_outputs

MAX_ROW = 16384  # widest row one program holds: 32 keys a thread at 16 warps (the op's case size=small)
MIN_BLOCK = 256  # keep every thread of 4+ warps owning at least one key; shorter rows only mask more
# A row at most this much past a power of two is held as two tiles (launch_config). H200, 64 rows of k = 512
# (tune-triton-topk.json "row_tail_tile"): 8256 (tail 64) 25.5 -> 17.6 us, 9216 (1024) 25.9 -> 19.9, 10240 (2048) 26.9
# -> 21.0, each against its best padded tile; "row_tail_half_tile": 12288 (4096) 27.0 -> 23.0 (and the others again:
# 25.9 -> 17.8, 25.5 -> 19.1, 26.5 -> 20.9). Wider tails were not measured.
TAIL_FRACTION = 1 / 2
TAIL_MIN_BLOCK = 8192  # tails were measured on 8192-key tiles only: narrower rows keep one padded tile
MIN_TAIL = 64


@triton.jit
def _kth_key(key, K, floor):
    """The threshold of the K largest of `key` (uint32 order keys; masked positions must hold key 0 and at
    least K positions must be real) by bisection over the key bits. Step i tries thr | 2^(31-i) and keeps it
    when at least K keys are >= it; every trial is >= 1, so a key 0 is never counted (the caller's mask tells
    a real key 0, an all-ones NaN, from a masked one). Stops once exactly K keys are >= the trial value and it
    is above `floor` (a whole row: 0; candidates: the largest key left out of them, so that the search stops
    where it would on the whole row), else ends at the exact K-th largest key."""
    return _bisect(key, key, K, floor, tl.full((), 0, tl.uint32), tl.full((), 0x80000000, tl.uint32), 0, 0)


@triton.jit
def _kth_key_tail(key, tkey, K, floor, TAIL: tl.constexpr):
    """_kth_key of a row held as two tiles: `key` and, past it, the short tile `tkey` of TAIL keys."""
    return _bisect(key, tkey, K, floor, tl.full((), 0, tl.uint32), tl.full((), 0x80000000, tl.uint32), 0, TAIL)


@triton.jit
def _bisect(key, tkey, K, floor, thr, step, last, TAIL: tl.constexpr):
    """From `thr` (at least K keys are >= it: the invariant) and the highest bit still unknown, `step`, down to the
    bit above `last` (0: every bit, the exact threshold). TAIL > 0: the keys of `tkey` count too."""
    while step > last:
        trial = thr | step
        c = tl.sum((key >= trial).to(tl.int32), axis=0)
        if TAIL > 0:
            c += tl.sum((tkey >= trial).to(tl.int32), axis=0)
        thr = tl.where(c >= K, trial, thr)
        # exactly K keys >= trial: thr is final and its ties are all taken (need below = their count)
        step = tl.where((c == K) & (trial > floor), 0, step >> 1)
    return thr


@triton.jit
def _kth_key_in_range(key, m, K, floor, COARSE: tl.constexpr):
    """_kth_key starting at the common high bits of the valid keys (those where `m`): every valid key lies in
    [lo, hi], so bits above the highest bit where lo and hi differ are known and the bisection starts below them
    (two reductions for the leading bits all keys share: most of them when the keys are close, as candidates
    above a threshold are). Same threshold as _kth_key, except that an early stop may come at another trial.
    COARSE > 0 resolves only that many bits below the highest differing one: a threshold with at least K keys
    >= it, not the exact K-th key (enough for an estimate)."""
    lo = tl.min(tl.where(m, key, 0xFFFFFFFF), axis=0).to(tl.uint32)
    hi = tl.max(tl.where(m, key, 0), axis=0).to(tl.uint32)
    d = lo ^ hi  # smeared: every bit at or below the highest differing one set
    d = d | (d >> 1)
    d = d | (d >> 2)
    d = d | (d >> 4)
    d = d | (d >> 8)
    d = d | (d >> 16)
    # from the common prefix (at or below every valid key, so at least K keys are >= it) and the highest differing
    # bit (0 when every valid key is equal: the prefix is then the answer)
    high = d ^ (d >> 1)
    if COARSE > 0:
        last = high >> COARSE
    else:
        last = high * 0
    # lo with the bits of d cleared: `lo & ~d` would need ~ of a uint32, which Triton 3.7's interpreter computes
    # as a Python -1 that overflows
    return _bisect(key, key, K, floor, (lo | d) ^ d, high, last, 0)


@triton.jit
def _classes(key, m, thr):
    """(gt, eq, packed): keys above the K-th key `thr`, the ties among the positions where `m` (a masked position's
    key 0 equals thr when thr stays 0: all-ones NaNs), and both as one int32 to count in one scan (n < 2^16)."""
    gt = key > thr
    eq = m & (key == thr)
    return gt, eq, gt.to(tl.int32) | (eq.to(tl.int32) << 16)


@triton.jit
def _slots(gt, eq, packed, before, above, K: tl.constexpr):
    """(ok, pos) of one tile: `before` the packed counts of the row's tiles before it, `above` the row's count of
    keys above thr. Keys above fill [0, above) in index order, then the lowest-index ties up to K."""
    incl = tl.cumsum(packed, axis=0) + before
    r_gt = (incl & 0xFFFF) - gt.to(tl.int32)  # exclusive ranks: index order within each class
    r_eq = (incl >> 16) - eq.to(tl.int32)
    ok = gt | (eq & (r_eq < K - above))
    pos = tl.where(gt, r_gt, above + r_eq)
    return ok, pos


@triton.jit
def _select_slots(key, m, thr, K: tl.constexpr):
    """(ok, pos): the K selected positions given the K-th key `thr` (keys > thr, then the lowest-index ties
    among the positions where `m`), and each one's output slot: keys above thr fill [0, K - need) in order,
    the ties [K - need, K). One prefix sum over the tile (< 2^16 positions)."""
    gt, eq, packed = _classes(key, m, thr)
    return _slots(gt, eq, packed, 0, tl.sum(packed, axis=0) & 0xFFFF, K)


@triton.jit
def _store_first(raw_ptr, page_ptr, pt_ptr, stride_pt, row, out_row, P, n, K: tl.constexpr,
                 PAGE_SHIFT: tl.constexpr, HAS_PT: tl.constexpr):
    """A row with n <= K: indices 0..n-1 in order, then -1 (no score read)."""
    p = tl.arange(0, K)
    raw = tl.where(p < n, p, -1)
    _store_selected(raw_ptr, page_ptr, pt_ptr, stride_pt, row, out_row, P, p, raw, p < K, PAGE_SHIFT, HAS_PT)


@triton.jit
def _row_topk_kernel(scores_ptr, stride_s, len_ptr, raw_ptr, page_ptr, pt_ptr, stride_pt, S, P,
                     K: tl.constexpr, BLOCK: tl.constexpr, TAIL: tl.constexpr, PAGE_SHIFT: tl.constexpr,
                     HAS_PT: tl.constexpr):
    row = tl.program_id(0)
    n_given = tl.load(len_ptr + row)
    n = tl.minimum(n_given, S)  # a length past S (refused in checked mode) reads no further
    out_row = row.to(tl.int64) * K
    if n <= K:  # needs no score, so a length past S is only capped by K
        _store_first(raw_ptr, page_ptr, pt_ptr, stride_pt, row, out_row, P, tl.minimum(n_given, K), K,
                     PAGE_SHIFT, HAS_PT)
    else:
        src = scores_ptr + row.to(tl.int64) * stride_s
        j = tl.arange(0, BLOCK)
        m = j < n
        x = tl.load(src + j, mask=m, other=0.0)
        key = tl.where(m, _order_key(x), 0)  # positions past n get key 0, the smallest: never counted
        if TAIL > 0:  # the row's keys past BLOCK: a short second tile, counted and ranked after the first
            jt = BLOCK + tl.arange(0, TAIL)
            mt = jt < n
            tkey = tl.where(mt, _order_key(tl.load(src + jt, mask=mt, other=0.0)), 0)
            thr = _kth_key_tail(key, tkey, K, 0, TAIL)
            gt, eq, packed = _classes(key, m, thr)
            gt_t, eq_t, packed_t = _classes(tkey, mt, thr)
            first = tl.sum(packed, axis=0)
            above = (first + tl.sum(packed_t, axis=0)) & 0xFFFF
            ok, pos = _slots(gt, eq, packed, 0, above, K)
            ok_t, pos_t = _slots(gt_t, eq_t, packed_t, first, above, K)
            _store_selected(raw_ptr, page_ptr, pt_ptr, stride_pt, row, out_row, P, pos_t, jt, ok_t, PAGE_SHIFT,
                            HAS_PT)
        else:
            thr = _kth_key(key, K, 0)
            ok, pos = _select_slots(key, m, thr, K)
        _store_selected(raw_ptr, page_ptr, pt_ptr, stride_pt, row, out_row, P, pos, j, ok, PAGE_SHIFT, HAS_PT)


def launch_config(s: int) -> dict[str, int]:
    """BLOCK: the row padded to a power of two; warps: ~32 keys a thread (4 warps at least, 16 at most). A row a
    little past a power of two of at least TAIL_MIN_BLOCK keys (at most TAIL_FRACTION of it more, as the indexer's
    129 pages x 64 = 8256 scores at 32K context) is held as that power of two and a short power-of-two TAIL tile
    instead of a tile twice as wide."""
    block, tail = max(triton.next_power_of_2(max(s, 1)), MIN_BLOCK), 0
    split = split_tiles(s)
    if split is not None and split[0] >= TAIL_MIN_BLOCK and s - split[0] <= split[0] * TAIL_FRACTION:
        block, tail = split
    return {"block": block, "tail": tail, "num_warps": tile_warps(block)}


def split_tiles(s: int) -> tuple[int, int] | None:
    """A row of s keys as two tiles: (the power of two below s, the power-of-two tail holding the rest), or None where
    s is a power of two or the first tile would be below MIN_BLOCK. Whether to split is launch_config's choice."""
    lower = triton.next_power_of_2(max(s, 1)) // 2
    if lower < MIN_BLOCK or s == 2 * lower:
        return None
    return lower, max(triton.next_power_of_2(s - lower), MIN_TAIL)


def tile_warps(block: int) -> int:
    """Warps for a program holding `block` keys as one register tile: ~32 keys a thread, 4 warps at least, 16 at
    most (the row, chunked and sampled top-k kernels)."""
    return min(16, max(4, block // 1024))


def indexer_topk(scores: torch.Tensor, lengths: torch.Tensor, k: int, page_table: torch.Tensor | None = None,
                 page_size: int = 64, config: dict | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    b, s = scores.shape
    if s > MAX_ROW:  # selection never routes such a case here (supports() rejects size=large)
        raise ValueError(f"triton_row_topk holds rows of at most {MAX_ROW} scores in registers; got {s} "
                         "(use triton_radix_topk)")
    raw, pages = topk_outputs(b, k, page_table is not None, scores.device)
    if b == 0:
        return raw, pages
    cfg = {**launch_config(s), **(config or {})}
    tail = cfg.get("tail", 0)
    assert cfg["block"] + tail >= s and cfg["block"] & (cfg["block"] - 1) == 0 and tail & (tail - 1) == 0, \
        "the whole row is a power-of-two tile and a power-of-two tail (or none)"
    pt = page_table if page_table is not None else raw
    _row_topk_kernel[(b,)](scores, scores.stride(0), lengths, raw, pages if pages is not None else raw, pt,
                           pt.stride(0), s, pt.shape[1], K=k, BLOCK=cfg["block"], TAIL=tail,
                           PAGE_SHIFT=page_size.bit_length() - 1, HAS_PT=page_table is not None,
                           num_warps=cfg["num_warps"])
    return raw, pages
