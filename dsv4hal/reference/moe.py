"""Pure-PyTorch reference of the DSV4 MoE ops (spec 5): routing and the routed experts.

Routing (spec 5.2): s = sqrt(softplus(logits)); ids = topk(s + bias) over all experts (no groups) or, on hash
layers, ids = hash_table[input_ids]; the weights use the unbiased s of the chosen experts, normalised to sum 1 and
multiplied by routed_scaling_factor.

Routed experts: y[t] = sum_k w[t,k] * E_{ids[t,k]}(x[t]) with the SwiGLU expert
g = x w1^T, u = x w3^T, g = min(g, limit), u = clamp(u, -limit, limit), out = (silu(g) * u) w2^T.
Weights are dequantized to fp32 exactly as stored; x is taken as fp32; accumulation is fp32; the result is bf16.
An id < 0 contributes nothing (expert parallelism marks experts owned by other ranks that way).

The shared expert is NOT part of moe_experts: the caller adds it (y = routed + shared(x), unscaled). It is a dense
SwiGLU MLP with the same clamp; shared_expert() below is its fp32 reference.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

# The weight types live in formats/ (an engine builds them); re-exported here for existing callers.
from dsv4hal.formats.experts import (  # noqa: F401
    EXPERT_FORMATS,
    ExpertFormat,
    ExpertWeights,
    dequantize_expert,
    dequantize_experts,
    expert_nbytes,
    quantize_experts,
)


def swiglu_mlp(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, swiglu_limit: float) -> torch.Tensor:
    """Clamped SwiGLU MLP in the dtype of its (same-dtype) inputs: x [T, H], w13 [2I, H], w2 [H, I] -> [T, H]."""
    gate, up = (x @ w13.T).chunk(2, dim=-1)
    gate = gate.clamp(max=swiglu_limit)
    up = up.clamp(-swiglu_limit, swiglu_limit)
    return (F.silu(gate) * up) @ w2.T


def shared_expert(
    x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, swiglu_limit: float = 10.0
) -> torch.Tensor:
    """Shared expert reference in fp32: x [T, H], dequantized w13 [2I, H], w2 [H, I] -> fp32 [T, H].
    The caller adds it to moe_experts' output, unscaled."""
    return swiglu_mlp(x.float(), w13.float(), w2.float(), swiglu_limit)


def moe_route(
    router_logits: torch.Tensor,
    bias: torch.Tensor | None = None,
    top_k: int = 6,
    routed_scaling_factor: float = 1.5,
    hash_table: torch.Tensor | None = None,
    input_ids: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """router_logits fp32 [T, E] -> (topk_ids int32 [T, k], topk_weights fp32 [T, k]).

    With hash_table (int32 [vocab, k]) and input_ids [T] the ids come from the table (bias and top_k unused);
    otherwise they are the top_k of s + bias, in descending order. Unchecked hash indices drop routes (as the
    Triton router): a table id outside [0, E) gives id -1 and weight 0, an input id outside [0, vocab) drops all
    of its token's routes; the kept weights are renormalised among themselves, and a token with none kept has
    weights 0."""
    scores = F.softplus(router_logits.float()).sqrt()
    if hash_table is not None:
        if input_ids is None:
            raise ValueError("moe_route: hash routing needs input_ids alongside hash_table")
        ids = _hashed_ids(hash_table, input_ids.long(), scores.shape[1])
    else:
        biased = scores if bias is None else scores + bias.float()
        ids = biased.topk(top_k, dim=-1).indices
    weights = torch.where(ids >= 0, scores.gather(1, ids.clamp(min=0)), 0.0)
    total = weights.sum(dim=-1, keepdim=True)
    weights = weights / torch.where(total == 0, 1.0, total) * routed_scaling_factor  # no route kept: 0, not NaN
    return ids.to(torch.int32), weights


def _hashed_ids(hash_table: torch.Tensor, tokens: torch.Tensor, num_experts: int) -> torch.Tensor:
    """int64 [T, k] table rows of the tokens, -1 for an id outside [0, E) and for every route of a token outside
    [0, vocab) (dropped routes: no read outside the table, no expert outside the router's)."""
    vocab, k = hash_table.shape
    if vocab == 0:
        return torch.full((tokens.shape[0], k), -1, dtype=torch.long, device=tokens.device)
    ids = hash_table[tokens.clamp(0, vocab - 1)].long()
    kept = ((tokens >= 0) & (tokens < vocab))[:, None] & (ids >= 0) & (ids < num_experts)
    return torch.where(kept, ids, -1)


def moe_experts(
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    weights: ExpertWeights,
    swiglu_limit: float = 10.0,
) -> torch.Tensor:
    """x bf16 [T, H], topk_ids int32 [T, k], topk_weights fp32 [T, k] -> bf16 [T, H] (routed experts only).
    Ids >= E (refused in checked mode) contribute nothing, as in the fused kernels, rather than raising."""
    topk_ids = torch.where(topk_ids < weights.num_experts, topk_ids, -1)
    return per_expert_sum(x.float(), topk_ids, topk_weights,
                          lambda e, rows: swiglu_mlp(rows, *dequantize_expert(weights, e), swiglu_limit))


def per_expert_sum(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
                   expert: Callable[[int, torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """bf16 [T, H]: sum over slots of weight * expert(e, the rows of x routed to e), one call per expert hit
    (ids < 0 skipped), accumulated in fp32. Reads the routing on the host: a loop, not a kernel."""
    k = topk_ids.shape[1]
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    flat_ids = topk_ids.reshape(-1).long()
    flat_w = topk_weights.reshape(-1).float()
    # Group the (token, slot) pairs by expert: sort the valid slots by id, then split into runs.
    slots = (flat_ids >= 0).nonzero().squeeze(1)
    slots = slots[torch.argsort(flat_ids[slots], stable=True)]
    experts, counts = torch.unique_consecutive(flat_ids[slots], return_counts=True)
    for e, run in zip(experts.tolist(), torch.split(slots, counts.tolist())):
        tokens = run // k
        out.index_add_(0, tokens, expert(e, x[tokens]).float() * flat_w[run].unsqueeze(1))
    return out.to(torch.bfloat16)
