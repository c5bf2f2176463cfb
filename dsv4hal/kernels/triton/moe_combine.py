"""Sum of each token's routed rows, in one pass over y: the final step of the grouped-GEMM MoE paths (Marlin,
DeepGEMM), which would otherwise materialise [T, k, H] in fp32 several times.

Two ways to name a route's row: explicit rows (out[t] = sum_j w[t, j] * y[rows[t, j]] over the j with
0 <= rows[t, j] < limit), or implicit ones read off the routing (route t*k + j is row t*k + j of y, dropped where
topk_ids[t, j] is outside [0, num_experts)), which spares the Marlin path building rows with torch ops. Dropped
routes contribute nothing, whatever their rows hold."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dsv4hal.kernels.triton.moe_activation import _to_bf16

BLOCK_H = 1024


@triton.jit
def _combine_kernel(y_ptr, idx_ptr, w_ptr, out_ptr, limit, H, TOP_K: tl.constexpr, HAS_W: tl.constexpr,
                    IMPLICIT: tl.constexpr, BLOCK: tl.constexpr):
    """idx: rows [T, k] (in [0, limit): kept) or, IMPLICIT, expert ids [T, k] (in [0, limit): kept, row t*k + j)."""
    t = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < H
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        v = tl.load(idx_ptr + t * TOP_K + j).to(tl.int64)
        if IMPLICIT:
            keep = (v >= 0) & (v < limit)
            r = t * TOP_K + j
        else:
            keep = (v >= 0) & (v < limit)
            r = v
        if keep:
            y = tl.load(y_ptr + r * H + cols, mask=mask, other=0.0).to(tl.float32)
            if HAS_W:
                y = y * tl.load(w_ptr + t * TOP_K + j)
            acc += y
    tl.store(out_ptr + t * H + cols, _to_bf16(acc), mask=mask)


def combine_routes(y: torch.Tensor, rows: torch.Tensor | None, weights: torch.Tensor | None,
                   limit: int | None = None, *, topk_ids: torch.Tensor | None = None,
                   num_experts: int | None = None) -> torch.Tensor:
    """y [R, H] (any float dtype, contiguous), weights fp32 [T, k] or None (already applied) -> bf16 [T, H].

    Explicit rows: rows int [T, k] into y, limit (rows < 0 or >= limit: dropped). Implicit rows: rows None, topk_ids
    int [T, k] and num_experts; route t*k + j is row t*k + j of y (R >= T*k), dropped where its id is < 0 or
    >= num_experts. One launch either way."""
    implicit = rows is None
    if implicit:
        if topk_ids is None or num_experts is None:
            raise ValueError("combine_routes: without rows, pass topk_ids and num_experts")
        idx, bound = topk_ids, num_experts
    else:
        if limit is None or topk_ids is not None:
            raise ValueError("combine_routes: explicit rows take a limit, and no topk_ids")
        idx, bound = rows, limit
    t, k = idx.shape
    h = y.shape[1]
    if implicit and y.shape[0] < t * k:
        raise ValueError(f"combine_routes: implicit rows need y with >= T*k = {t * k} rows; got {y.shape[0]}")
    out = torch.empty(t, h, dtype=torch.bfloat16, device=y.device)
    if t == 0:
        return out
    idx = idx.contiguous()
    w = weights.float().contiguous() if weights is not None else idx
    _combine_kernel[(t, triton.cdiv(h, BLOCK_H))](y.contiguous(), idx, w, out, bound, h, TOP_K=k,
                                                   HAS_W=weights is not None, IMPLICIT=implicit, BLOCK=BLOCK_H)
    return out
