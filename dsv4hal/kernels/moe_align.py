"""align_routes: the one place that picks how routes are aligned (dsv4hal.kernels.aligned_routes' contract), the
Triton kernel on a GPU or the torch ops here elsewhere, and the torch ops version itself (the reference the kernel
matches tensor for tensor)."""

from __future__ import annotations

from typing import Literal

import torch

from dsv4hal.kernels.aligned_routes import AlignedRoutes, route_blocks


def align_routes(topk_ids: torch.Tensor, num_experts: int, block: int, *,
                 impl: Literal["auto", "torch", "triton"] = "auto") -> AlignedRoutes:
    """Group the routes of topk_ids [T, k] by expert; ids outside [0, E) are dropped (they contribute 0).

    impl "auto": the Triton kernel on a GPU (one to three launches instead of ~20 small torch kernels, which
    dominate a small-T decode step), the torch ops elsewhere; both give identical tensors."""
    if impl not in ("auto", "torch", "triton"):
        raise ValueError(f"impl must be 'auto', 'torch' or 'triton'; got {impl!r}")
    if impl == "triton" or (impl == "auto" and topk_ids.is_cuda):
        # imported here so that importing this module never imports triton; every GPU path that aligns routes
        # (Marlin, DeepGEMM, Triton fused MoE) already needs triton for its other kernels, so no fallback
        from dsv4hal.kernels.triton.moe_align import align_routes_triton

        return align_routes_triton(topk_ids, num_experts, block)
    return _align_routes_torch(topk_ids, num_experts, block)


def _align_routes_torch(topk_ids: torch.Tensor, num_experts: int, block: int) -> AlignedRoutes:
    """The torch ops version: the reference the Triton kernel must match tensor for tensor."""
    device = topk_ids.device
    numel = topk_ids.numel()
    nb = route_blocks(numel, num_experts, block)
    rows = nb * block
    flat = topk_ids.reshape(-1).to(torch.int64)
    valid = (flat >= 0) & (flat < num_experts)
    key = torch.where(valid, flat, torch.full_like(flat, num_experts))  # dropped routes sort last
    counts = torch.zeros(num_experts + 1, dtype=torch.int64, device=device)
    counts.scatter_add_(0, key, torch.ones_like(key))
    counts = counts[:num_experts]
    padded = (counts + block - 1) // block * block
    ends = torch.cumsum(padded, 0)
    starts = ends - padded
    first = torch.cumsum(counts, 0) - counts  # first sorted position of each expert's routes
    sorted_key, order = torch.sort(key, stable=True)
    e_of = sorted_key.clamp(max=max(num_experts - 1, 0))
    rank = torch.arange(numel, device=device) - first[e_of]
    dest = torch.where(sorted_key < num_experts, starts[e_of] + rank, torch.full_like(rank, rows))  # rows: a dump
    buf = torch.full((rows + 1,), numel, dtype=torch.int32, device=device)
    buf.scatter_(0, dest, order.to(torch.int32))
    row_of_route = torch.empty_like(dest).scatter_(0, order, dest)
    total = ends[-1:] if num_experts > 0 else torch.zeros(1, dtype=torch.int64, device=device)
    block_start = torch.arange(nb, device=device, dtype=torch.int64) * block
    expert_of_block = torch.searchsorted(ends, block_start, right=True)
    block_expert = torch.where(block_start < total, expert_of_block, torch.full_like(expert_of_block, -1))
    return AlignedRoutes(buf[:rows], block_expert.to(torch.int32), total.to(torch.int32), row_of_route,
                         (starts + counts).to(torch.int32), block)
