"""Sample-threshold top-k for the indexer (spec 4.3) on wide rows, in Triton: one read of the row in the common
case, and an exact fallback in the same launches for the rows where the estimate misses.

  1. grid (B,): a program takes NSAMPLE evenly spaced scores of its row (all of them when the row is shorter) and
     finds a threshold t with about r = ceil(2k * samples / n) + MARGIN samples >= t (the bisection of the row
     kernel), so that about twice k of the row's keys are >= t; t = 0 (every key) when r reaches the samples.
     It zeroes the row's candidate count;
  2. grid (B, cdiv(S, CHUNK)): every key >= t is appended to the row's candidate buffer [B, CAP] (one atomic
     add a block of keys reserves its slots, or from PER_KEY_MIN_ROWS rows one a selected key; keys past CAP are
     counted, not written; from LEAN_MIN_ROWS rows only indices are written, the select pass reads their scores);
  3. grid (B, 1 + cdiv(S, FB_CHUNK)): program (b, 0): when the count c satisfies k <= c <= CAP, t is at or below the
     k-th largest key T (c keys are >= t), so the candidates are every key >= t and hold the k largest with all the ties
     at T: the row kernel's bisection and slot ranks over the candidate tile (half of it when c fits there: half_tile)
     give the exact top-k, written with the page transform. Otherwise (an estimate that missed: heavy ties, an
     adversarial order) the row's other programs (b, 1..) run triton_chunked_topk on it in the same launch: each chunk's
     exact top-k to a candidate buffer, and the last chunk to arrive (an atomic count that pass 1 zeroed,
     acquire-release) merges them (its stage 2). For the rows that need none, those programs read two words and exit:
     the fallback costs no launch (as two launches of its own after this one, gated on the device, it would cost
     ~2.3 us of every call at 1 x 256K on the H200, flagged row or not) and, for a flagged row, about what those
     launches cost (tune-triton-topk.json, "former-fallback-launches-alone"). Rows wider than the chunked
     kernel holds (fallback_chunk None) are flagged instead, and the radix kernel's launches, gated on the flags,
     follow.
Sampling fused into the filter (every filter program computing the threshold itself: one launch less) is slower
at every shape on the H200 (23.5 against 22.2 us at 1 x 256K, 3x slower at 64 rows; tune-triton-topk.json,
"filter_fused_not_kept"), and so is a radix select for pass 3 ("radix_select_not_kept").
Outputs: the contract's set; on the fast path keys above T first, then ties, each in candidate order (which blocks
reserve, or keys take, their slots first varies from run to run, as in the radix kernel's collect pass); on the
chunked fallback keys above T in index order, then the lowest-index ties (triton_row_topk's outputs bit for bit);
rows with n <= k get 0..n-1 in order, then -1; a length past S selects among the S scores there are; a position
whose page is past the table gets slot -1. Fixed grids, buffers sized from the shapes, no host sync: CUDA-graph safe."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dsv4hal.kernels.triton import topk, topk_chunked
from dsv4hal.kernels.triton.topk import _order_key, _store_selected, topk_outputs
from dsv4hal.kernels.triton.topk_chunked import chunk_candidates, merge_candidates
from dsv4hal.kernels.triton.topk_row import _kth_key, _kth_key_in_range, _select_slots, _store_first, tile_warps

# Scores sampled a row: the threshold's rank error is ~sqrt(r) of the ~2k target. At k = 512 over 256K scores,
# 2048 samples (r = 16) leave a row more than CAP candidates with probability 6.6e-4 (the 16th largest sample lies
# past 4096 keys: P(Gamma(16) > 32)), and such a row falls back (~40 us on the H200); 4096 samples (r = 24) make
# it 3e-9. 2048 samples cost ~2.5 us less (H200: 20.3 against 22.8 us at 1 x 256K), so
# they serve calls of up to FEW_ROWS rows (a fallback in < 0.6% of calls) whose expected candidate count,
# 2k + MARGIN * S / 2048, is at most half of CAP; 4096 the rest (at k = 1024 over 256K, 2048 samples expect 3072
# candidates: P(> CAP) ~ 6%, and the H200 measured a fallback there, 71.1 us; bench-topk.json).
NSAMPLE = 4096
NSAMPLE_FEW_ROWS = 2048
FEW_ROWS = 8
CAP = 4096  # candidates the select program holds (one register tile): ~2k expected, at k <= 1024
MARGIN = 8  # samples added to the target rank, so that a short tail still yields >= k candidates
# scores a filter program reads, in one step: 1024 gave the fastest filter pass of 512-4096 on the H200 (at 1 x 256K
# 3.2 against 8.4 us for 4096 in four steps: more programs in flight; tune-triton-topk.json, "launch_shape")
CHUNK = 1024
BLOCK = 1024  # scores a filter step holds (with block slots, one atomic reserves those of its candidates)
# From PER_KEY_MIN_ROWS rows, each key >= t takes its slot with an atomic of its own (no block sum and prefix sum,
# which made the filter pass instruction-bound at ~1 TB/s), on row counts COUNT_STRIDE int32s apart: H200,
# tune-triton-topk.json "filter_per_key", at 4096 samples: 64 x 256K 86.9 -> 56.2 us (filter pass 63.7 -> 32.3), 16 rows
# 38.5 -> 30.4; at 2048 samples 8 rows 26.6 -> 23.6; slower at 1-4 rows (18.2 -> 19.1 at one). A per-key
# filter with the counts adjacent was slower (+7 us at 64 x 256K). With it, a program filters one block of
# 1024 (chunks of 2048 or 4096 a program, or 8 warps, are 1-4 us slower at 64 rows). Also slower: blocks
# of 128-512 keys that skip the atomics and stores when none of their keys is a candidate (one reduction a block):
# slower at every shape (64 x 256K 59.0-63.9 against 56.5 us; "filter_skip_not_kept").
PER_KEY_MIN_ROWS = 8
COUNT_STRIDE = 32  # 128 bytes: one row count a cache line
# From LEAN_MIN_ROWS rows the filter is lean (_filter_chunk): H200, tune-triton-topk.json "filter_lean", per key at 4096
# samples: 64 x 256K 56.5 -> 52.5 us (filter pass 32.4 -> 25.5; the select pass, reading the candidates' scores
# again, 11.6 -> 14.7), 16 rows equal (30.6, 30.8), 8 rows 27.3 -> 28.2, one row (block slots) 17.3 -> 18.1. Between
# 16 and 64 rows nothing was timed: 32 is the midpoint.
LEAN_MIN_ROWS = 32
# The select pass takes a tile of CAP / 2 for rows with at most that many candidates (the common case: ~2k + MARGIN
# samples' worth), the whole tile otherwise (half_tile; H200, tune-triton-topk.json "half_tile", in one run: 64 x 256K
# 47.9 -> 46.5 us, 16 rows 26.1 -> 24.0, 8 rows 22.5 -> 21.2, one row and 64 x 64K at k = 1024 unchanged)


@triton.jit
def _sample_threshold(scores_ptr, stride_s, row, n, K: tl.constexpr, NS: tl.constexpr, MARGIN_: tl.constexpr,
                      RANGE: tl.constexpr, COARSE: tl.constexpr):
    """The row's threshold t (uint32 order key) from NS evenly spaced scores: about 2K keys of the row are >= t;
    0 (every key) when the target rank reaches the samples."""
    thr = tl.full((), 0, tl.uint32)
    if n > K:
        i = tl.arange(0, NS)
        nv = tl.minimum(n, NS)
        m = i < nv
        # distinct, evenly spaced in [0, n): i * n // nv, with nv either NS (a power of two: a shift, where a 64-bit
        # division by nv cost ~3 us of the pass at 64 x 256K on the H200, tune-triton-topk.json "filter_divide") or n
        # (then i)
        pos = tl.where(n >= NS, (i.to(tl.int64) * n) // NS, i.to(tl.int64))
        x = tl.load(scores_ptr + row.to(tl.int64) * stride_s + pos, mask=m, other=0.0)
        key = tl.where(m, _order_key(x), 0)  # unsampled slots get key 0: never counted by the bisection
        r = (2 * K * nv + n - 1) // n + MARGIN_
        if r < nv:
            if RANGE:
                thr = _kth_key_in_range(key, m, r, 0, COARSE)
            else:
                thr = _kth_key(key, r, 0)
    return thr


@triton.jit
def _filter_chunk(scores_ptr, stride_s, row, n, S, base, thr, count_ptr, ckey_ptr, cidx_ptr, CAP_: tl.constexpr,
                  CHUNK_: tl.constexpr, BLOCK_: tl.constexpr, STAGES: tl.constexpr, PER_KEY: tl.constexpr,
                  LEAN: tl.constexpr):
    """Append every key >= thr of scores [base, base + CHUNK_) of the row to its candidates (past CAP_ they are
    counted, not written). A block of keys reserves its slots with one atomic and ranks them with a prefix sum, or
    (PER_KEY) each key >= thr takes its slot with an atomic of its own: no block-wide sum or scan, at ~0.4% of keys
    selected (2k of 256K). LEAN: fewer instructions a key (the pass is bound by them): loads masked by the row
    width S (vectorised when S is a multiple of 4; keys past the length are refused by the compare), the raw bits
    compared as signed ints when thr is a non-negative float's key, and only the index stored (the select pass
    reads the candidates' scores again)."""
    out = row.to(tl.int64) * CAP_
    src = scores_ptr + row.to(tl.int64) * stride_s
    t = thr.to(tl.int32, bitcast=True)
    # STAGES > 1: the next block's scores are loaded while this block's slots are reserved (a chunk of several)
    for start in tl.range(base, base + CHUNK_, BLOCK_, num_stages=STAGES):
        j = start + tl.arange(0, BLOCK_)
        m = j < n
        if LEAN:
            bits = tl.load(src + j, mask=j < S, other=0.0).to(tl.int32, bitcast=True)
            if t < 0:  # thr >= 2^31: keys of floats with the sign bit clear, whose order is their bits' order
                hit = m & (bits >= (t & 2147483647))
            else:
                hit = m & (_order_key(bits.to(tl.float32, bitcast=True)) >= thr)
        else:
            key = _order_key(tl.load(src + j, mask=m, other=0.0))
            hit = m & (key >= thr)
        if PER_KEY:
            slot = tl.atomic_add(count_ptr + tl.zeros_like(j), 1, mask=hit, sem="relaxed")
            ok = hit & (slot < CAP_)
            if not LEAN:
                tl.store(ckey_ptr + out + slot, key.to(tl.int32, bitcast=True), mask=ok)
            tl.store(cidx_ptr + out + slot, j, mask=ok)
        else:
            sel = hit.to(tl.int32)
            cnt = tl.sum(sel, axis=0)
            if cnt > 0:
                first = tl.atomic_add(count_ptr, cnt, sem="relaxed")
                slot = first + tl.cumsum(sel, axis=0) - sel
                ok = (sel != 0) & (slot < CAP_)
                if not LEAN:
                    tl.store(ckey_ptr + out + slot, key.to(tl.int32, bitcast=True), mask=ok)
                tl.store(cidx_ptr + out + slot, j, mask=ok)


