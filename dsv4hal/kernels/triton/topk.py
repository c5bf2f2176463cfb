"""Radix-select top-k for the indexer (spec 4.3) in Triton.

Scores map to order-preserving 32-bit keys. Four histogram levels of 8 bits find the exact
k-th largest key T and how many keys equal to T must be taken; a collect pass then writes every index
with key > T and the first `need` with key == T (ties broken by arrival order), applying the page
transform on the way. Rows with n <= k get 0..n-1 in order, as the contract says. Every launch is a
fixed grid over fixed-size buffers, with no host sync, so the op is CUDA-graph safe.

Inputs checked mode refuses never read or write outside the buffers: a length past S selects among the S
scores there are, and a position whose page is past the table gets page slot -1 (as in the reference)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

LEVELS = ((24, 8), (16, 8), (8, 8), (0, 8))  # (shift, bits) from the most significant digit
NBINS = 256  # small histograms: tl.histogram's cost grows with the bin count
CHUNK = 4096  # elements per program: enough programs to fill the GPU even for one row
NBINS_C = tl.constexpr(NBINS)


@triton.jit
def _order_key(x):
    """fp32 -> uint32 whose unsigned order is the float order (NaN aside)."""
    bits = x.to(tl.int32, bitcast=True)
    flip = (bits >> 31) | -2147483648  # all ones for negatives, sign bit only for positives
    return (bits ^ flip).to(tl.uint32, bitcast=True)


@triton.jit
def _store_selected(raw_ptr, page_ptr, pt_ptr, stride_pt, row, out_row, P, pos, idx, ok,
                    PAGE_SHIFT: tl.constexpr, HAS_PT: tl.constexpr):
    """Write index `idx` at out_row + pos where `ok` and, with a page table, its slot (page * 2^PAGE_SHIFT +
    offset); -1 for an index not in the table (negative, or a page past it), as in the reference."""
    tl.store(raw_ptr + out_row + pos, idx, mask=ok)
    if HAS_PT:
        safe = tl.maximum(idx, 0)
        in_table = (idx >= 0) & ((safe >> PAGE_SHIFT) < P)
        pg = tl.load(pt_ptr + row * stride_pt + (safe >> PAGE_SHIFT), mask=ok & in_table, other=0)
        slot = tl.where(in_table, (pg << PAGE_SHIFT) | (idx & ((1 << PAGE_SHIFT) - 1)), -1)
        tl.store(page_ptr + out_row + pos, slot, mask=ok)


@triton.jit
def gate_open(gate_ptr, row, HAS_GATE: tl.constexpr):
    """Whether `row` runs: with a gate (another top-k falling back to this one), only rows flagged non-zero."""
    if HAS_GATE:
        go = tl.load(gate_ptr + row) != 0
    else:
        go = row >= 0
    return go


@triton.jit
def _hist_kernel(scores_ptr, stride_s, len_ptr, state_ptr, hist_ptr, gate_ptr, K, S, CHUNK: tl.constexpr,
                 BLOCK: tl.constexpr, SHIFT: tl.constexpr, BITS: tl.constexpr, PREFIX_SHIFT: tl.constexpr,
                 FIRST: tl.constexpr, HAS_GATE: tl.constexpr):
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    n = tl.minimum(tl.load(len_ptr + row), S)  # a length past S (refused in checked mode) reads no further
    if (n > K) & gate_open(gate_ptr, row, HAS_GATE):
        prefix = tl.load(state_ptr + row * 4).to(tl.uint32, bitcast=True)
        offs = tl.arange(0, BLOCK)
        acc = tl.zeros([NBINS_C], dtype=tl.int32)
        for start in range(chunk * CHUNK, (chunk + 1) * CHUNK, BLOCK):
            j = start + offs
            m = j < n
            key = _order_key(tl.load(scores_ptr + row.to(tl.int64) * stride_s + j, mask=m, other=0.0))
            if not FIRST:
                m = m & ((key >> PREFIX_SHIFT) == (prefix >> PREFIX_SHIFT))
            digit = ((key >> SHIFT) & ((1 << BITS) - 1)).to(tl.int32)
            acc += tl.histogram(digit, NBINS_C, mask=m)
        bins = tl.arange(0, NBINS_C)
        tl.atomic_add(hist_ptr + row * NBINS_C + bins, acc, mask=acc != 0, sem="relaxed")



@triton.jit
def _resolve_kernel(len_ptr, state_ptr, hist_ptr, gate_ptr, K, S, SHIFT: tl.constexpr, BITS: tl.constexpr,
                    FIRST: tl.constexpr, HAS_GATE: tl.constexpr):
    """Pick the digit holding the need-th largest remaining key; record prefix and remaining need."""
    row = tl.program_id(0)
    n = tl.minimum(tl.load(len_ptr + row), S)
    bins = tl.arange(0, NBINS_C)
    h = tl.load(hist_ptr + row * NBINS_C + bins)
    tl.store(hist_ptr + row * NBINS_C + bins, tl.zeros([NBINS_C], dtype=tl.int32))  # ready for the next level
    if (n > K) & gate_open(gate_ptr, row, HAS_GATE):
        if FIRST:
            need = K
            prefix = 0
        else:
            need = tl.load(state_ptr + row * 4 + 1)
            prefix = tl.load(state_ptr + row * 4)
        incl = tl.cumsum(h, axis=0, reverse=True)  # keys with digit >= d
        d_star = tl.sum((incl >= need).to(tl.int32), axis=0) - 1
        above = tl.sum(tl.where(bins == d_star, incl - h, 0), axis=0)
        tl.store(state_ptr + row * 4, prefix | (d_star << SHIFT))
        tl.store(state_ptr + row * 4 + 1, need - above)


@triton.jit
def _collect_kernel(scores_ptr, stride_s, len_ptr, state_ptr, raw_ptr, page_ptr, pt_ptr, stride_pt, gate_ptr, K, S,
                    P, CHUNK: tl.constexpr, BLOCK: tl.constexpr, PAGE_SHIFT: tl.constexpr, HAS_PT: tl.constexpr,
                    HAS_GATE: tl.constexpr):
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    n_given = tl.load(len_ptr + row)
    n = tl.minimum(n_given, S)
    offs = tl.arange(0, BLOCK)
    out_row = row.to(tl.int64) * K
    go = gate_open(gate_ptr, row, HAS_GATE)
    if go & (n <= K):  # indices 0..n-1 in order, then -1 (scores ignored)
        n = tl.minimum(n_given, K)  # the contract's n <= k rule needs no score, so a length past S stays
        for start in range(chunk * CHUNK, (chunk + 1) * CHUNK, BLOCK):
            p = start + offs
            m = p < K
            raw = tl.where(p < n, p, -1)
            _store_selected(raw_ptr, page_ptr, pt_ptr, stride_pt, row, out_row, P, p, raw, m, PAGE_SHIFT, HAS_PT)
    elif go:
        thr = tl.load(state_ptr + row * 4).to(tl.uint32, bitcast=True)
        need = tl.load(state_ptr + row * 4 + 1)
        for start in range(chunk * CHUNK, (chunk + 1) * CHUNK, BLOCK):
            j = start + offs
            m = j < n
            key = _order_key(tl.load(scores_ptr + row.to(tl.int64) * stride_s + j, mask=m, other=0.0))
            gt = m & (key > thr)
            eq = m & (key == thr)
            # positions: keys above the threshold fill [0, K - need), equal keys fill [K - need, K)
            pos_gt = tl.atomic_add(state_ptr + row * 4 + 2 + tl.zeros_like(j), 1, mask=gt, sem="relaxed")
            pos_eq = tl.atomic_add(state_ptr + row * 4 + 3 + tl.zeros_like(j), 1, mask=eq, sem="relaxed")
            take_eq = eq & (pos_eq < need)
            pos = tl.where(gt, pos_gt, K - need + pos_eq)
            ok = gt | take_eq
            _store_selected(raw_ptr, page_ptr, pt_ptr, stride_pt, row, out_row, P, pos, j, ok, PAGE_SHIFT, HAS_PT)


# Launch configuration; see bench/tune_triton.py
CONFIG = {"chunk": CHUNK, "block": 1024, "num_warps": 4}


def topk_outputs(b: int, k: int, with_pages: bool, device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The op's outputs, fixed size for (b, k): raw indices and, with a page table, page-transformed slots."""
    raw = torch.empty(b, k, dtype=torch.int32, device=device)
    return raw, torch.empty(b, k, dtype=torch.int32, device=device) if with_pages else None


