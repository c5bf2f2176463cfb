"""Sum of each token's routed rows: out[t] = sum_j w[t, j] * y[rows[t, j]] over the j with rows[t, j] < limit
(dropped routes contribute nothing, whatever their rows hold), in one pass over y: the final step of the
grouped-GEMM MoE paths (Marlin, DeepGEMM), which would otherwise materialise [T, k, H] in fp32 several times."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_H = 1024


@triton.jit
def _combine_kernel(y_ptr, rows_ptr, w_ptr, out_ptr, limit, H, TOP_K: tl.constexpr, HAS_W: tl.constexpr,
                    BLOCK: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < H
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        r = tl.load(rows_ptr + t * TOP_K + j).to(tl.int64)
        if r < limit:
            v = tl.load(y_ptr + r * H + cols, mask=mask, other=0.0).to(tl.float32)
            if HAS_W:
                v = v * tl.load(w_ptr + t * TOP_K + j)
            acc += v
    tl.store(out_ptr + t * H + cols, acc.to(tl.bfloat16), mask=mask)


def combine_routes(y: torch.Tensor, rows: torch.Tensor, weights: torch.Tensor | None, limit: int) -> torch.Tensor:
    """y [R, H] (any float dtype, contiguous), rows int [T, k] into y (>= limit: dropped), weights fp32 [T, k] or
    None (already applied) -> bf16 [T, H]."""
    t, k = rows.shape
    h = y.shape[1]
    out = torch.empty(t, h, dtype=torch.bfloat16, device=y.device)
    if t == 0:
        return out
    rows = rows.contiguous()
    w = weights.float().contiguous() if weights is not None else rows
    _combine_kernel[(t, triton.cdiv(h, BLOCK_H))](y.contiguous(), rows, w, out, limit, h, TOP_K=k,
                                                   HAS_W=weights is not None, BLOCK=BLOCK_H)
    return out
