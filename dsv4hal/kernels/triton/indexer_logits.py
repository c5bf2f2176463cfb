"""Indexer logits over the 132-byte FP8 indexer cache (dsv4hal.ops.indexer_logits) in Triton.

Bandwidth-bound design: a program owns one query token and a run of consecutive 64-entry blocks of its
context. It loads the token's 64 x 128 FP8 queries and 64 head weights once, then for each block reads the
cache page once (8 KiB of values, 256 B of scales) and computes all 64 heads in one [64 x 128] x [128 x 64]
dot, applies scale, ReLU and the head weights, and writes 64 logits. Blocks past the context are only
written (-inf), never read, so block-table entries past ceil(ctx / 64) may hold anything. A used entry outside
[0, num_pages) (unchecked mode) is skipped the same way: its 64 logits are -inf and no page is read.

FP8 operands: e4m3fn caches on NVIDIA use the tensor cores' FP8 dot directly. e4m3fnuz caches, ROCm and the
interpreter decode the bytes with the integer codec (fp8_codec) to fp16, which holds every e4m3/e4m3fnuz
value exactly, and use an fp16 dot (fp32 accumulation both ways). Grid and output sizes depend on shapes only
(no host sync), so the op is CUDA-graph safe."""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from dsv4hal.formats.indexer_cache import INDEX_DIM, PAGE_SIZE, IndexerPagedCache
from dsv4hal.kernels.triton.fp8_codec import _decode_fp8

HEADS = 64
_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
TARGET_PROGRAMS = 2048  # enough programs to fill an H200 (132 SMs) several times over


@triton.jit
def _fp8_operand(raw, NATIVE: tl.constexpr, FNUZ: tl.constexpr):
    """uint8 FP8 bytes -> a dot operand: native e4m3 (tensor-core FP8) or exact fp16 from the integer codec."""
    if NATIVE:
        return raw.to(tl.float8e4nv, bitcast=True)
    return _decode_fp8(raw, FNUZ).to(tl.float16)


@triton.jit
def _indexer_logits_kernel(q_ptr, w_ptr, cache_ptr, ctx_ptr, bt_ptr, out_ptr, stride_ctx, stride_bt, stride_bt1,
                           stride_out, page_bytes, num_pages, num_blocks, blocks_per_prog, H: tl.constexpr,
                           D: tl.constexpr, P: tl.constexpr, NATIVE: tl.constexpr, FNUZ: tl.constexpr):
    t = tl.program_id(0)
    first = tl.program_id(1) * blocks_per_prog
    last = tl.minimum(first + blocks_per_prog, num_blocks)
    # past the table's P*64 entries a length means the same as P*64, and ctx + P - 1 cannot overflow int32
    ctx = tl.minimum(tl.load(ctx_ptr + t * stride_ctx), num_blocks * P)
    used = tl.minimum(tl.maximum((ctx + P - 1) // P, first), last)  # blocks [first, used) hold context
    h = tl.arange(0, H)
    d = tl.arange(0, D)
    j = tl.arange(0, P)
    out_row = out_ptr + t.to(tl.int64) * stride_out
    if used > first:  # the queries are read only by programs with context to score
        q = _fp8_operand(tl.load(q_ptr + t.to(tl.int64) * (H * D) + h[:, None] * D + d[None, :]), NATIVE, FNUZ)
        w = tl.load(w_ptr + t.to(tl.int64) * H + h)
        for b in range(first, used):
            page = tl.load(bt_ptr + t.to(tl.int64) * stride_bt + b * stride_bt1).to(tl.int64)
            present = (page >= 0) & (page < num_pages)  # else the block is skipped: -inf, nothing read
            base = cache_ptr + tl.where(present, page, 0) * page_bytes
            # per-lane masks (the interpreter refuses a scalar bool and-ed into a block mask)
            rows = tl.where(present, P, 0)
            k = _fp8_operand(tl.load(base + j[None, :] * D + d[:, None], mask=j[None, :] < rows, other=0),
                             NATIVE, FNUZ)  # [D, P]: k transposed
            ks = tl.load((base + P * D).to(tl.pointer_type(tl.float32)) + j, mask=j < rows, other=0.0)
            s = tl.dot(q, k)  # [H, P] fp32
            s = tl.maximum(s * ks[None, :], 0.0)
            logit = tl.sum(s * w[:, None], axis=0)
            pos = b * P + j
            tl.store(out_row + pos, tl.where((pos < ctx) & (j < rows), logit, float("-inf")))
    for b in range(used, last):  # past the context: -inf, nothing read
        tl.store(out_row + b * P + j, tl.full([P], float("-inf"), tl.float32))


def _native(cache: IndexerPagedCache) -> bool:
    """Tensor-core FP8 dot: off. Triton 3.6 does not compile the FP8 operand path on the H200 (sm90:
    CompilationError at the operand load), so every cache decodes to fp16 exactly, as on ROCm; switch it on
    only with a GPU run of tests/ops/indexer/test_indexer_logits_kernels.py."""
    return False


def blocks_per_program(num_tokens: int, num_blocks: int) -> int:
    """Blocks a program scores: as many as keep ~TARGET_PROGRAMS programs (q is loaded once per program)."""
    want = max(1, (num_tokens * num_blocks) // TARGET_PROGRAMS)
    return min(max(want, 1), num_blocks, 64)


def indexer_logits(q: torch.Tensor, weights: torch.Tensor, cache: IndexerPagedCache, context_lens: torch.Tensor,
                   block_table: torch.Tensor) -> torch.Tensor:
    """fp32 [T, P*64] per dsv4hal.ops.indexer_logits."""
    t, p = block_table.shape
    out = torch.empty(t, p * PAGE_SIZE, dtype=torch.float32, device=q.device)
    if t == 0 or p == 0:
        return out
    if cache.num_pages == 0:  # no page to read: every context must be empty (the contract), so all -inf
        return out.fill_(float("-inf"))
    bpp = blocks_per_program(t, p)
    q8 = q.contiguous().view(torch.uint8)
    grid = (t, triton.cdiv(p, bpp))
    _indexer_logits_kernel[grid](
        q8, weights.contiguous(), cache.data, context_lens, block_table, out, context_lens.stride(0),
        block_table.stride(0), block_table.stride(1), out.stride(0), cache.data.stride(0), cache.num_pages, p, bpp,
        H=HEADS,
        D=INDEX_DIM, P=PAGE_SIZE, NATIVE=_native(cache), FNUZ=cache.fp8 == "e4m3fnuz", num_warps=4)
    return out


@triton.jit
def _mask_tail_kernel(out_ptr, ctx_ptr, stride_ctx, stride_out, width, BLOCK: tl.constexpr):
    t = tl.program_id(0)
    pos = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ctx = tl.load(ctx_ptr + t * stride_ctx)
    tl.store(out_ptr + t.to(tl.int64) * stride_out + pos, tl.full([BLOCK], float("-inf"), tl.float32),
             mask=(pos >= ctx) & (pos < width))


def mask_tail_(logits: torch.Tensor, context_lens: torch.Tensor) -> torch.Tensor:
    """Write -inf into logits[t, j] for j >= context_lens[t], in place (reads nothing but the lengths).
    For kernels that leave entries past the context unwritten (DeepGEMM's paged MQA logits)."""
    t, width = logits.shape
    if t and width:
        block = 1024
        grid = (t, triton.cdiv(width, block))
        _mask_tail_kernel[grid](logits, context_lens, context_lens.stride(0), logits.stride(0), width, BLOCK=block,
                                num_warps=4)
    return logits
