"""Reference sparse attention (spec 3.4): float32 math over dequantized cache rows.

For each query row t and head h over the key set S_t (valid indices within the lengths, SWA and
extra together): s_j = scale * <q, K_j>, lse = logsumexp(s), o = sum softmax(s)_j K_j, then the sink
scales o by 1 / (1 + exp(sink_h - lse)). Empty S_t gives o = 0 and lse = +inf.

Entries that are not valid slots (-1, the invalid negatives and indices past the cache, which checked mode
refuses) are skipped, so unchecked garbage never reads outside the cache; empty inputs (T = 0, width 0, an
empty kv, a cache of 0 pages) give empty or keyless results."""

from __future__ import annotations

import torch

from dsv4hal.formats.v4_cache import HEAD_DIM, V4PagedCache, dequantize_records, read_records


def _gather_keys(cache: V4PagedCache, indices: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Keys [T, W, 512] fp32 and the mask of entries that count."""
    t, w = indices.shape
    pos = torch.arange(w, device=indices.device)
    valid = (indices >= 0) & (indices < cache.num_slots) & (pos[None, :] < lengths[:, None].long())
    if cache.num_slots == 0:  # nothing to read: every entry is skipped
        return torch.zeros(t, w, HEAD_DIM, device=indices.device), valid
    flat = torch.where(valid, indices, torch.full_like(indices, -1)).reshape(-1).long()
    keys = dequantize_records(read_records(cache, flat), cache.fp8).reshape(t, w, HEAD_DIM)
    return keys, valid


def attend(q: torch.Tensor, keys: torch.Tensor, valid: torch.Tensor, sink: torch.Tensor,
           softmax_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Masked softmax attention with sink. q [T,H,D] keys [T,W,D] valid [T,W] -> (out [T,H,D] fp32, lse [T,H])."""
    dt = keys.dtype
    s = torch.einsum("thd,twd->thw", q.to(dt), keys) * softmax_scale
    s = s.masked_fill(~valid[:, None, :], float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    empty = ~valid.any(dim=-1)
    p = torch.exp(s - torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)[..., None])
    p = p.masked_fill(~valid[:, None, :], 0.0)
    out = torch.einsum("thw,twd->thd", p, keys)
    sink_factor = torch.sigmoid(lse - sink.to(dt)[None, :])  # 1 / (1 + exp(sink - lse))
    out = out * sink_factor[..., None]
    out = out.masked_fill(empty[:, None, None], 0.0)
    lse = lse.masked_fill(empty[:, None], float("inf"))
    return out, lse


def sparse_attention_decode(q: torch.Tensor, swa_cache: V4PagedCache, swa_indices: torch.Tensor,
                            swa_lengths: torch.Tensor, sink: torch.Tensor, softmax_scale: float,
                            extra_cache: V4PagedCache | None = None, extra_indices: torch.Tensor | None = None,
                            extra_lengths: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    keys, valid = _gather_keys(swa_cache, swa_indices, swa_lengths)
    if extra_cache is not None:
        xk, xv = _gather_keys(extra_cache, extra_indices, extra_lengths)
        keys, valid = torch.cat([keys, xk], dim=1), torch.cat([valid, xv], dim=1)
    out, lse = attend(q.float(), keys, valid, sink.float(), softmax_scale)
    return out.to(torch.bfloat16), lse.float()


def sparse_attention_prefill(q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor, lengths: torch.Tensor,
                             sink: torch.Tensor, softmax_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    t, w = indices.shape
    pos = torch.arange(w, device=indices.device)
    valid = (indices >= 0) & (indices < kv.shape[0]) & (pos[None, :] < lengths[:, None].long())
    if kv.shape[0] == 0:
        keys = torch.zeros(t, w, HEAD_DIM, device=kv.device)
    else:
        safe = torch.where(valid, indices, torch.zeros_like(indices)).long()
        keys = kv.float()[safe.reshape(-1)].reshape(t, w, HEAD_DIM)
    out, lse = attend(q.float(), keys, valid, sink.float(), softmax_scale)
    return out.to(torch.bfloat16), lse.float()