def indexer_topk(scores: torch.Tensor, lengths: torch.Tensor, k: int, page_table: torch.Tensor | None = None,
                 page_size: int = 64, config: dict | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    raw, pages = topk_outputs(scores.shape[0], k, page_table is not None, scores.device)
    if scores.shape[0]:
        launch(scores, lengths, k, raw, pages, page_table, page_size, config)
    return raw, pages


def launch(scores: torch.Tensor, lengths: torch.Tensor, k: int, raw: torch.Tensor, pages: torch.Tensor | None,
           page_table: torch.Tensor | None, page_size: int, config: dict | None = None,
           gate: torch.Tensor | None = None) -> None:
    """Write the top-k of every row (with a gate, int32 [B]: of the rows flagged non-zero only) into raw/pages."""
    b, s = scores.shape
    dev = scores.device
    state = torch.zeros(b, 4, dtype=torch.int32, device=dev)  # prefix, need, count above, count equal
    hist = torch.zeros(b, NBINS, dtype=torch.int32, device=dev)
    cfg = {**CONFIG, **(config or {})}
    block, chunk, warps = cfg["block"], cfg["chunk"], cfg["num_warps"]
    nchunks = triton.cdiv(max(s, k), chunk)
    g = gate if gate is not None else state
    done = 32
    for i, (shift, bits) in enumerate(LEVELS):
        _hist_kernel[(b, max(1, triton.cdiv(s, chunk)))](
            scores, scores.stride(0), lengths, state, hist, g, k, s, CHUNK=chunk, BLOCK=block, SHIFT=shift,
            BITS=bits, PREFIX_SHIFT=done, FIRST=i == 0, HAS_GATE=gate is not None, num_warps=warps)
        _resolve_kernel[(b,)](lengths, state, hist, g, k, s, SHIFT=shift, BITS=bits, FIRST=i == 0,
                              HAS_GATE=gate is not None, num_warps=4)
        done = shift
    pt = page_table if page_table is not None else raw
    _collect_kernel[(b, nchunks)](scores, scores.stride(0), lengths, state, raw, pages if pages is not None else raw,
                                  pt, pt.stride(0), g, k, s, pt.shape[1], CHUNK=chunk, BLOCK=block,
                                  PAGE_SHIFT=page_size.bit_length() - 1, HAS_PT=page_table is not None,
                                  HAS_GATE=gate is not None, num_warps=warps)
