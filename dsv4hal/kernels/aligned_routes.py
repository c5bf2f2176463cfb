"""Routes grouped by expert in fixed-size blocks: the moe_align_block_size contract every grouped MoE kernel
here consumes (Triton fused MoE, Marlin, DeepGEMM's contiguous layout): the result type and its sizes, which
implementations of the alignment (moe_align's torch ops, triton/moe_align's kernel) build.

Sizes depend on shapes alone (T*k routes, E experts, the block size) and nothing reads the routing on the host,
so the result can be built inside a CUDA graph and replayed with new routing."""

from __future__ import annotations

from dataclasses import dataclass

import torch


def route_capacity(num_routes: int, num_experts: int, block: int) -> int:
    """Worst-case padded route count, vLLM's allocation: every route plus up to block - 1 padding rows for each
    expert that can be non-empty (at most min(E, routes) of them)."""
    return num_routes + min(num_experts, num_routes) * (block - 1)


def route_blocks(num_routes: int, num_experts: int, block: int) -> int:
    """Number of blocks covering route_capacity (0 when there are no routes)."""
    return -(-route_capacity(num_routes, num_experts, block) // block)


@dataclass(frozen=True)
class AlignedRoutes:
    """sorted_routes int32 [blocks * block]: route ids t*k + j grouped by expert (ascending inside one), each
    expert's run padded to a multiple of block with the value T*k (no route), and the tail T*k too;
    block_expert int32 [blocks]: each block's expert, -1 past the last used block;
    num_padded int32 [1]: sum over experts of round_up(count, block);
    row_of_route int64 [T*k]: where each route sits in sorted_routes (blocks * block for dropped routes);
    expert_end int32 [E]: each expert's unaligned end, the row of its first route plus its route count (its run
    starts at round_up(expert_end[e - 1], block), at 0 for e = 0): DeepGEMM's psum grouped_layout."""

    sorted_routes: torch.Tensor
    block_expert: torch.Tensor
    num_padded: torch.Tensor
    row_of_route: torch.Tensor
    expert_end: torch.Tensor
    block: int
