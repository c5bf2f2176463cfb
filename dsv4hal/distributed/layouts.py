"""The batched activation layout [E_local, capacity, H] from the standard rows and back. Device ops only (no host
sync, fixed shapes): each route's row in its expert's batch is its rank among the earlier routes to that expert.
Routes past the capacity (possible only when a token names one expert twice) land in a discarded row."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def batch_slots(ids: torch.Tensor, e_local: int, capacity: int) -> tuple[torch.Tensor, torch.Tensor]:
    """int32 [M, k] local ids -> (slots int64 [M, k]: the route's row in its expert's batch, -1 none;
    counts int32 [E_local]: routes per expert, capped at capacity)."""
    flat = ids.reshape(-1).long()
    valid = (flat >= 0) & (flat < e_local)
    onehot = F.one_hot(torch.where(valid, flat + 1, 0), e_local + 1)[:, 1:]
    pos = ((onehot.cumsum(0) - 1) * onehot).sum(1)
    slots = torch.where(valid & (pos < capacity), pos, -1)
    counts = onehot.sum(0).clamp(max=capacity).to(torch.int32)
    return slots.view(ids.shape), counts


def _targets(ids: torch.Tensor, slots: torch.Tensor, capacity: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(expert, row) of every route; routes without a slot go to the discarded row `capacity` of expert 0."""
    kept = slots >= 0
    return torch.where(kept, ids.long(), 0), torch.where(kept, slots, capacity)


def to_batched(x: torch.Tensor, ids: torch.Tensor, slots: torch.Tensor, e_local: int, capacity: int) -> torch.Tensor:
    """rows [M, ...] -> [E_local, capacity, ...] (zero where no route lands)."""
    k = ids.shape[1]
    out = torch.zeros((e_local, capacity + 1, *x.shape[1:]), dtype=x.dtype, device=x.device)
    e, p = _targets(ids, slots, capacity)
    rows = torch.arange(x.shape[0], device=x.device).repeat_interleave(k)
    out[e.reshape(-1), p.reshape(-1)] = x[rows]
    return out[:, :capacity]


def from_batched(y: torch.Tensor, ids: torch.Tensor, slots: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Expert outputs [E_local, capacity, H] -> bf16 [M, H]: per row the weighted sum of its routes, in fp32,
    slot by slot."""
    capacity = y.shape[1]
    padded = torch.cat([y, torch.zeros_like(y[:, :1])], dim=1)
    e, p = _targets(ids, slots, capacity)
    acc = torch.zeros((ids.shape[0], y.shape[2]), dtype=torch.float32, device=y.device)
    for j in range(ids.shape[1]):
        w = torch.where(slots[:, j] >= 0, weights[:, j], 0.0).unsqueeze(1)
        acc += w * padded[e[:, j], p[:, j]].float()
    return acc.to(torch.bfloat16)
