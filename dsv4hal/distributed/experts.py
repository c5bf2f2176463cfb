"""The expert step between dispatch and combine, as a rank runs it with dsv4hal's own moe_experts op: the weights of
this rank's physical slots, and moe_experts over the dispatched tokens in either layout. An engine with a grouped
GEMM on the batched layout runs its own kernel instead; these are what the conformance cells and the benchmark run."""

from __future__ import annotations

from typing import Any

import torch

from dsv4hal.distributed.contract import Dispatched
from dsv4hal.formats.experts import ExpertWeights

FIELDS = ("w13", "w13_scale", "w2", "w2_scale")


def local_expert_weights(weights: ExpertWeights, logical_of_slots: list[int]) -> ExpertWeights:
    """The logical layer's weights gathered into this rank's physical slots (an empty slot, -1, gets expert 0's
    weights: no route reaches it)."""
    idx = torch.tensor([max(e, 0) for e in logical_of_slots], dtype=torch.long, device=weights.w13.device)
    return ExpertWeights(weights.format, *(getattr(weights, f).index_select(0, idx) for f in FIELDS), fp8=weights.fp8)


def run_local_experts(platform: Any, d: Dispatched, prepared: Any, swiglu_limit: float = 10.0) -> torch.Tensor:
    """moe_experts on the dispatched tokens: standard layout -> bf16 [M, H], each row the weighted sum of its local
    routes; batched layout -> bf16 [E_local, capacity, H], each expert's unweighted output on its rows (rows past
    counts[e] are zero)."""
    x = d.dequantized()
    moe = platform.ops.moe_experts
    if d.layout == "standard":
        assert d.topk_ids is not None and d.topk_weights is not None
        return moe(x, d.topk_ids, d.topk_weights, prepared, swiglu_limit)
    e_local, cap = x.shape[0], x.shape[1]
    rows = torch.arange(cap, device=x.device)
    ones = torch.ones((cap, 1), dtype=torch.float32, device=x.device)
    outs = []
    for e in range(e_local):
        ids = torch.where(rows < d.counts[e], e, -1).to(torch.int32).unsqueeze(1)
        outs.append(moe(x[e].contiguous(), ids, ones, prepared, swiglu_limit))
    return torch.stack(outs)
