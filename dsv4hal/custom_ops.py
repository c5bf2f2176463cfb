"""Every op as a torch custom op, `torch.ops.dsv4hal.<op>`, so that torch.compile(fullgraph=True) sees each bound
op as one opaque node whatever kernel runs inside (vendor, Triton or the reference, whose data-dependent
`.tolist()` Dynamo could not trace).

How an engine uses it: nothing changes. `platform.ops.X(...)` checks torch.compiler.is_compiling(); while Dynamo
traces, it validates the arguments as eager mode does (unchecked; a bad call raises eager's typed error, see
"validation while Dynamo traces" below), calls `torch.ops.dsv4hal.X` with them flattened to tensors and scalars
(below), and the
custom op's eager implementation rebuilds them and calls the same bound op, which validates and dispatches as in
eager mode. Each op has a fake implementation giving exact output shapes and dtypes (compress's row count is
data dependent: an unbacked size). Ops that write in place declare what they mutate: pack_store `cache`,
indexer_store `cache`, compress_decode `state`, build_attention_metadata the tensors of `out`.

The op's own scalars (page sizes, k, ratio, eps, hadamard, ...) are declared Number (schema type Scalar), not
int, float or bool: the dispatcher converts a bool passed for an int or float argument (True -> 1, 1.0) and an int
for a bool one, so the eager body, which validates as eager mode does, would no longer see what the caller passed.
A Scalar keeps its Python type (True stays a bool, 64 an int, 0.5 a float) and validation refuses what eager
refuses. Only the handles (platform, weights) are ints.

Flattened arguments (the custom ops take tensors, Scalars, strs and int handles):
    V4PagedCache        -> data (uint8 tensor), page_size, fp8
    IndexerPagedCache   -> data, fp8
    PreparedWeights     -> its payload's tensors (so the graph sees them) and an int handle naming the object
    AttentionMetadata   -> its 8 tensors (build_attention_metadata_out, which mutates them)
    the platform        -> an int handle (Platform.handle)

Imported when a platform binds its ops (it imports torch); `import dsv4hal` stays free of torch."""

from __future__ import annotations

import dataclasses
import itertools
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.library import custom_op
from torch.types import Number

from dsv4hal import checks
from dsv4hal.checks import check_materializable, describe
from dsv4hal.errors import Dsv4HalError, InvalidArgumentError
from dsv4hal.formats.indexer_cache import IndexerPagedCache
from dsv4hal.formats.v4_cache import HEAD_DIM, V4PagedCache
from dsv4hal.ops.attention_metadata import WINDOW, AttentionMetadata, c128_width
from dsv4hal.ops.catalog import OPS_BY_NAME
from dsv4hal.prepared import PreparedWeights

is_compiling: Callable[[], bool] = torch.compiler.is_compiling
NAMESPACE = "dsv4hal"

_weights: weakref.WeakValueDictionary[int, PreparedWeights] = weakref.WeakValueDictionary()
_weight_handles = itertools.count(1)


def remember_weights(prepared: PreparedWeights) -> None:
    """Give prepared weights a handle and the tuple of their payload's tensors: the compiled moe_experts passes
    both (the object itself cannot be a custom op argument)."""
    payload = prepared.payload
    fields = dataclasses.fields(payload) if dataclasses.is_dataclass(payload) else ()
    names = tuple(f.name for f in fields if isinstance(getattr(payload, f.name), torch.Tensor))
    handle = next(_weight_handles)
    object.__setattr__(prepared, "_handle", handle)  # frozen dataclass: set once, here
    object.__setattr__(prepared, "_tensors", tuple(getattr(payload, n) for n in names))
    object.__setattr__(prepared, "_tensor_fields", names)
    _weights[handle] = prepared


def _op(platform: int, name: str) -> Any:
    from dsv4hal.platform import PLATFORMS

    p = PLATFORMS.get(platform)
    if p is None:
        raise Dsv4HalError(f"{name}: the platform this graph was compiled for (handle {platform}) no longer exists",
                           remedy="keep the Platform alive as long as functions compiled with its ops run")
    return p.ops[name]