@triton.jit
def _sample_kernel(scores_ptr, stride_s, len_ptr, thr_ptr, count_ptr, arrive_ptr, S, K: tl.constexpr,
                   NS: tl.constexpr, MARGIN_: tl.constexpr, RANGE: tl.constexpr, COARSE: tl.constexpr,
                   COUNT_STRIDE: tl.constexpr):
    row = tl.program_id(0)
    n = tl.minimum(tl.load(len_ptr + row), S)  # a length past S (refused in checked mode) reads no further
    tl.store(count_ptr + row * COUNT_STRIDE, 0)
    tl.store(arrive_ptr + row, 0)
    thr = _sample_threshold(scores_ptr, stride_s, row, n, K, NS, MARGIN_, RANGE, COARSE)
    tl.store(thr_ptr + row, thr.to(tl.int32, bitcast=True))


@triton.jit
def _filter_kernel(scores_ptr, stride_s, len_ptr, thr_ptr, count_ptr, ckey_ptr, cidx_ptr, S, K: tl.constexpr,
                   CAP_: tl.constexpr, CHUNK_: tl.constexpr, BLOCK_: tl.constexpr, STAGES: tl.constexpr,
                   PER_KEY: tl.constexpr, COUNT_STRIDE: tl.constexpr, LEAN: tl.constexpr):
    row = tl.program_id(0)
    base = tl.program_id(1) * CHUNK_
    n = tl.minimum(tl.load(len_ptr + row), S)
    if (n > K) & (base < n):
        thr = tl.load(thr_ptr + row).to(tl.uint32, bitcast=True)
        _filter_chunk(scores_ptr, stride_s, row, n, S, base, thr, count_ptr + row * COUNT_STRIDE, ckey_ptr,
                      cidx_ptr, CAP_, CHUNK_, BLOCK_, STAGES, PER_KEY, LEAN)


