"""sparse_attention_decode through aiter's `pa_decode_sparse` (gfx950), behind dsv4hal's decode contract.

Entry point (ROCm/aiter @e4048607, aiter/ops/triton/attention/pa_decode_sparse.py; the packed-cache path
arrived in #4382, and reads caches larger than 2 GiB through strided views correctly since #4673):

    pa_decode_sparse(q, unified_kv, kv_indices, kv_indptr, attn_sink, softmax_scale, kv_scales=None,
                     block_h=None, kv_splits=None, has_invalid=True, skip_reduce=False, USE_EXP2=None, *,
                     extra_cache=None, extra_indices=None, extra_indptr=None)

On gfx950, with bf16 q [N, H, D], a 3-D uint8 `unified_kv` [pages, P, 584] and no kv_scales, it runs a
Gluon kernel that reads exactly dsv4hal's V4 page layout: record of slot `pos` at page*stride(0) + pos*576
(448 OCP e4m3 bytes then 64 bf16 rope values), its 7 UE8M0 scales at page*stride(0) + P*576 + pos*8, any
page stride (so V4PagedCache.flashmla_view()[:, :, 0] is passed as is). Indices are CSR lists of slots
(page*P + offset) with -1 skipped; `extra_*` adds the C4/C128 cache as a second loop with its own page
size. The sink is folded into the softmax denominator like dsv4hal's (a scaled-score logit, zero value).

It returns no lse, which dsv4hal's contract does. So this binding asks for the split-K partials instead
(skip_reduce=True with at least 2 splits): acc [N, S, H, D] (unnormalised), m [N, S, H] (row max of the
scaled score in base-2 units, i.e. max(q.k) * softmax_scale * log2(e)) and l [N, S, H] (sum of
2**(score*log2e - m)), and finishes the combine here in PyTorch: lse = ln2 * (M + log2(sum 2**(m_s - M) l_s)),
out = sum 2**(m_s - M) acc_s / (that sum + 2**(sink*log2e - M)). Rows are processed in chunks so that the
fp32 partials stay under SPLIT_BUFFER_BYTES. No host sync; shapes depend only on the arguments' shapes.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import torch

from dsv4hal.formats.v4_cache import V4PagedCache

HEAD_DIM = 512
HEAD_TILE = 16  # the Gluon kernel's BLOCK_M
KEY_TILE = 64  # its BLOCK_K
MAX_SPLITS = 16  # aiter's own split heuristic caps here
MIN_SPLITS = 2  # skip_reduce returns partials only when the split-K path is active
DEFAULT_CUS = 256  # MI355X compute units; used when the device cannot be asked (tests on the CPU)
SPLIT_BUFFER_BYTES = 256 << 20  # fp32 partials per chunk of rows
LOG2E = 1.0 / math.log(2.0)
LN2 = math.log(2.0)


@functools.cache
def _entry() -> Callable[..., Any]:
    from aiter.ops.triton.attention.pa_decode_sparse import pa_decode_sparse

    return pa_decode_sparse


@functools.cache
def _cu_count(index: int) -> int:
    return int(torch.cuda.get_device_properties(index).multi_processor_count)


def _compute_units(device: torch.device) -> int:
    if device.type != "cuda":
        return DEFAULT_CUS
    return _cu_count(device.index if device.index is not None else torch.cuda.current_device())


def num_splits(tokens: int, heads: int, width: int, compute_units: int) -> int:
    """Splits of the key range per query row: enough programs to fill the GPU, at least 2 (the partials
    are needed for lse), at most one per 64-key tile and at most 16."""
    programs = max(1, tokens * -(-heads // HEAD_TILE))
    fill = -(-compute_units // programs)
    tiles = -(-max(width, 1) // KEY_TILE)
    return max(MIN_SPLITS, min(fill, tiles, MAX_SPLITS))


def csr_indices(indices: torch.Tensor, lengths: torch.Tensor, num_slots: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[T, W] slot indices and lengths -> (flat int32 [T*W] with entries k >= lengths[t] and entries that are
    not slots of the cache (other negatives, past num_slots) set to -1, int32 indptr [T+1] = 0, W, 2W, ...).
    pa_decode_sparse skips only -1 and checks no bound: the mask rides on the pass that applies the lengths."""
    t, w = indices.shape
    cols = torch.arange(w, device=indices.device, dtype=torch.int32)
    live = (cols.unsqueeze(0) < lengths.to(torch.int32).unsqueeze(1)) & (indices >= 0) & (indices < num_slots)
    flat = torch.where(live, indices, torch.full_like(indices, -1)).to(torch.int32).reshape(-1).contiguous()
    indptr = torch.arange(t + 1, device=indices.device, dtype=torch.int32) * w
    return flat, indptr