def _v4(data: torch.Tensor, page_size: int, fp8: str) -> V4PagedCache:
    # A new object each call (a dataclass, ~1 us): remembering them would keep freed cache buffers alive. The
    # compiled path is for CUDA graphs, where this host time is not spent on replays.
    return V4PagedCache(data, page_size, fp8)  # type: ignore[arg-type]


def _dense(out: Any) -> Any:
    """The eager body's tensors laid out as the fakes describe them, contiguous: a kernel may return a strided view
    (DeepGEMM's logits are a view of a 256-aligned buffer), and compiled code reads outputs with the fake's strides
    (Inductor asserts them). A copy only under torch.compile, only for such an output; eager calls are untouched."""
    if isinstance(out, torch.Tensor):
        return out.contiguous()
    return type(out)(t if t is None else t.contiguous() for t in out)


def _empty_like_none(t: torch.Tensor) -> torch.Tensor:
    return t.new_empty(0)


def _fake(op: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """op.register_fake, for a fake that runs only while tracing: a meta tensor among a custom op's arguments sends
    the call to the fake implementation, which computes nothing. Outside fake-tensor tracing (no fake mode
    active) a meta tensor is the caller's, and is refused as eager refuses it (dsv4hal.checks.check_materializable)."""
    names = [a.name for a in op._opoverload._schema.arguments]

    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        def fake(*args: Any) -> Any:
            if torch._guards.detect_fake_mode() is None:
                named = [(f"{names[i]}[{j}]", t) for i, a in enumerate(args) if isinstance(a, (list, tuple))
                         for j, t in enumerate(a)]
                check_materializable(op._name, [*args, *(t for _, t in named)], {},
                                     [*names, *(n for n, _ in named)])
            return fn(*args)

        op.register_fake(fake)
        return fn

    return register


# ---------------------------------------------------------------- the custom ops (eager bodies and fakes)

@custom_op(f"{NAMESPACE}::pack_store", mutates_args=("cache",))
def _pack_store(k: torch.Tensor, loc: torch.Tensor, cache: torch.Tensor, page_size: Number, fp8: str,
                platform: int) -> None:
    _op(platform, "pack_store")(k, loc, _v4(cache, page_size, fp8))


@_fake(_pack_store)
def _(k, loc, cache, page_size, fp8, platform):  # noqa: ANN001, ANN202
    return None


@custom_op(f"{NAMESPACE}::dequant_gather", mutates_args=())
def _dequant_gather(cache: torch.Tensor, page_size: Number, fp8: str, loc: torch.Tensor,
                    platform: int) -> torch.Tensor:
    return _dense(_op(platform, "dequant_gather")(_v4(cache, page_size, fp8), loc))


@_fake(_dequant_gather)
def _(cache, page_size, fp8, loc, platform):  # noqa: ANN001, ANN202
    return cache.new_empty(loc.shape[0], HEAD_DIM, dtype=torch.bfloat16)


@custom_op(f"{NAMESPACE}::sparse_attention_decode", mutates_args=())
def _sparse_attention_decode(q: torch.Tensor, swa_cache: torch.Tensor, swa_page_size: Number, swa_fp8: str,
                             swa_indices: torch.Tensor, swa_lengths: torch.Tensor, sink: torch.Tensor,
                             softmax_scale: Number, extra_cache: torch.Tensor | None, extra_page_size: Number,
                             extra_fp8: str, extra_indices: torch.Tensor | None, extra_lengths: torch.Tensor | None,
                             platform: int) -> tuple[torch.Tensor, torch.Tensor]:
    extra = None if extra_cache is None else _v4(extra_cache, extra_page_size, extra_fp8)
    op = _op(platform, "sparse_attention_decode")
    return _dense(op(q, _v4(swa_cache, swa_page_size, swa_fp8), swa_indices, swa_lengths, sink, softmax_scale, extra,
                     extra_indices, extra_lengths))


def _attention_fake(q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return q.new_empty(q.shape), q.new_empty(q.shape[0], q.shape[1], dtype=torch.float32)


@_fake(_sparse_attention_decode)
def _(q, *args):  # noqa: ANN001, ANN002, ANN202
    return _attention_fake(q)


@custom_op(f"{NAMESPACE}::sparse_attention_prefill", mutates_args=())
def _sparse_attention_prefill(q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor, lengths: torch.Tensor,
                              sink: torch.Tensor, softmax_scale: Number,
                              platform: int) -> tuple[torch.Tensor, torch.Tensor]:
    return _dense(_op(platform, "sparse_attention_prefill")(q, kv, indices, lengths, sink, softmax_scale))


@_fake(_sparse_attention_prefill)
def _(q, *args):  # noqa: ANN001, ANN002, ANN202
    return _attention_fake(q)


@custom_op(f"{NAMESPACE}::indexer_topk", mutates_args=())
def _indexer_topk(scores: torch.Tensor, lengths: torch.Tensor, k: Number, page_table: torch.Tensor | None,
                  page_size: Number, platform: int) -> tuple[torch.Tensor, torch.Tensor]:
    raw, pages = _dense(_op(platform, "indexer_topk")(scores, lengths, k, page_table, page_size))
    return raw, _empty_like_none(raw) if pages is None else pages  # no page table: an empty stand-in for None


@_fake(_indexer_topk)
def _(scores, lengths, k, page_table, page_size, platform):  # noqa: ANN001, ANN202
    raw = scores.new_empty(scores.shape[0], k, dtype=torch.int32)
    return raw, _empty_like_none(raw) if page_table is None else raw.new_empty(raw.shape)


@custom_op(f"{NAMESPACE}::compress", mutates_args=())
def _compress(kv_score: torch.Tensor, cu_seqlens: torch.Tensor, ape: torch.Tensor, norm_weight: torch.Tensor,
              cos: torch.Tensor, sin: torch.Tensor, ratio: Number, eps: Number, hadamard: Number,
              num_groups: Number | None, platform: int) -> torch.Tensor:
    op = _op(platform, "compress")
    return _dense(op(kv_score, cu_seqlens, ape, norm_weight, cos, sin, ratio, eps, hadamard, num_groups))


@_fake(_compress)
def _(kv_score, cu_seqlens, ape, norm_weight, cos, sin, ratio, eps, hadamard, num_groups, platform):  # noqa: ANN001, ANN202
    # sum_b L_b // ratio: the caller's num_groups, else read from cu_seqlens (data-dependent)
    rows = torch.library.get_ctx().new_dynamic_size() if num_groups is None else num_groups
    return kv_score.new_empty(rows, norm_weight.shape[0])


@custom_op(f"{NAMESPACE}::compress_decode", mutates_args=("state",))
def _compress_decode(kv_score: torch.Tensor, state: torch.Tensor, slots: torch.Tensor, positions: torch.Tensor,
                     ape: torch.Tensor, norm_weight: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, ratio: Number,
                     eps: Number, hadamard: Number, platform: int) -> torch.Tensor:
    op = _op(platform, "compress_decode")
    return _dense(op(kv_score, state, slots, positions, ape, norm_weight, cos, sin, ratio, eps, hadamard))


@_fake(_compress_decode)
def _(kv_score, state, slots, positions, ape, norm_weight, *args):  # noqa: ANN001, ANN002, ANN202
    return kv_score.new_empty(kv_score.shape[0], norm_weight.shape[0])


@custom_op(f"{NAMESPACE}::indexer_logits", mutates_args=())
def _indexer_logits(q: torch.Tensor, weights: torch.Tensor, cache: torch.Tensor, fp8: str,
                    context_lens: torch.Tensor, block_table: torch.Tensor, platform: int) -> torch.Tensor:
    cache_ = IndexerPagedCache(cache, fp8)  # type: ignore[arg-type]
    return _dense(_op(platform, "indexer_logits")(q, weights, cache_, context_lens, block_table))


@_fake(_indexer_logits)
def _(q, weights, cache, fp8, context_lens, block_table, platform):  # noqa: ANN001, ANN202
    from dsv4hal.formats.indexer_cache import PAGE_SIZE

    return weights.new_empty(q.shape[0], block_table.shape[1] * PAGE_SIZE)


@custom_op(f"{NAMESPACE}::indexer_q_prep", mutates_args=())
def _indexer_q_prep(q: torch.Tensor, weights: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                    positions: torch.Tensor, fp8: str, platform: int) -> tuple[torch.Tensor, torch.Tensor]:
    return _dense(_op(platform, "indexer_q_prep")(q, weights, cos, sin, positions, fp8))


@_fake(_indexer_q_prep)
def _(q, weights, cos, sin, positions, fp8, platform):  # noqa: ANN001, ANN202
    from dsv4hal.formats.fp8 import fp8_dtype

    return q.new_empty(q.shape, dtype=fp8_dtype(fp8)), q.new_empty(q.shape[:2], dtype=torch.float32)


@custom_op(f"{NAMESPACE}::indexer_store", mutates_args=("cache",))
def _indexer_store(k: torch.Tensor, loc: torch.Tensor, cache: torch.Tensor, fp8: str, scale: str,
                   platform: int) -> None:
    _op(platform, "indexer_store")(k, loc, IndexerPagedCache(cache, fp8), scale)  # type: ignore[arg-type]


@_fake(_indexer_store)
def _(k, loc, cache, fp8, scale, platform):  # noqa: ANN001, ANN202
    return None


@custom_op(f"{NAMESPACE}::moe_route", mutates_args=())
def _moe_route(router_logits: torch.Tensor, bias: torch.Tensor | None, top_k: Number, routed_scaling_factor: Number,
               hash_table: torch.Tensor | None, input_ids: torch.Tensor | None,
               platform: int) -> tuple[torch.Tensor, torch.Tensor]:
    return _dense(_op(platform, "moe_route")(router_logits, bias, top_k, routed_scaling_factor, hash_table, input_ids))


@_fake(_moe_route)
def _(router_logits, bias, top_k, routed_scaling_factor, hash_table, input_ids, platform):  # noqa: ANN001, ANN202
    k = top_k if hash_table is None else hash_table.shape[1]
    t = router_logits.shape[0]
    return router_logits.new_empty(t, k, dtype=torch.int32), router_logits.new_empty(t, k)


@custom_op(f"{NAMESPACE}::moe_experts", mutates_args=())
def _moe_experts(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
                 weight_tensors: Sequence[torch.Tensor], weights: int, swiglu_limit: Number,
                 platform: int) -> torch.Tensor:
    # weight_tensors are the prepared payload's own tensors, passed so the graph sees them; the object is found
    # by its handle
    prepared = _weights.get(weights)
    if prepared is None:
        raise Dsv4HalError("moe_experts: the prepared weights this graph was compiled with no longer exist",
                           remedy="keep the PreparedWeights alive as long as functions compiled with them run")
    return _dense(_op(platform, "moe_experts")(x, topk_ids, topk_weights, _passed(prepared, weights, weight_tensors),
                                              swiglu_limit))


def _passed(prepared: PreparedWeights, handle: int, tensors: Sequence[torch.Tensor]) -> PreparedWeights:
    """The weights moe_experts runs: the handle's, with the tensors the call passed. Tensors of other weights (other
    count, shapes, dtypes or devices) are refused; copies of the handle's (torch.library.opcheck passes copies, CUDA
    graph trees copy inputs into static buffers) are what the call computes with."""
    own = prepared._tensors  # type: ignore[attr-defined]
    if len(tensors) != len(own) or any(a.shape != b.shape or a.dtype != b.dtype or a.device != b.device
                                       for a, b in zip(tensors, own)):
        got = ", ".join(describe(t) for t in tensors) or "none"
        raise InvalidArgumentError("moe_experts", "weight_tensors", f"the {len(own)} tensors of the prepared weights "
                                   f"with handle {handle}", got,
                                   remedy="pass the tensors and the handle custom_ops.flatten gives for the weights")
    if all(a.data_ptr() == b.data_ptr() for a, b in zip(tensors, own)):
        return prepared
    fields = prepared._tensor_fields  # type: ignore[attr-defined]
    payload = dataclasses.replace(prepared.payload, **dict(zip(fields, tensors)))
    return dataclasses.replace(prepared, payload=payload)


@_fake(_moe_experts)
def _(x, *args):  # noqa: ANN001, ANN002, ANN202
    return x.new_empty(x.shape)


@custom_op(f"{NAMESPACE}::mhc_pre", mutates_args=())
def _mhc_pre(x: torch.Tensor, fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor, rms_eps: Number,
             hc_eps: Number, sinkhorn_iters: Number, platform: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _dense(_op(platform, "mhc_pre")(x, fn, base, scale, rms_eps, hc_eps, sinkhorn_iters))


def _pre_fake(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    t, n, d = x.shape
    return x.new_empty(t, d), x.new_empty(t, n, dtype=torch.float32), x.new_empty(t, n, n, dtype=torch.float32)


@_fake(_mhc_pre)
def _(x, *args):  # noqa: ANN001, ANN002, ANN202
    return _pre_fake(x)


@custom_op(f"{NAMESPACE}::mhc_post", mutates_args=())
def _mhc_post(f: torch.Tensor, x: torch.Tensor, post: torch.Tensor, comb: torch.Tensor,
              platform: int) -> torch.Tensor:
    return _dense(_op(platform, "mhc_post")(f, x, post, comb))


@_fake(_mhc_post)
def _(f, x, *args):  # noqa: ANN001, ANN002, ANN202
    return x.new_empty(x.shape)


@custom_op(f"{NAMESPACE}::mhc_post_pre", mutates_args=())
def _mhc_post_pre(f: torch.Tensor, x: torch.Tensor, post: torch.Tensor, comb: torch.Tensor, fn: torch.Tensor,
                  base: torch.Tensor, scale: torch.Tensor, rms_eps: Number, hc_eps: Number, sinkhorn_iters: Number,
                  platform: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    return _dense(_op(platform, "mhc_post_pre")(f, x, post, comb, fn, base, scale, rms_eps, hc_eps, sinkhorn_iters))


@_fake(_mhc_post_pre)
def _(f, x, *args):  # noqa: ANN001, ANN002, ANN202
    return (x.new_empty(x.shape), *_pre_fake(x))


@custom_op(f"{NAMESPACE}::mhc_head", mutates_args=())
def _mhc_head(x: torch.Tensor, fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor, rms_eps: Number,
              hc_eps: Number, platform: int) -> torch.Tensor:
    return _dense(_op(platform, "mhc_head")(x, fn, base, scale, rms_eps, hc_eps))


@_fake(_mhc_head)
def _(x, *args):  # noqa: ANN001, ANN002, ANN202
    return x.new_empty(x.shape[0], x.shape[2])


_METADATA_FIELDS = tuple(f.name for f in dataclasses.fields(AttentionMetadata))


@custom_op(f"{NAMESPACE}::build_attention_metadata", mutates_args=())
def _build_attention_metadata(positions: torch.Tensor, page_table: torch.Tensor, full_to_swa: torch.Tensor,
                              index_topk: Number, platform: int) -> list[torch.Tensor]:
    m = _op(platform, "build_attention_metadata")(positions, page_table, full_to_swa, index_topk, None)
    return _dense([getattr(m, name) for name in _METADATA_FIELDS])


@_fake(_build_attention_metadata)
def _(positions, page_table, full_to_swa, index_topk, platform):  # noqa: ANN001, ANN202
    t, p = positions.shape[0], page_table.shape[1]
    i32 = dict(dtype=torch.int32)
    return [positions.new_empty(t, WINDOW, **i32), *(positions.new_empty(t, **i32) for _ in range(3)),
            positions.new_empty(t, c128_width(p), **i32), positions.new_empty(t, **i32),
            positions.new_empty(t, dtype=torch.int64), positions.new_empty(t, dtype=torch.int64)]


@custom_op(f"{NAMESPACE}::build_attention_metadata_out", mutates_args=("out",))
def _build_attention_metadata_out(positions: torch.Tensor, page_table: torch.Tensor, full_to_swa: torch.Tensor,
                                  index_topk: Number, out: list[torch.Tensor], platform: int) -> None:
    _op(platform, "build_attention_metadata")(positions, page_table, full_to_swa, index_topk,
                                              AttentionMetadata(*out))


@_fake(_build_attention_metadata_out)
def _(positions, page_table, full_to_swa, index_topk, out, platform):  # noqa: ANN001, ANN202
    return None


# ---------------------------------------------------------------- what platform.ops.X calls while Dynamo traces
# _flat_<op>(platform handle, the op's own arguments) -> (custom op name, its arguments); _post_<op> turns the custom
# op's outputs back into the op's return value where they differ.

Flat = tuple[str, tuple[Any, ...]]


def _flat_pack_store(h: int, k: torch.Tensor, loc: torch.Tensor, cache: V4PagedCache) -> Flat:
    return "pack_store", (k, loc, cache.data, cache.page_size, cache.fp8, h)


def _flat_dequant_gather(h: int, cache: V4PagedCache, loc: torch.Tensor) -> Flat:
    return "dequant_gather", (cache.data, cache.page_size, cache.fp8, loc, h)


def _flat_sparse_attention_decode(h: int, q: torch.Tensor, swa_cache: V4PagedCache, swa_indices: torch.Tensor,
                                  swa_lengths: torch.Tensor, sink: torch.Tensor, softmax_scale: float,
                                  extra_cache: V4PagedCache | None = None, extra_indices: torch.Tensor | None = None,
                                  extra_lengths: torch.Tensor | None = None) -> Flat:
    if extra_cache is None:
        xdata, xpage, xfp8 = None, 0, swa_cache.fp8
    else:
        xdata, xpage, xfp8 = extra_cache.data, extra_cache.page_size, extra_cache.fp8
    return "sparse_attention_decode", (q, swa_cache.data, swa_cache.page_size, swa_cache.fp8, swa_indices,
                                       swa_lengths, sink, softmax_scale, xdata, xpage, xfp8, extra_indices,
                                       extra_lengths, h)


def _flat_sparse_attention_prefill(h: int, q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor,
                                   lengths: torch.Tensor, sink: torch.Tensor, softmax_scale: float) -> Flat:
    return "sparse_attention_prefill", (q, kv, indices, lengths, sink, softmax_scale, h)


def _flat_indexer_topk(h: int, scores: torch.Tensor, lengths: torch.Tensor, k: int,
                       page_table: torch.Tensor | None = None, page_size: int = 64) -> Flat:
    return "indexer_topk", (scores, lengths, k, page_table, page_size, h)


def _post_indexer_topk(out: tuple[torch.Tensor, torch.Tensor], scores: torch.Tensor, lengths: torch.Tensor, k: int,
                       page_table: torch.Tensor | None = None,
                       page_size: int = 64) -> tuple[torch.Tensor, torch.Tensor | None]:
    return out[0], None if page_table is None else out[1]


def _flat_compress(h: int, kv_score: torch.Tensor, cu_seqlens: torch.Tensor, ape: torch.Tensor,
                   norm_weight: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, ratio: int, eps: float = 1e-6,
                   hadamard: bool = False, num_groups: int | None = None) -> Flat:
    return "compress", (kv_score, cu_seqlens, ape, norm_weight, cos, sin, ratio, eps, hadamard, num_groups, h)


def _flat_compress_decode(h: int, kv_score: torch.Tensor, state: torch.Tensor, slots: torch.Tensor,
                          positions: torch.Tensor, ape: torch.Tensor, norm_weight: torch.Tensor, cos: torch.Tensor,
                          sin: torch.Tensor, ratio: int, eps: float = 1e-6, hadamard: bool = False) -> Flat:
    return "compress_decode", (kv_score, state, slots, positions, ape, norm_weight, cos, sin, ratio, eps,
                               hadamard, h)


def _flat_indexer_logits(h: int, q: torch.Tensor, weights: torch.Tensor, cache: IndexerPagedCache,
                         context_lens: torch.Tensor, block_table: torch.Tensor) -> Flat:
    return "indexer_logits", (q, weights, cache.data, cache.fp8, context_lens, block_table, h)


def _flat_indexer_q_prep(h: int, q: torch.Tensor, weights: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                         positions: torch.Tensor, fp8: str = "e4m3fn") -> Flat:
    return "indexer_q_prep", (q, weights, cos, sin, positions, fp8, h)


def _flat_indexer_store(h: int, k: torch.Tensor, loc: torch.Tensor, cache: IndexerPagedCache,
                        scale: str = "amax") -> Flat:
    return "indexer_store", (k, loc, cache.data, cache.fp8, scale, h)


def _flat_moe_route(h: int, router_logits: torch.Tensor, bias: torch.Tensor | None = None, top_k: int = 6,
                    routed_scaling_factor: float = 1.5, hash_table: torch.Tensor | None = None,
                    input_ids: torch.Tensor | None = None) -> Flat:
    return "moe_route", (router_logits, bias, top_k, routed_scaling_factor, hash_table, input_ids, h)


def _flat_moe_experts(h: int, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor,
                      weights: PreparedWeights, swiglu_limit: float = 10.0) -> Flat:
    return "moe_experts", (x, topk_ids, topk_weights, list(weights._tensors),  # type: ignore[attr-defined]
                           weights._handle, swiglu_limit, h)  # type: ignore[attr-defined]


def _flat_mhc_pre(h: int, x: torch.Tensor, fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor,
                  rms_eps: float = 1e-6, hc_eps: float = 1e-6, sinkhorn_iters: int = 20) -> Flat:
    return "mhc_pre", (x, fn, base, scale, rms_eps, hc_eps, sinkhorn_iters, h)


def _flat_mhc_post(h: int, f: torch.Tensor, x: torch.Tensor, post: torch.Tensor, comb: torch.Tensor) -> Flat:
    return "mhc_post", (f, x, post, comb, h)


def _flat_mhc_post_pre(h: int, f: torch.Tensor, x: torch.Tensor, post: torch.Tensor, comb: torch.Tensor,
                       fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor, rms_eps: float = 1e-6,
                       hc_eps: float = 1e-6, sinkhorn_iters: int = 20) -> Flat:
    return "mhc_post_pre", (f, x, post, comb, fn, base, scale, rms_eps, hc_eps, sinkhorn_iters, h)


def _flat_mhc_head(h: int, x: torch.Tensor, fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor,
                   rms_eps: float = 1e-6, hc_eps: float = 1e-6) -> Flat:
    return "mhc_head", (x, fn, base, scale, rms_eps, hc_eps, h)


def _flat_build_attention_metadata(h: int, positions: torch.Tensor, page_table: torch.Tensor,
                                   full_to_swa: torch.Tensor, index_topk: int = 512,
                                   out: AttentionMetadata | None = None) -> Flat:
    if out is None:
        return "build_attention_metadata", (positions, page_table, full_to_swa, index_topk, h)
    tensors = [getattr(out, name) for name in _METADATA_FIELDS]
    return "build_attention_metadata_out", (positions, page_table, full_to_swa, index_topk, tensors, h)


def _post_build_attention_metadata(result: list[torch.Tensor] | None, positions: torch.Tensor,
                                   page_table: torch.Tensor, full_to_swa: torch.Tensor, index_topk: int = 512,
                                   out: AttentionMetadata | None = None) -> AttentionMetadata:
    return out if out is not None else AttentionMetadata(*result)  # type: ignore[misc]


_FLAT: dict[str, Callable[..., Flat]] = {
    name.removeprefix("_flat_"): fn for name, fn in list(globals().items()) if name.startswith("_flat_")}
_POST: dict[str, Callable[..., Any]] = {
    name.removeprefix("_post_"): fn for name, fn in list(globals().items()) if name.startswith("_post_")}


def flatten(op: str, platform: int, *args: Any, **kwargs: Any) -> tuple[Any, tuple[Any, ...]]:
    """The custom op (an OpOverloadPacket) and its flattened arguments for a call of platform.ops.<op>(*args,
    **kwargs) on the platform with this handle (for torch.library.opcheck and tests)."""
    name, flat = _FLAT[op](platform, *args, **kwargs)
    return getattr(torch.ops.dsv4hal, name), flat


# ---------------------------------------------------------------- validation while Dynamo traces
# The traced call validates the op's arguments before flattening them, as eager does: Dynamo traces the validation
# (it reads types, dtypes, shapes, strides, devices and scalar values, never tensor contents), so a call that passes
# leaves guards and no graph node, and costs nothing when the compiled code runs. A call that fails must reach the
# caller as the same typed error as in eager. An exception raised in traced code reaches the caller of a
# fullgraph=True compile only as Dynamo's own "Observed exception" error, so the error Dynamo caught is raised again
# from a function Dynamo runs rather than traces (_refuse, _run_not_traced), as an instance of its class that
# is also Dynamo's Unsupported: Dynamo lets an Unsupported through unchanged (fullgraph=True), or breaks the graph
# there and runs the call eagerly (fullgraph=False), which raises the plain typed error.
# What the validation reads becomes Dynamo guards, checked on every call of the compiled function unless the engine
# skips guard evaluation or replays a CUDA graph: on the CI machine 5 to 10 us for each op the function uses (most
# guards are on the validation's own functions and constants, shared by every call site of the op).



def _run_not_traced(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Mark fn as torch._dynamo.assume_constant_result does: Dynamo calls it rather than traces it, and takes what it
    returns as a constant. The mark is set here rather than by that function, whose import (torch._dynamo) would load
    Triton when a CPU platform binds its ops; the compile tests fail if Dynamo stops reading it."""
    fn._dynamo_marked_constant = True  # type: ignore[attr-defined]
    return fn


# The device's memory size, which validation compares sizes with (dsv4hal.checks.check_alloc), is a host query Dynamo
# cannot trace (os.sysconf, a CUDA property): it runs it and takes the result as a constant.
_run_not_traced(checks._memory_bytes)

_refusals: dict[type, type] = {}


def _refusal_type(cls: type[Dsv4HalError]) -> type[Dsv4HalError]:
    """cls, also a torch._dynamo.exc.Unsupported (cls when this torch has no such class)."""
    sub = _refusals.get(cls)
    if sub is None:
        try:
            from torch._dynamo.exc import Unsupported
        except ImportError:  # pragma: no cover  (another torch: the plain class, which Dynamo then reports)
            return cls
        sub = _refusals[cls] = type(cls.__name__, (cls, Unsupported), {"__module__": cls.__module__,
                                                                       "__qualname__": cls.__qualname__})
    return sub


def refusal(cls: type[Dsv4HalError], message: str, remedy: str | None,
            fields: tuple[tuple[str, object], ...] = ()) -> Dsv4HalError:
    """The error `cls(...)` with this message, remedy and attributes, as _refuse raises it while Dynamo traces."""
    sub = _refusal_type(cls)
    err = sub.__new__(sub)
    if sub is not cls:
        from torch._dynamo.exc import Unsupported

        try:  # what Dynamo reads of an Unsupported it lets through or breaks the graph at
            Unsupported.__init__(err, message, "dsv4hal argument validation")  # type: ignore[arg-type]
        except Exception:  # noqa: BLE001  (another torch's Unsupported: its message alone)
            pass
    for name, value in fields:
        setattr(err, name, value)
    Dsv4HalError.__init__(err, message, remedy=remedy)
    return err


@_run_not_traced
def _refuse(cls: type[Dsv4HalError], message: str, remedy: str | None,
            fields: tuple[tuple[str, object], ...]) -> None:
    # run by Dynamo, not traced: the exception leaves the tracer as raised
    raise refusal(cls, message, remedy, fields)


def _fields(e: Dsv4HalError) -> tuple[tuple[str, object], ...]:
    if isinstance(e, InvalidArgumentError):
        return (("op", e.op), ("argument", e.argument), ("expected", e.expected), ("got", e.got))
    return ()


def traced(op: str, validate: bool = True) -> Callable[..., Any]:
    """What platform.ops.<op> calls while Dynamo traces: (platform handle, the op's own arguments). With `validate`
    (the platform's), the arguments are validated first, unchecked: values are not known while tracing."""
    flat_fn, post = _FLAT[op], _POST.get(op)
    definition = OPS_BY_NAME[op].definition()
    params = definition.params

    @_run_not_traced
    def check_call(count: int, names: tuple[str, ...]) -> bool:
        # run, not traced: a call that does not bind would fail inside Dynamo's inlining, before validation
        try:
            definition.check_call((None,) * count, dict.fromkeys(names))
        except Dsv4HalError as e:
            raise refusal(type(e), e.message, e.remedy) from None
        return True

    def call(platform: int, *args: Any, **kwargs: Any) -> Any:
        if validate:
            check_call(len(args), tuple(kwargs))
            try:
                check_materializable(op, args, kwargs, params)
                definition.validate(*args, **kwargs, checked=False)
            except Dsv4HalError as e:
                _refuse(type(e), e.message, e.remedy, _fields(e))
        name, flat = flat_fn(platform, *args, **kwargs)
        out = getattr(torch.ops.dsv4hal, name)(*flat)
        return out if post is None else post(out, *args, **kwargs)

    call.__name__ = f"traced_{op}"
    return call
