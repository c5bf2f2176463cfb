"""Filter-and-compact top-k for the indexer (spec 4.3, issue 14) in Triton.

Three launches, two streaming reads of the scores instead of the radix kernel's five:
  1. histogram: many programs per row build a 4096-bin histogram of the top 12 bits of the
     order-preserving key (sign, exponent, 3 mantissa bits) with one read of the scores;
  2. compact: every program finds the bin B holding the k-th largest key from that histogram and copies the
     keys in bins >= B (the candidates: k plus the rest of bin B) into a fixed per-row buffer of CAP_MULT * k;
  3. select: one program per row loads its candidates as one register tile, finds the exact k-th key in
     20 bit steps over the low bits (reductions only), then writes keys above it and the first `need` keys
     equal to it, with the page transform.
A row whose candidates overflow the buffer (heavy ties, or a bin wider than CAP_MULT * k) skips step 2 and
step 3 runs its exact search over the full row instead: slower, still exact. Fixed grids, fixed-size
buffers and no host sync, so the op is CUDA-graph safe. Rows with n <= k, lengths past S and pages past the
table behave as in the radix kernel (topk.py) and the reference."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dsv4hal.kernels.triton.topk import _store_selected, topk_outputs

HIGH_BITS = 12  # histogram of the key's top 12 bits: 4096 bins leave ~k/2 extra candidates for Gaussian rows
NBINS = 1 << HIGH_BITS
LOW_BITS = 32 - HIGH_BITS
CAP_MULT = 4  # candidate buffer per row, in units of k


@triton.jit
def _key(x):
    """fp32 -> uint32 ordered like the floats: negatives get every bit flipped, positives only the sign bit."""
    bits = x.to(tl.int32, bitcast=True)
    mask = (bits >> 31) | -2147483648
    return (bits ^ mask).to(tl.uint32, bitcast=True)


@triton.jit
def _kth_bin(hist_ptr, row, K, NB: tl.constexpr):
    """(bin holding the K-th largest key, number of keys in that bin or above) from the row's histogram."""
    bins = tl.arange(0, NB)
    h = tl.load(hist_ptr + row * NB + bins)
    incl = tl.cumsum(h, axis=0, reverse=True)  # keys whose bin is >= b
    b_star = tl.sum((incl >= K).to(tl.int32), axis=0) - 1
    cnt = tl.sum(tl.where(bins == b_star, incl, 0), axis=0)
    return b_star, cnt


@triton.jit
def _hist_kernel(scores_ptr, stride_s, len_ptr, hist_ptr, K, S, CHUNK: tl.constexpr, BLOCK: tl.constexpr,
                 NB: tl.constexpr, LOW: tl.constexpr):
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    n = tl.minimum(tl.load(len_ptr + row), S)  # never read past S (a longer length is refused in checked mode)
    if n > K:
        offs = tl.arange(0, BLOCK)
        acc = tl.zeros([NB], dtype=tl.int32)
        for start in range(chunk * CHUNK, (chunk + 1) * CHUNK, BLOCK):
            j = start + offs
            m = j < n
            key = _key(tl.load(scores_ptr + row.to(tl.int64) * stride_s + j, mask=m, other=0.0))
            acc += tl.histogram((key >> LOW).to(tl.int32), NB, mask=m)
        bins = tl.arange(0, NB)
        tl.atomic_add(hist_ptr + row * NB + bins, acc, mask=acc != 0, sem="relaxed")


