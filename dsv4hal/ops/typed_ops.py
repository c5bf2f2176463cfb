"""The typed attributes of dsv4hal.platform.Ops: what IDEs and type checkers see of platform.ops.<op>, each
typed as its definition. Generated from the catalog by `python3 -m dsv4hal.ops.gen_stub`: do not edit
(tests/test_typed_surface.py compares it with a fresh one). Only type checkers import it."""

from __future__ import annotations

from typing import TYPE_CHECKING, ParamSpec, TypeVar

if TYPE_CHECKING:
    from dsv4hal.dispatch.bound_op import BoundOp
    from dsv4hal.ops import attention_metadata as _attention_metadata
    from dsv4hal.ops import compress as _compress
    from dsv4hal.ops import indexer_logits as _indexer_logits
    from dsv4hal.ops import indexer_store as _indexer_store
    from dsv4hal.ops import indexer_topk as _indexer_topk
    from dsv4hal.ops import linear as _linear
    from dsv4hal.ops import mhc as _mhc
    from dsv4hal.ops import moe as _moe
    from dsv4hal.ops import offload as _offload
    from dsv4hal.ops import pack_store as _pack_store
    from dsv4hal.ops import sparse_attention as _sparse_attention
    from dsv4hal.ops.signatures import OpDefinition

P = ParamSpec("P")
R = TypeVar("R")


def _typed(definition: OpDefinition[P, R]) -> BoundOp[P, R]:  # static typing only
    raise NotImplementedError


class TypedOps:
    if TYPE_CHECKING:
        pack_store = _typed(_pack_store.pack_store)
        dequant_gather = _typed(_pack_store.dequant_gather)
        sparse_attention_decode = _typed(_sparse_attention.sparse_attention_decode)
        sparse_attention_prefill = _typed(_sparse_attention.sparse_attention_prefill)
        indexer_topk = _typed(_indexer_topk.indexer_topk)
        compress = _typed(_compress.compress)
        compress_decode = _typed(_compress.compress_decode)
        indexer_logits = _typed(_indexer_logits.indexer_logits)
        indexer_q_prep = _typed(_indexer_logits.indexer_q_prep)
        indexer_store = _typed(_indexer_store.indexer_store)
        moe_route = _typed(_moe.moe_route)
        moe_experts = _typed(_moe.moe_experts)
        fp8_linear = _typed(_linear.fp8_linear)
        fp8_grouped_linear = _typed(_linear.fp8_grouped_linear)
        mhc_pre = _typed(_mhc.mhc_pre)
        mhc_post = _typed(_mhc.mhc_post)
        mhc_post_pre = _typed(_mhc.mhc_post_pre)
        mhc_head = _typed(_mhc.mhc_head)
        offload_fetch = _typed(_offload.offload_fetch)
        build_attention_metadata = _typed(_attention_metadata.build_attention_metadata)
