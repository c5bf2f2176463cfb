"""Portable Triton moe_route: one program per token over all E experts in registers (E <= 1024).

sqrt(softplus(logit)) scores; the ids are the top_k of score + bias by repeated arg-max (ties to the lower id), or
a row of the hash table; the weights are the unbiased scores at those ids, renormalised and scaled. Fixed-size
outputs and no host sync: CUDA-graph safe. Unchecked hash indices drop routes, as the reference: a table id outside
[0, E) gives id -1 and weight 0; an input id outside [0, vocab) reads no table row and drops all its routes; a token
with no route kept gets weights 0."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

MAX_EXPERTS = 1024
MAX_TOP_K = 16


@triton.jit
def _route_kernel(logits_ptr, stride_l, bias_ptr, table_ptr, stride_t, vocab, tokens_ptr, ids_ptr, w_ptr, E, scale,
                  HAS_BIAS: tl.constexpr, HASH: tl.constexpr, TOP_K: tl.constexpr, BLOCK_E: tl.constexpr,
                  BLOCK_K: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    e = tl.arange(0, BLOCK_E)
    emask = e < E
    x = tl.load(logits_ptr + t * stride_l + e, mask=emask, other=0.0).to(tl.float32)
    # softplus = max(x, 0) + log(1 + exp(-|x|)); below -15, log(1 + exp(x)) = exp(x) to 2e-7 relative
    soft = tl.maximum(x, 0.0) + tl.log(1.0 + tl.exp(-tl.abs(x)))
    soft = tl.where(x < -15.0, tl.exp(x), soft)
    s = tl.sqrt(soft)
    kk = tl.arange(0, BLOCK_K)
    ids = tl.zeros([BLOCK_K], dtype=tl.int32)
    w = tl.zeros([BLOCK_K], dtype=tl.float32)
    if HASH:
        tok = tl.load(tokens_ptr + t).to(tl.int64)
        tok_ok = (tok >= 0) & (tok < vocab)
        # a per-lane mask (the interpreter refuses a scalar bool and-ed into a block mask)
        ids = tl.load(table_ptr + tl.where(tok_ok, tok, 0) * stride_t + kk, mask=kk < tl.where(tok_ok, TOP_K, 0),
                      other=-1)
        ids = tl.where((ids >= 0) & (ids < E), ids, -1)  # weight 0 below: no lane matches -1
        for j in tl.static_range(TOP_K):
            idj = tl.sum(tl.where(kk == j, ids, 0), axis=0)
            w = tl.where(kk == j, tl.sum(tl.where(e == idj, s, 0.0), axis=0), w)
    else:
        b = s
        if HAS_BIAS:
            b = s + tl.load(bias_ptr + e, mask=emask, other=0.0)
        b = tl.where(emask, b, float("-inf"))
        for j in tl.static_range(TOP_K):
            best = tl.max(b, axis=0)
            idj = tl.min(tl.where(b == best, e, BLOCK_E), axis=0)  # lowest id among ties
            ids = tl.where(kk == j, idj, ids)
            w = tl.where(kk == j, tl.sum(tl.where(e == idj, s, 0.0), axis=0), w)
            b = tl.where(e == idj, float("-inf"), b)
    kmask = kk < TOP_K
    w = tl.where(kmask, w, 0.0)
    total = tl.sum(w, axis=0)
    w = w / tl.where(total == 0.0, 1.0, total) * scale  # no route kept: weights 0, not NaN
    tl.store(ids_ptr + t * TOP_K + kk, ids, mask=kmask)
    tl.store(w_ptr + t * TOP_K + kk, w, mask=kmask)


def moe_route(router_logits: torch.Tensor, bias: torch.Tensor | None = None, top_k: int = 6,
              routed_scaling_factor: float = 1.5, hash_table: torch.Tensor | None = None,
              input_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """router_logits fp32 [T, E] -> (topk_ids int32 [T, k], topk_weights fp32 [T, k]) (contract: ops.moe)."""
    t, e = router_logits.shape
    k = hash_table.shape[1] if hash_table is not None else top_k
    if e > MAX_EXPERTS or k > MAX_TOP_K:
        raise ValueError(f"triton_moe_route holds E <= {MAX_EXPERTS} and top_k <= {MAX_TOP_K}; got {e}, {k}")
    dev = router_logits.device
    ids = torch.empty(t, k, dtype=torch.int32, device=dev)
    weights = torch.empty(t, k, dtype=torch.float32, device=dev)
    if t == 0:
        return ids, weights
    logits = router_logits.contiguous()
    hashed = hash_table is not None
    table = hash_table.contiguous() if hashed else ids
    tokens = input_ids.contiguous() if hashed else ids
    bias_t = bias.contiguous() if bias is not None and not hashed else logits
    _route_kernel[(t,)](logits, logits.stride(0), bias_t, table, table.stride(0), table.shape[0], tokens, ids,
                        weights, e, float(routed_scaling_factor), HAS_BIAS=bias is not None and not hashed, HASH=hashed,
                        TOP_K=k, BLOCK_E=triton.next_power_of_2(e), BLOCK_K=triton.next_power_of_2(k))
    return ids, weights