def combine_partials(acc: torch.Tensor, m2: torch.Tensor, l: torch.Tensor,
                     sink: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Split-K partials (acc [T,S,H,D], m2 [T,S,H] base-2 scaled row max, l [T,S,H]) -> (out bf16 [T,H,D],
    lse fp32 [T,H], natural log before the sink, +inf for a row with no key)."""
    m_max = m2.amax(dim=1)
    m_max = torch.where(torch.isfinite(m_max), m_max, torch.zeros_like(m_max))  # rows with no split work
    w = torch.exp2(m2 - m_max.unsqueeze(1))
    l_tot = (w * l).sum(dim=1)
    acc_tot = torch.einsum("tsh,tshd->thd", w, acc)
    lse = torch.where(l_tot > 0, (m_max + torch.log2(l_tot)) * LN2, torch.full_like(l_tot, math.inf))
    denom = l_tot + torch.exp2(sink.to(torch.float32) * LOG2E - m_max)
    out = acc_tot / torch.where(denom > 0, denom, torch.ones_like(denom)).unsqueeze(-1)
    return out.to(torch.bfloat16), lse.to(torch.float32)


def sparse_attention_decode(q: torch.Tensor, swa_cache: V4PagedCache, swa_indices: torch.Tensor,
                            swa_lengths: torch.Tensor, sink: torch.Tensor, softmax_scale: float,
                            extra_cache: V4PagedCache | None = None, extra_indices: torch.Tensor | None = None,
                            extra_lengths: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    fn = _entry()
    t, h, d = q.shape
    if q.stride(-1) != 1:
        q = q.contiguous()
    sink = sink.to(torch.float32).contiguous()
    main = swa_cache.flashmla_view()[:, :, 0]  # uint8 [pages, 256, 584], stride(0) = page bytes
    extra = None if extra_cache is None else extra_cache.flashmla_view()[:, :, 0]
    width = swa_indices.shape[1] + (0 if extra_indices is None else extra_indices.shape[1])
    splits = num_splits(t, h, width, _compute_units(q.device))
    rows = max(1, SPLIT_BUFFER_BYTES // (splits * h * d * 4))
    outs, lses = [], []
    for start in range(0, t, rows):
        stop = min(t, start + rows)
        idx, ptr = csr_indices(swa_indices[start:stop], swa_lengths[start:stop], swa_cache.num_slots)
        kw: dict[str, Any] = {}
        if extra is not None:
            xidx, xptr = csr_indices(extra_indices[start:stop], extra_lengths[start:stop],  # type: ignore[index]
                                     extra_cache.num_slots)  # type: ignore[union-attr]
            kw = dict(extra_cache=extra, extra_indices=xidx, extra_indptr=xptr)
        acc, m2, l = fn(q[start:stop], main, idx, ptr, sink, float(softmax_scale), kv_splits=splits,
                        has_invalid=True, skip_reduce=True, **kw)
        out, lse = combine_partials(acc, m2, l, sink)
        outs.append(out)
        lses.append(lse)
    if not outs:
        return q.new_empty(0, h, d), torch.empty(0, h, dtype=torch.float32, device=q.device)
    if len(outs) == 1:
        return outs[0], lses[0]
    return torch.cat(outs), torch.cat(lses)