@triton.jit
def _select_fast(scores_ptr, stride_s, ckey_ptr, cidx_ptr, raw_ptr, page_ptr, pt_ptr, stride_pt, row, out_row, P, cnt,
                 K: tl.constexpr, CAP_: tl.constexpr, TILE: tl.constexpr, PAGE_SHIFT: tl.constexpr,
                 HAS_PT: tl.constexpr, RANGE: tl.constexpr, LEAN: tl.constexpr):
    """The fast path of a row whose cnt (k <= cnt <= TILE) candidates hold its top-k: the k-th key's bisection and the
    slot ranks over a tile of TILE candidates (rows of CAP_ in the buffers), written with the page transform."""
    q = tl.arange(0, TILE)
    m = q < cnt
    cand = row.to(tl.int64) * CAP_ + q
    idx = tl.load(cidx_ptr + cand, mask=m, other=-1)
    if LEAN:  # the filter stored indices only: the candidates' scores again (from L2, mostly)
        x = tl.load(scores_ptr + row.to(tl.int64) * stride_s + idx, mask=m, other=0.0)
        key = tl.where(m, _order_key(x), 0)
    else:
        key = tl.where(m, tl.load(ckey_ptr + cand, mask=m, other=0).to(tl.uint32, bitcast=True), 0)
    # m tells a real key 0 (an all-ones NaN) from an empty slot
    if RANGE:
        thr = _kth_key_in_range(key, m, K, 0, 0)
    else:
        thr = _kth_key(key, K, 0)
    ok, pos = _select_slots(key, m, thr, K)
    _store_selected(raw_ptr, page_ptr, pt_ptr, stride_pt, row, out_row, P, pos, idx, ok, PAGE_SHIFT, HAS_PT)


