"""Bandwidth floors: the bytes each op call must move at least, from the byte formats' own sizes, so a
measured op time can be set against the device's copy bandwidth."""

from __future__ import annotations

from typing import Any

import torch

from dsv4hal.engine_model.tape import tensors_of
from dsv4hal.formats import indexer_cache, v4_cache
from dsv4hal.formats.experts import expert_nbytes


def floor_bytes(name: str, args: tuple, kwargs: dict, out: Any) -> float:
    """Bytes an op must move at least (its bandwidth floor): what it reads of caches and weights, by index
    count, plus its dense inputs and outputs. Paged caches, rings and prepared weights are counted only where
    the call addresses them."""

    def nbytes(x: Any) -> int:
        return x.numel() * x.element_size() if isinstance(x, torch.Tensor) else 0

    dense = sum(nbytes(t) for t in tensors_of(out))
    if name == "sparse_attention_decode":
        q, swa_idx = args[0], args[2]
        extra = kwargs.get("extra_indices")
        rows = swa_idx.numel() + (extra.numel() if extra is not None else 0)
        return dense + nbytes(q) + rows * v4_cache.TOKEN_BYTES
    if name == "moe_experts":
        ids, prepared = args[1], args[3]
        e = prepared.case["E"]
        h, i = prepared.case["H"], prepared.case["I"]
        active = int(torch.unique(ids[(ids >= 0) & (ids < e)]).numel())
        return dense + nbytes(args[0]) + active * expert_nbytes(prepared.case["format"], h, i)
    if name == "indexer_logits":
        q, weights, lens = args[0], args[1], args[3]
        return dense + nbytes(q) + nbytes(weights) + int(lens.sum()) * indexer_cache.TOKEN_BYTES
    if name == "indexer_q_prep":  # q, weights and positions in, codes and weights out, a RoPE row a token
        q, weights, cos = args[0], args[1], args[2]
        rope_rows = 2 * q.shape[0] * cos.shape[1] * cos.element_size()  # cos and sin at each token's position
        return dense + nbytes(q) + nbytes(weights) + nbytes(args[4]) + rope_rows
    if name == "pack_store":
        kv = args[0]
        return nbytes(kv) + kv.shape[0] * v4_cache.TOKEN_BYTES
    if name == "indexer_store":  # rows written (slot -1 writes nothing)
        return nbytes(args[0]) + nbytes(args[1]) + int((args[1] >= 0).sum()) * indexer_cache.TOKEN_BYTES
    if name == "build_attention_metadata":  # reads positions and page-table rows, not the whole location map
        return dense + nbytes(args[0]) + nbytes(args[1])
    if name == "compress_decode":
        state = args[1]
        return dense + nbytes(args[0]) + args[0].shape[0] * state.shape[1] * state.shape[2] * state.element_size()
    skip = (v4_cache.V4PagedCache,)
    return dense + sum(nbytes(a) for a in list(args) + list(kwargs.values()) if not isinstance(a, skip))
