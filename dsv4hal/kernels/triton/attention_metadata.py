"""Triton build_attention_metadata (spec 3.1): programs per query row (one per block of its C128 indices; the
first also writes the row's other fields) fill the preallocated AttentionMetadata, so a captured decode step
replays it with new positions and tables. Every load is bounded by the page table's width and full_to_swa's
length, so inputs checked mode refuses (positions past the table, negative page ids, an empty full_to_swa) never
read outside them; the entries they give match the reference's."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dsv4hal.ops.attention_metadata import AttentionMetadata


@triton.jit
def _metadata_kernel(pos_ptr, pt_ptr, stride_pt, f2s_ptr, swa_idx_ptr, swa_len_ptr, c4_raw_ptr, c4_len_ptr,
                     c128_idx_ptr, c128_len_ptr, c4_out_ptr, c128_out_ptr, topk, C128_W, P, S,
                     C128_BLOCK: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    blk = tl.program_id(1)
    pos = tl.load(pos_ptr + t).to(tl.int64)
    length = tl.maximum(pos + 1, 0)  # any negative position is an unused row, as -1 (integer division truncates)
    n128 = length // 128
    # this program's block of the row's C128 indices (two a page of the page-table row)
    j = blk * C128_BLOCK + tl.arange(0, C128_BLOCK)
    inside = (j < n128) & (j // 2 < P)
    pg = tl.load(pt_ptr + t * stride_pt + j // 2, mask=inside, other=0).to(tl.int64)
    tl.store(c128_idx_ptr + t * C128_W + j, tl.where(inside, pg * 2 + j % 2, -1).to(tl.int32), mask=j < C128_W)
    if blk == 0:  # the row's other fields, once
        k = tl.arange(0, 128)
        back = pos - k
        bs = tl.maximum(back, 0)
        in_table = (back >= 0) & (bs // 256 < P)
        page = tl.load(pt_ptr + t * stride_pt + bs // 256, mask=in_table, other=-1).to(tl.int64)
        slot = page * 256 + bs % 256
        ok = in_table & (page >= 0) & (slot < S)
        swa = tl.load(f2s_ptr + slot, mask=ok, other=-1)
        tl.store(swa_idx_ptr + t * 128 + k, tl.where(ok, swa, -1).to(tl.int32))
        tl.store(swa_len_ptr + t, tl.minimum(length, 128).to(tl.int32))
        n4 = length // 4
        tl.store(c4_raw_ptr + t, n4.to(tl.int32))
        tl.store(c4_len_ptr + t, tl.minimum(tl.maximum(n4, 1), topk).to(tl.int32))
        tl.store(c128_len_ptr + t, tl.maximum(n128, 1).to(tl.int32))
        p0 = tl.maximum(pos, 0)
        own = (pos >= 0) & (p0 // 256 < P)
        own_page = tl.load(pt_ptr + t * stride_pt + p0 // 256, mask=own, other=-1).to(tl.int64)
        raw = own_page * 256 + p0 % 256
        has_raw = own & (own_page >= 0)
        tl.store(c4_out_ptr + t, tl.where((length % 4 == 0) & has_raw, raw // 4, 0))
        tl.store(c128_out_ptr + t, tl.where((length % 128 == 0) & has_raw, raw // 128, 0))


# C128 indices a program writes: a request's row at 1M context (8192 indices) is 32 programs, not one loop
C128_BLOCK = 256


def build_attention_metadata(positions: torch.Tensor, page_table: torch.Tensor, full_to_swa: torch.Tensor,
                             index_topk: int = 512, out: AttentionMetadata | None = None) -> AttentionMetadata:
    t, pages = page_table.shape
    m = out if out is not None else AttentionMetadata.empty(t, pages, positions.device)
    if t:
        w = m.c128_indices.shape[1]
        grid = (t, max(1, triton.cdiv(w, C128_BLOCK)))  # by shape only: CUDA-graph safe
        _metadata_kernel[grid](positions, page_table, page_table.stride(0), full_to_swa, m.swa_indices,
                               m.swa_lengths, m.c4_lengths_raw, m.c4_lengths, m.c128_indices, m.c128_lengths,
                               m.c4_out_loc, m.c128_out_loc, index_topk, w, pages, full_to_swa.shape[0],
                               C128_BLOCK=C128_BLOCK, num_warps=2)
    return m