@triton.jit
def _compact_kernel(scores_ptr, stride_s, len_ptr, hist_ptr, cnt_ptr, ckey_ptr, cidx_ptr, K, S, CAP,
                    CHUNK: tl.constexpr, BLOCK: tl.constexpr, NB: tl.constexpr, LOW: tl.constexpr):
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    n = tl.minimum(tl.load(len_ptr + row), S)
    if n > K:
        # each program re-derives the threshold bin (16 KB from L2) rather than paying a resolve launch
        b_star, cnt = _kth_bin(hist_ptr, row, K, NB)
        if cnt <= CAP:  # an overflowing row is searched over its full length by the select kernel
            offs = tl.arange(0, BLOCK)
            for start in range(chunk * CHUNK, (chunk + 1) * CHUNK, BLOCK):
                j = start + offs
                m = j < n
                key = _key(tl.load(scores_ptr + row.to(tl.int64) * stride_s + j, mask=m, other=0.0))
                keep = m & ((key >> LOW).to(tl.int32) >= b_star)
                pos = tl.atomic_add(cnt_ptr + row + tl.zeros_like(j), 1, mask=keep, sem="relaxed")
                base = row.to(tl.int64) * CAP
                tl.store(ckey_ptr + base + pos, key.to(tl.int32, bitcast=True), mask=keep)
                tl.store(cidx_ptr + base + pos, j, mask=keep)


@triton.jit
def _emit(raw_ptr, page_ptr, pt_ptr, stride_pt, row, out_row, P, idx, gt, eq, r_gt, r_eq, above, need,
          PAGE_SHIFT: tl.constexpr, HAS_PT: tl.constexpr):
    """Keys above the threshold fill [0, above), the first `need` equal ones [above, K)."""
    ok = gt | (eq & (r_eq < need))
    pos = tl.where(gt, r_gt, above + r_eq)
    _store_selected(raw_ptr, page_ptr, pt_ptr, stride_pt, row, out_row, P, pos, idx, ok, PAGE_SHIFT, HAS_PT)


@triton.jit
def _select_kernel(scores_ptr, stride_s, len_ptr, hist_ptr, ckey_ptr, cidx_ptr, raw_ptr, page_ptr, pt_ptr,
                   stride_pt, K, S, P, CAP: tl.constexpr, BLOCK: tl.constexpr, NB: tl.constexpr,
                   LOW: tl.constexpr, PAGE_SHIFT: tl.constexpr, HAS_PT: tl.constexpr):
    row = tl.program_id(0)
    n_given = tl.load(len_ptr + row)
    n = tl.minimum(n_given, S)
    out_row = row.to(tl.int64) * K
    if n <= K:  # indices 0..n-1 in order, then -1; needs no score, so a length past S is only capped by K
        n = tl.minimum(n_given, K)
        offs = tl.arange(0, BLOCK)
        for start in range(0, K, BLOCK):
            p = start + offs
            m = p < K
            raw = tl.where(p < n, p, -1)
            _store_selected(raw_ptr, page_ptr, pt_ptr, stride_pt, row, out_row, P, p, raw, m, PAGE_SHIFT, HAS_PT)
    else:
        b_star, cnt = _kth_bin(hist_ptr, row, K, NB)
        thr = (b_star << LOW).to(tl.uint32, bitcast=True)  # the K-th key's top bits; the low bits follow
        if cnt <= CAP:
            # the candidates fit in one register tile: one load, then every step is a reduction
            t = tl.arange(0, CAP)
            m = t < cnt
            base = row.to(tl.int64) * CAP
            key = tl.load(ckey_ptr + base + t, mask=m, other=0).to(tl.uint32, bitcast=True)
            idx = tl.load(cidx_ptr + base + t, mask=m, other=0)
            for bit in tl.static_range(LOW - 1, -1, -1):  # highest low bit first: exact K-th largest key
                trial = thr | (1 << bit)
                thr = tl.where(tl.sum((m & (key >= trial)).to(tl.int32), axis=0) >= K, trial, thr)
            gt = m & (key > thr)
            eq = m & (key == thr)
            above = tl.sum(gt.to(tl.int32), axis=0)
            _emit(raw_ptr, page_ptr, pt_ptr, stride_pt, row, out_row, P, idx, gt, eq,
                  tl.cumsum(gt.to(tl.int32), axis=0) - 1, tl.cumsum(eq.to(tl.int32), axis=0) - 1, above, K - above,
                  PAGE_SHIFT, HAS_PT)
        else:
            # overflow (heavy ties or a crowded bin): the same search streamed over the whole row; slow, exact
            offs = tl.arange(0, BLOCK)
            src = scores_ptr + row.to(tl.int64) * stride_s
            for bit in tl.static_range(LOW - 1, -1, -1):
                trial = thr | (1 << bit)
                c = 0
                for start in range(0, n, BLOCK):
                    j = start + offs
                    key = _key(tl.load(src + j, mask=j < n, other=0.0))
                    c += tl.sum(((j < n) & (key >= trial)).to(tl.int32), axis=0)
                thr = tl.where(c >= K, trial, thr)
            above = 0
            for start in range(0, n, BLOCK):
                j = start + offs
                key = _key(tl.load(src + j, mask=j < n, other=0.0))
                above += tl.sum(((j < n) & (key > thr)).to(tl.int32), axis=0)
            n_gt = 0
            n_eq = 0
            for start in range(0, n, BLOCK):
                j = start + offs
                m = j < n
                key = _key(tl.load(src + j, mask=m, other=0.0))
                gt = m & (key > thr)
                eq = m & (key == thr)
                _emit(raw_ptr, page_ptr, pt_ptr, stride_pt, row, out_row, P, j, gt, eq,
                      n_gt + tl.cumsum(gt.to(tl.int32), axis=0) - 1, n_eq + tl.cumsum(eq.to(tl.int32), axis=0) - 1,
                      above, K - above, PAGE_SHIFT, HAS_PT)
                n_gt += tl.sum(gt.to(tl.int32), axis=0)
                n_eq += tl.sum(eq.to(tl.int32), axis=0)


