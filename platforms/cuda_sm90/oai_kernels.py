"""The Triton pieces of the triton_kernels MoE binding (oai_triton_moe): DSV4's clamped SwiGLU as matmul_ogs' fused
activation, and the routes from dsv4hal's precomputed top-k in one launch.

The activation: matmul_ogs hands it an fp32 tile whose columns alternate gate, up (the prepared w13 interleaves its
rows) and takes back half the columns: silu(min(gate, limit)) * clamp(up, -limit, limit).

The routes:
triton_kernels builds its expert-sorted routing (`routing_from_bitmatrix`) from a bitmatrix (one bit per (token,
expert)) and the top-k ids and weights. Three of its rules differ from dsv4hal's moe_experts contract, and this
kernel bridges them:
- the number of routes a token has must be a power of two (`_routing_compute_indx` tiles k * 32 lanes): DSV4's
  k = 6 is padded to 8 with dropped routes (id -1, weight 0);
- only id -1 means "no expert" (its 16-bit key 0xffff): every id outside [0, E) (the contract's dropped route, e.g.
  another negative or an expert of another EP rank) becomes -1;
- one bit per (token, expert), so a token routed twice to one expert would get two rows for one bit: the first
  slot keeps the summed weight and the later ones are dropped (the contract sums both contributions, which is the
  same product).
Every output element is written, so the outputs can be torch.empty; the first program also zeroes the bitmatrix's
column sums, which the library would zero in a launch of its own. No host sync, shapes only: CUDA-graph safe."""

from __future__ import annotations

from typing import TYPE_CHECKING

import triton
import triton.language as tl

from dsv4hal.kernels.triton.moe_activation import _swiglu_f32_fast

if TYPE_CHECKING:
    import torch

BLOCK_M = 32  # tokens a program


@triton.jit
def dsv4_clamped_swiglu(x, limit):
    # dsv4hal's one SwiGLU (approximate exp and division, as this activation always had): NaNs propagate through
    # the clamps (plain min/max turned a NaN gate into the limit, a NaN input into a finite output row)
    gate, up = tl.split(tl.reshape(x, (x.shape[0], x.shape[1] // 2, 2)))
    return _swiglu_f32_fast(gate, up, limit, True)


@triton.jit
def _routes_kernel(bits_ptr, sums_ptr, ids_out, w_out, ids_ptr, w_ptr, n_tokens, n_experts, WORDS: tl.constexpr,
                   SUMS: tl.constexpr, K: tl.constexpr, KP: tl.constexpr, BLOCK: tl.constexpr):
    if tl.program_id(0) == 0:  # the bitmatrix's column sums start at zero: the library's memset launch spared
        c = tl.arange(0, SUMS)
        tl.store(sums_ptr + c, tl.zeros([SUMS], tl.int32), mask=c < WORDS * 32)
    rows = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    cols = tl.arange(0, KP)
    live = rows < n_tokens
    m = live[:, None] & (cols < K)[None, :]
    ids = tl.load(ids_ptr + rows[:, None] * K + cols[None, :], mask=m, other=-1)
    w = tl.load(w_ptr + rows[:, None] * K + cols[None, :], mask=m, other=0.0)
    valid = (ids >= 0) & (ids < n_experts)
    ids = tl.where(valid, ids, -1)
    # same[r, i, j]: slots i and j of token r name one expert; slot j repeats an earlier slot when some i < j does
    same = (ids[:, :, None] == ids[:, None, :]) & valid[:, :, None] & valid[:, None, :]
    earlier = (cols[:, None] < cols[None, :])[None, :, :]
    repeat = tl.max((same & earlier).to(tl.int32), axis=1) > 0
    w = tl.sum(tl.where(same, w[:, None, :], 0.0), axis=2)  # slot i: the weights of every slot with its expert
    keep = valid & ~repeat
    ids = tl.where(keep, ids, -1)
    w = tl.where(keep, w, 0.0)
    tl.store(ids_out + rows[:, None] * KP + cols[None, :], ids, mask=live[:, None])
    tl.store(w_out + rows[:, None] * KP + cols[None, :], w, mask=live[:, None])
    expert = tl.where(keep, ids, 0)
    bit = tl.where(keep, tl.full([BLOCK, KP], 1, tl.uint32) << (expert % 32).to(tl.uint32), 0).to(tl.uint32)
    for word in tl.static_range(WORDS):
        v = tl.reduce_or(tl.where(expert // 32 == word, bit, 0).to(tl.uint32), axis=1)
        tl.store(bits_ptr + rows * WORDS + word, v, mask=live)


def padded_routes(topk_ids: torch.Tensor, topk_weights: torch.Tensor, num_experts: int
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(ids int32 [T, k], weights fp32 [T, k]) -> (bitmatrix words uint32 [T, ceil(E/32)], int32 zeros
    [32 ceil(E/32)] when T >= 1 (the bitmatrix's scratchpad for its column sums), ids int32 [T, kp], weights fp32
    [T, kp]) with kp = next power of two of k, under the rules above."""
    import torch

    t, k = topk_ids.shape
    kp = triton.next_power_of_2(k)
    words = triton.cdiv(num_experts, 32)
    dev = topk_ids.device
    bits = torch.empty(t, words, dtype=torch.uint32, device=dev)
    sums = torch.empty(words * 32, dtype=torch.int32, device=dev)
    ids = torch.empty(t, kp, dtype=torch.int32, device=dev)
    w = torch.empty(t, kp, dtype=torch.float32, device=dev)
    if t:
        _routes_kernel[(triton.cdiv(t, BLOCK_M),)](bits, sums, ids, w, topk_ids.contiguous(),
                                                   topk_weights.float().contiguous(), t, num_experts, WORDS=words,
                                                   SUMS=triton.next_power_of_2(words * 32), K=k, KP=kp,
                                                   BLOCK=BLOCK_M)
    return bits, sums, ids, w