@triton.jit
def _select_kernel(scores_ptr, stride_s, len_ptr, count_ptr, ckey_ptr, cidx_ptr, fkey_ptr, fidx_ptr, drop_ptr,
                   arrive_ptr, flag_ptr, raw_ptr, page_ptr, pt_ptr, stride_pt, S, P, NCAND, NCHUNKS, K: tl.constexpr,
                   CAP_: tl.constexpr, FB_CHUNK: tl.constexpr, FB_CBLOCK: tl.constexpr, FB_NBLOCK: tl.constexpr,
                   PAGE_SHIFT: tl.constexpr, HAS_PT: tl.constexpr, RANGE: tl.constexpr, IN_LAUNCH: tl.constexpr,
                   HAS_FLAGS: tl.constexpr, COUNT_STRIDE: tl.constexpr, LEAN: tl.constexpr,
                   HALF_TILE: tl.constexpr):
    """Grid (B, 1 + NCHUNKS), or (B, 1) without IN_LAUNCH. Program (row, 0): the fast path (or n <= K), and the
    row's flag. Programs (row, c >= 1), for a row whose estimate missed only: chunk c - 1 of triton_chunked_topk's
    stage 1; the last of the row's chunks to arrive (an arrival count the sample pass zeroed) runs its stage 2."""
    row = tl.program_id(0)
    c = tl.program_id(1)
    n_given = tl.load(len_ptr + row)
    n = tl.minimum(n_given, S)
    out_row = row.to(tl.int64) * K
    if c == 0:
        if n <= K:  # needs no score, so a length past S is only capped by K
            _store_first(raw_ptr, page_ptr, pt_ptr, stride_pt, row, out_row, P, tl.minimum(n_given, K), K,
                         PAGE_SHIFT, HAS_PT)
            if HAS_FLAGS:
                tl.store(flag_ptr + row, 0)
        else:
            cnt = tl.load(count_ptr + row * COUNT_STRIDE)
            fast = (cnt >= K) & (cnt <= CAP_)
            if HAS_FLAGS:
                tl.store(flag_ptr + row, tl.where(fast, 0, 1))
            if fast:
                if HALF_TILE:  # a row with at most half the tile's candidates (most: ~2k + MARGIN samples' worth)
                    if cnt <= CAP_ // 2:
                        _select_fast(scores_ptr, stride_s, ckey_ptr, cidx_ptr, raw_ptr, page_ptr, pt_ptr, stride_pt,
                                     row, out_row, P, cnt, K, CAP_, CAP_ // 2, PAGE_SHIFT, HAS_PT, RANGE, LEAN)
                    else:
                        _select_fast(scores_ptr, stride_s, ckey_ptr, cidx_ptr, raw_ptr, page_ptr, pt_ptr, stride_pt,
                                     row, out_row, P, cnt, K, CAP_, CAP_, PAGE_SHIFT, HAS_PT, RANGE, LEAN)
                else:
                    _select_fast(scores_ptr, stride_s, ckey_ptr, cidx_ptr, raw_ptr, page_ptr, pt_ptr, stride_pt, row,
                                 out_row, P, cnt, K, CAP_, CAP_, PAGE_SHIFT, HAS_PT, RANGE, LEAN)
    elif IN_LAUNCH:
        if n > K:
            cnt = tl.load(count_ptr + row * COUNT_STRIDE)
            if ((cnt < K) | (cnt > CAP_)) & ((c - 1) * FB_CHUNK < n):
                chunk_candidates(scores_ptr, stride_s, row, n, c - 1, fkey_ptr, fidx_ptr, drop_ptr, NCAND, NCHUNKS,
                                 K, FB_CHUNK)
                tl.debug_barrier()  # every thread's candidates are written before the arrival releases them
                done = tl.atomic_add(arrive_ptr + row, 1, sem="acq_rel", scope="gpu")
                if done == tl.cdiv(n, FB_CHUNK) - 1:  # the row's last chunk: the others' candidates are visible
                    merge_candidates(row, n, fkey_ptr, fidx_ptr, drop_ptr, raw_ptr, page_ptr, pt_ptr, stride_pt,
                                     out_row, P, NCAND, NCHUNKS, K, FB_CHUNK, FB_CBLOCK, FB_NBLOCK, PAGE_SHIFT,
                                     HAS_PT)


def fallback_chunk(width: int, k: int) -> int | None:
    """The chunk of the fallback inside the select launch (triton_chunked_topk's for this width: its candidates fit
    one merge tile), or None for rows wider than that kernel holds (they fall back to the radix kernel's launches)."""
    return topk_chunked.launch_config(width, k)["chunk"] if width <= topk_chunked.max_width(k) else None


def default_config(rows: int, width: int, k: int) -> dict:
    """The launch options for `rows` rows of `width` scores at `k`. range on: 1-2.5 us less at every shape timed (the
    searches start below the bits the keys share). The sample and select passes on fewer warps than tile_warps were
    slower at every shape timed (H200, tune-triton-topk.json "select_warps"); the select launch also holds the
    fallback's chunk and merge tiles, so it gets the warps of the larger tile (8 at 256K: the fast path 17.0 us at
    1 x 256K against 18.0 on 4 warps, a forced fallback 48.5 against 80.8, whose merge tile spills on 4;
    tune-triton-topk.json "fallback_in_select")."""
    few = rows <= FEW_ROWS and 2 * k + MARGIN * width // NSAMPLE_FEW_ROWS <= CAP // 2
    ns = NSAMPLE_FEW_ROWS if few else NSAMPLE
    fb = fallback_chunk(width, k)
    per_key = rows >= PER_KEY_MIN_ROWS
    lean = rows >= LEAN_MIN_ROWS
    return {"nsample": ns, "cap": CAP, "margin": MARGIN, "chunk": CHUNK, "block": BLOCK, "range": True, "coarse": 0,
            "passes": 3, "per_key": per_key, "lean": lean, "count_stride": COUNT_STRIDE if per_key else 1,
            "half_tile": True,
            "filter_stages": 1, "filter_warps": 4, "sample_warps": tile_warps(ns),
            "select_warps": tile_warps(max(CAP, fb or 0)), "fallback_chunk": fb}


def indexer_topk(scores: torch.Tensor, lengths: torch.Tensor, k: int, page_table: torch.Tensor | None = None,
                 page_size: int = 64, config: dict | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    b, s = scores.shape
    raw, pages = topk_outputs(b, k, page_table is not None, scores.device)
    if b == 0:
        return raw, pages
    cfg = {**default_config(b, s, k), **(config or {})}
    ns, cap, fb = cfg["nsample"], cfg["cap"], cfg["fallback_chunk"]
    assert cap >= k and all(v & (v - 1) == 0 for v in (ns, cap, cfg["block"], fb or 1)), "power-of-two tiles, cap >= k"
    dev = scores.device
    cidx = torch.empty(b, cap, dtype=torch.int32, device=dev)
    ckey = cidx if cfg["lean"] else torch.empty(b, cap, dtype=torch.int32, device=dev)  # lean: never written
    # "range": bisections from the keys' common high bits; "coarse" (with range): the sample threshold resolved to
    # that many bits below them only (an estimate needs no more); "passes" < 3 stops early (per-pass timing only:
    # the outputs are then incomplete; 3 is the whole op, the fallback included); "flags" (an int32 [B] tensor, tests
    # and tuning): the select pass writes 1 for the rows that fell back, else 0
    grid = (b, max(1, triton.cdiv(s, cfg["chunk"])))
    thr = torch.empty(b, dtype=torch.int32, device=dev)
    # zeroed by the sample pass; "count_stride" int32s apart (the filter's atomics of different rows on different
    # cache lines)
    cs = cfg["count_stride"]
    count = torch.empty(b * cs, dtype=torch.int32, device=dev)
    arrive = torch.empty(b, dtype=torch.int32, device=dev)  # the fallback's chunk arrivals, zeroed there too
    _sample_kernel[(b,)](scores, scores.stride(0), lengths, thr, count, arrive, s, K=k, NS=ns, MARGIN_=cfg["margin"],
                         RANGE=cfg["range"], COARSE=cfg["coarse"], COUNT_STRIDE=cs, num_warps=cfg["sample_warps"])
    if cfg["passes"] >= 2:
        _filter_kernel[grid](
            scores, scores.stride(0), lengths, thr, count, ckey, cidx, s, K=k, CAP_=cap, CHUNK_=cfg["chunk"],
            BLOCK_=cfg["block"], STAGES=cfg["filter_stages"], PER_KEY=cfg["per_key"],
            COUNT_STRIDE=cs, LEAN=cfg["lean"], num_warps=cfg["filter_warps"])
    if cfg["passes"] < 3:
        return raw, pages
    pt = page_table if page_table is not None else raw
    flags = cfg.get("flags")
    if fb is None and flags is None:  # the radix launches below read the flags as their gate
        flags = torch.empty(b, dtype=torch.int32, device=dev)
    # the fallback's candidate buffers (one-element stand-ins when it is the radix kernel's launches)
    fbuf = topk_chunked.Candidates.make(b, s if fb else 1, k if fb else 1, fb or 1, dev)
    _select_kernel[(b, 1 + fbuf.nchunks if fb else 1)](
        scores, scores.stride(0), lengths, count, ckey, cidx, fbuf.key, fbuf.idx, fbuf.drop, arrive,
        flags if flags is not None else raw, raw, pages if pages is not None else raw, pt, pt.stride(0), s,
        pt.shape[1], fbuf.ncand, fbuf.nchunks, K=k, CAP_=cap, FB_CHUNK=fb or 1, FB_CBLOCK=fbuf.cblock,
        FB_NBLOCK=fbuf.nblock, PAGE_SHIFT=page_size.bit_length() - 1,
        HAS_PT=page_table is not None, RANGE=cfg["range"], IN_LAUNCH=fb is not None, HAS_FLAGS=flags is not None,
        COUNT_STRIDE=cs, LEAN=cfg["lean"], HALF_TILE=cfg["half_tile"], num_warps=cfg["select_warps"])
    if fb is None:  # rows wider than the chunked kernel holds: the flagged ones through the radix kernel (a shape)
        topk.launch(scores, lengths, k, raw, pages, page_table, page_size, gate=flags)
    return raw, pages
