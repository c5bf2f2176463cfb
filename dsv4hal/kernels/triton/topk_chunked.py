"""Two-stage exact top-k for the indexer (spec 4.3) on rows wider than one program holds (S > 16384), in Triton.

Built on the row kernel's pieces (topk_row.py: the bisection `_kth_key`, the slot ranks `_select_slots`, the
n <= k write `_store_first`), in two launches:
  1. grid (B, nchunks): a program loads CHUNK scores of its row as a register tile of order keys, finds their
     exact top-k among the row's valid positions (< min(lengths[b], S); a chunk with at most k of them takes
     them all) and writes them, in ascending index order, to its slots [chunk * k, chunk * k + k) of a
     candidate buffer [B, nchunks * k]: the order keys and the global indices; unused slots get index -1
     (key 0). It also writes the largest key it left out (0 when none) to drop [B, nchunks]. Chunks past the
     row's length, and rows with n <= k, write nothing;
  2. grid (B,): one program a row runs the row kernel's bisection over the candidates of the chunks holding
     valid positions (nchunks * k <= 16384 of them, one tile), validity from the index (a real score can have
     key 0: the all-ones NaN), then writes the outputs through the candidates' global indices; rows with
     n <= k get 0..n-1 in order, then -1, without reading a candidate.
Exact: every key above the k-th key T is in its chunk's top-k, and a chunk leaves out a key equal to T only
after keeping k keys >= T, and only its highest-index ones; so the candidates hold the k largest, the ties at
T the whole row would take included. Chunks are laid out in order and each in ascending index order, so
candidate order is index order. The bisection keeps or drops each trial value as on the whole row (above T
both count the same keys; at or below it both count >= k) and may stop early only where the whole row's would
(exactly k candidates >= the trial value, which is above every key left out): the outputs equal
triton_row_topk's bit for bit. Keys above the threshold fill [0, k - need) in index order, then the
lowest-index ties; a length past S selects among the S scores there are; a position whose page is past the
table gets slot -1. Fixed grids, buffers sized from the shapes, no host sync: CUDA-graph safe."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from dsv4hal.errors import UnsupportedCaseError
from dsv4hal.kernels.triton.topk import _order_key, _store_selected, gate_open, topk_outputs
from dsv4hal.kernels.triton.topk_row import MAX_ROW, _kth_key, _select_slots, _store_first, tile_warps

MAX_CAND = MAX_ROW  # candidates stage 2 holds in one tile: nchunks * k <= 16384
MAX_CHUNK = MAX_ROW  # scores a stage-1 program holds in registers
MIN_CHUNK = 4096  # smaller chunks mean more programs for few rows, but more candidates


def max_width(k: int) -> int:
    """The widest row the two stages hold: 16384 // k chunks (k candidates each) of 16384 scores."""
    return MAX_CHUNK * (MAX_CAND // k)


@triton.jit
def chunk_candidates(scores_ptr, stride_s, row, n, c, ckey_ptr, cidx_ptr, drop_ptr, NCAND, NCHUNKS, K: tl.constexpr,
                     CHUNK: tl.constexpr):
    """Stage 1 for chunk c of a row of n > K scores with base c * CHUNK < n (also run inside the sampled top-k's
    select launch: topk_sampled)."""
    base = c * CHUNK
    j = tl.arange(0, CHUNK)
    m = base + j < n
    x = tl.load(scores_ptr + row.to(tl.int64) * stride_s + base + j, mask=m, other=0.0)
    key = tl.where(m, _order_key(x), 0)  # positions past n get key 0: never counted by the bisection
    # a chunk with at most K valid positions takes them all (fewer: no trial counts K keys, thr stays 0)
    ok, _ = _select_slots(key, m, _kth_key(key, K, 0), K)
    # the largest key left out (0 when none): where stage 2's bisection may stop, as on the whole row
    tl.store(drop_ptr + row * NCHUNKS + c, tl.max(tl.where(m & ~ok, key, 0), axis=0).to(tl.int32, bitcast=True))
    inc = ok.to(tl.int32)
    slot = tl.cumsum(inc, axis=0) - inc  # ascending index order within the chunk
    out = row.to(tl.int64) * NCAND + c * K
    tl.store(ckey_ptr + out + slot, key.to(tl.int32, bitcast=True), mask=ok)
    tl.store(cidx_ptr + out + slot, base + j, mask=ok)
    p = tl.arange(0, K)
    unused = p >= tl.minimum(tl.minimum(n - base, CHUNK), K)  # past the chunk's valid positions
    tl.store(cidx_ptr + out + p, tl.full([K], -1, tl.int32), mask=unused)
    tl.store(ckey_ptr + out + p, tl.zeros([K], tl.int32), mask=unused)


@triton.jit
def merge_candidates(row, n, ckey_ptr, cidx_ptr, drop_ptr, raw_ptr, page_ptr, pt_ptr, stride_pt, out_row, P, NCAND,
                     NCHUNKS, K: tl.constexpr, CHUNK: tl.constexpr, CBLOCK: tl.constexpr, NBLOCK: tl.constexpr,
                     PAGE_SHIFT: tl.constexpr, HAS_PT: tl.constexpr):
    """Stage 2 for a row of n > K scores: the exact top-k over the candidates of its chunks, written. Loads at L2
    (.cg): inside the sampled top-k's select launch other programs of the same launch wrote them."""
    q = tl.arange(0, CBLOCK)
    nlive = tl.cdiv(n, CHUNK)  # stage 1 wrote the chunks holding valid positions
    live = q < nlive * K
    c = tl.arange(0, NBLOCK)
    drop = tl.load(drop_ptr + row * NCHUNKS + c, mask=c < nlive, other=0, cache_modifier=".cg")
    drop = drop.to(tl.uint32, bitcast=True)
    cand = row.to(tl.int64) * NCAND + q
    idx = tl.load(cidx_ptr + cand, mask=live, other=-1, cache_modifier=".cg")
    m = idx >= 0  # validity from the index: a real score's key may be 0
    key = tl.load(ckey_ptr + cand, mask=live, other=0, cache_modifier=".cg").to(tl.uint32, bitcast=True)
    key = tl.where(m, key, 0)
    # stops where the bisection over the whole row would: exactly K keys >= the trial value among the
    # candidates and none left out of them, so the outputs are triton_row_topk's bit for bit
    thr = _kth_key(key, K, tl.max(drop, axis=0))
    ok, pos = _select_slots(key, m, thr, K)
    _store_selected(raw_ptr, page_ptr, pt_ptr, stride_pt, row, out_row, P, pos, idx, ok, PAGE_SHIFT, HAS_PT)


@triton.jit
def _chunk_topk_kernel(scores_ptr, stride_s, len_ptr, ckey_ptr, cidx_ptr, drop_ptr, gate_ptr, S, NCAND, NCHUNKS,
                       K: tl.constexpr, CHUNK: tl.constexpr, HAS_GATE: tl.constexpr):
    row = tl.program_id(0)
    c = tl.program_id(1)
    n = tl.minimum(tl.load(len_ptr + row), S)  # a length past S (refused in checked mode) reads no further
    # stage 2 reads no candidate of a row with n <= k, nor of a chunk past n
    if (n > K) & (c * CHUNK < n) & gate_open(gate_ptr, row, HAS_GATE):
        chunk_candidates(scores_ptr, stride_s, row, n, c, ckey_ptr, cidx_ptr, drop_ptr, NCAND, NCHUNKS, K, CHUNK)


@triton.jit
def _merge_topk_kernel(len_ptr, ckey_ptr, cidx_ptr, drop_ptr, raw_ptr, page_ptr, pt_ptr, stride_pt, gate_ptr, S, P,
                       NCAND, NCHUNKS, K: tl.constexpr, CHUNK: tl.constexpr, CBLOCK: tl.constexpr,
                       NBLOCK: tl.constexpr, PAGE_SHIFT: tl.constexpr, HAS_PT: tl.constexpr, HAS_GATE: tl.constexpr):
    row = tl.program_id(0)
    n_given = tl.load(len_ptr + row)
    n = tl.minimum(n_given, S)
    out_row = row.to(tl.int64) * K
    go = gate_open(gate_ptr, row, HAS_GATE)
    if go & (n <= K):  # needs no score, so a length past S is only capped by K
        _store_first(raw_ptr, page_ptr, pt_ptr, stride_pt, row, out_row, P, tl.minimum(n_given, K), K,
                     PAGE_SHIFT, HAS_PT)
    elif go:
        merge_candidates(row, n, ckey_ptr, cidx_ptr, drop_ptr, raw_ptr, page_ptr, pt_ptr, stride_pt, out_row, P, NCAND,
                         NCHUNKS, K, CHUNK, CBLOCK, NBLOCK, PAGE_SHIFT, HAS_PT)


def launch_config(s: int, k: int) -> dict[str, int]:
    """chunk: the smallest power of two >= MIN_CHUNK whose candidates (cdiv(s, chunk) * k) fit stage 2."""
    chunk = MIN_CHUNK
    while chunk < MAX_CHUNK and triton.cdiv(s, chunk) * k > MAX_CAND:
        chunk *= 2
    return {"chunk": chunk, "num_warps": tile_warps(chunk)}


def indexer_topk(scores: torch.Tensor, lengths: torch.Tensor, k: int, page_table: torch.Tensor | None = None,
                 page_size: int = 64, config: dict | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    b, s = scores.shape
    if s > max_width(k):
        # the op's case says only size=large, so selection cannot see this limit: a typed refusal here, never a
        # silent switch to another kernel
        raise UnsupportedCaseError(
            f"indexer_topk: triton_chunked_topk holds rows of at most {max_width(k)} scores at k={k} (its "
            f"{MAX_CAND} candidates in one program); got {s}",
            remedy="force triton_radix_topk for rows this wide (DSV4HAL_KERNELS=indexer_topk=triton_radix_topk)")
    raw, pages = topk_outputs(b, k, page_table is not None, scores.device)
    if b:
        launch(scores, lengths, k, raw, pages, page_table, page_size, config)
    return raw, pages


@dataclass(frozen=True)
class Candidates:
    """The two stages' buffers for b rows of s scores in chunks of `chunk` (also the sampled top-k's in-launch
    fallback): per row nchunks * k candidate keys and indices and each chunk's largest key left out; cblock and
    nblock, the merge's tiles over them."""
    key: torch.Tensor
    idx: torch.Tensor
    drop: torch.Tensor
    nchunks: int
    ncand: int
    cblock: int
    nblock: int

    @staticmethod
    def make(b: int, s: int, k: int, chunk: int, device: torch.device) -> Candidates:
        assert chunk & (chunk - 1) == 0 and chunk <= MAX_CHUNK, "a chunk is one power-of-two tile"
        nchunks = triton.cdiv(max(s, 1), chunk)
        ncand = nchunks * k
        assert ncand <= MAX_CAND, f"{nchunks} chunks of {k} candidates exceed {MAX_CAND}: use a larger chunk"
        return Candidates(torch.empty(b, ncand, dtype=torch.int32, device=device),
                          torch.empty(b, ncand, dtype=torch.int32, device=device),
                          torch.empty(b, nchunks, dtype=torch.int32, device=device), nchunks, ncand,
                          triton.next_power_of_2(ncand), triton.next_power_of_2(nchunks))


def launch(scores: torch.Tensor, lengths: torch.Tensor, k: int, raw: torch.Tensor, pages: torch.Tensor | None,
           page_table: torch.Tensor | None, page_size: int, config: dict | None = None,
           gate: torch.Tensor | None = None) -> None:
    """Write the top-k of every row (with a gate, int32 [B]: of the rows flagged non-zero only) into raw/pages;
    rows of at most max_width(k) scores."""
    b, s = scores.shape
    cfg = {**launch_config(s, k), **(config or {})}
    chunk = cfg["chunk"]
    bufs = Candidates.make(b, s, k, chunk, scores.device)
    g = gate if gate is not None else bufs.drop
    _chunk_topk_kernel[(b, bufs.nchunks)](scores, scores.stride(0), lengths, bufs.key, bufs.idx, bufs.drop, g, s,
                                          bufs.ncand, bufs.nchunks, K=k, CHUNK=chunk, HAS_GATE=gate is not None,
                                          num_warps=cfg.get("num_warps", tile_warps(chunk)))
    pt = page_table if page_table is not None else raw
    _merge_topk_kernel[(b,)](lengths, bufs.key, bufs.idx, bufs.drop, raw, pages if pages is not None else raw, pt,
                             pt.stride(0), g, s, pt.shape[1], bufs.ncand, bufs.nchunks, K=k, CHUNK=chunk,
                             CBLOCK=bufs.cblock, NBLOCK=bufs.nblock, PAGE_SHIFT=page_size.bit_length() - 1,
                             HAS_PT=page_table is not None, HAS_GATE=gate is not None,
                             num_warps=cfg.get("merge_warps", tile_warps(bufs.cblock)))