# Launch configuration (untuned: first numbers come from `dsv4hal bench topk` on the GPU)
CONFIG = {"chunk": 8192, "block": 1024, "num_warps": 4, "select_block": 512, "select_warps": 8,
          "cap_mult": CAP_MULT}


def indexer_topk(scores: torch.Tensor, lengths: torch.Tensor, k: int, page_table: torch.Tensor | None = None,
                 page_size: int = 64, config: dict | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    b, s = scores.shape
    dev = scores.device
    raw, pages = topk_outputs(b, k, page_table is not None, dev)
    if b == 0:
        return raw, pages
    cfg = {**CONFIG, **(config or {})}
    block, chunk, warps, cap = cfg["block"], cfg["chunk"], cfg["num_warps"], cfg["cap_mult"] * k
    assert cap & (cap - 1) == 0, "the candidate tile is a power of two"  # k is 512 or 1024: cap_mult 1, 2, 4...
    work = torch.zeros(b * NBINS + b, dtype=torch.int32, device=dev)  # one memset: histograms, then counts
    hist, cnt = work[:b * NBINS], work[b * NBINS:]
    cand_key = torch.empty(b, cap, dtype=torch.int32, device=dev)
    cand_idx = torch.empty(b, cap, dtype=torch.int32, device=dev)
    grid = (b, max(1, triton.cdiv(s, chunk)))
    _hist_kernel[grid](scores, scores.stride(0), lengths, hist, k, s, CHUNK=chunk, BLOCK=block, NB=NBINS,
                       LOW=LOW_BITS, num_warps=warps)
    _compact_kernel[grid](scores, scores.stride(0), lengths, hist, cnt, cand_key, cand_idx, k, s, cap, CHUNK=chunk,
                          BLOCK=block, NB=NBINS, LOW=LOW_BITS, num_warps=warps)
    pt = page_table if page_table is not None else raw
    _select_kernel[(b,)](scores, scores.stride(0), lengths, hist, cand_key, cand_idx, raw,
                         pages if pages is not None else raw, pt, pt.stride(0), k, s, pt.shape[1], CAP=cap,
                         BLOCK=cfg["select_block"], NB=NBINS, LOW=LOW_BITS, PAGE_SHIFT=page_size.bit_length() - 1,
                         HAS_PT=page_table is not None, num_warps=cfg["select_warps"])
    return raw, pages
