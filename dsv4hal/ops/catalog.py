"""The ops dsv4hal defines: their contract modules (validation and case features), their pure-PyTorch
references, and a typical production case used when a table of choices is printed without a case.
Everything is named by string so that reading the catalog imports nothing heavy."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType


@dataclass(frozen=True)
class OpSpec:
    name: str
    summary: str
    contract: str  # module holding validate/case functions
    validate: str  # name of the validation function in `contract`
    case: str  # name of the case-feature function in `contract`
    reference: str  # "module:function" of the pure-PyTorch reference
    default_case: Mapping[str, object] = field(default_factory=dict)
    # ops with weights: the argument holding them and the contract function giving their case features;
    # such an op is decided when its weights are prepared (dsv4hal.prepared)
    weights_arg: str | None = None
    weights_validate: str | None = None
    weights_case: str | None = None
    # other typical cases: binding at selection accepts a forced kernel that runs any of them (an FP8-only
    # MoE kernel forced for an FP8 checkpoint is not a bad override because the default case is MXFP4)
    alternate_cases: tuple[Mapping[str, object], ...] = ()


def _spec(name: str, summary: str, contract: str, validate: str, case: str, reference: str,
          weights: tuple[str, str, str] | None = None, alternates: tuple[Mapping[str, object], ...] = (),
          **default_case: object) -> OpSpec:
    w = weights or (None, None, None)
    return OpSpec(name, summary, f"dsv4hal.ops.{contract}", validate, case, reference,
                  MappingProxyType(default_case), *w, tuple(MappingProxyType(dict(a)) for a in alternates))


OPS: tuple[OpSpec, ...] = (
    _spec("pack_store", "quantize bf16 K [N,512] into the 584-byte V4 paged cache at locations",
          "pack_store", "validate_pack_store", "case_pack_store", "dsv4hal.reference.pack_store:pack_store",
          fp8="e4m3fn", page_size=256, size="large"),
    _spec("dequant_gather", "read V4 cache rows back to bf16 [M,512] (sparse-prefill workspace)",
          "pack_store", "validate_dequant_gather", "case_dequant_gather",
          "dsv4hal.reference.pack_store:dequant_gather", fp8="e4m3fn", page_size=256, size="large"),
    _spec("sparse_attention_decode", "sparse MQA over the FP8 V4 cache: SWA + optional C4/C128 extra cache, sink",
          "sparse_attention", "validate_decode", "case_decode",
          "dsv4hal.reference.sparse_attention:sparse_attention_decode",
          h_q=64, compress_ratio=4, fp8="e4m3fn", swa_page_size=256, extra_page_size=64, extra_width=512),
    _spec("sparse_attention_prefill", "sparse MQA over a bf16 workspace by indices, sink",
          "sparse_attention", "validate_prefill", "case_prefill",
          "dsv4hal.reference.sparse_attention:sparse_attention_prefill", h_q=64, width=640),
    _spec("indexer_topk", "top-k (512/1024) of indexer scores with per-row lengths and the page transform",
          "indexer_topk", "validate", "case", "dsv4hal.reference.indexer_topk:indexer_topk",
          k=512, page_transform=True, size="large"),
    _spec("compress", "C4 (overlapping) and C128 compressors with RMSNorm and RoPE",
          "compress", "validate", "case", "dsv4hal.reference.compress:compress", ratio=4, hd=512, hadamard=False),
    _spec("compress_decode", "the compressors' decode form: ring-buffer state, one new token a request",
          "compress", "validate_decode", "case_decode", "dsv4hal.reference.compress:compress_decode",
          ratio=4, hd=512, hadamard=False, ring=8),
    _spec("indexer_logits", "FP8 (132-byte rows) index scores, weighted ReLU over 64 heads",
          "indexer_logits", "validate", "case", "dsv4hal.reference.indexer_logits:indexer_logits", fp8="e4m3fn"),
    _spec("indexer_store", "quantize index keys [N,128] into 132-byte FP8 rows (amax or pow2 scale) at locations",
          "indexer_store", "validate", "case", "dsv4hal.reference.indexer_store:indexer_store", fp8="e4m3fn",
          scale="amax"),
    _spec("moe_route", "sqrt-softplus routing with bias or hash table, top-6, renormalised, x1.5",
          "moe", "validate_moe_route", "case_moe_route", "dsv4hal.reference.moe:moe_route", hash=False, top_k=6),
    _spec("moe_experts", "SwiGLU experts (clamp 10) with MXFP4 or FP8 128x128 block weights",
          "moe", "validate_moe_experts", "case_moe_experts", "dsv4hal.reference.moe:moe_experts",
          weights=("weights", "validate_expert_weights", "case_expert_weights"),
          alternates=({"format": "fp8_block", "fp8": "e4m3fn", "tokens": "decode"},), format="mxfp4", tokens="decode"),
    _spec("mhc_pre", "hyper-connection pre-mix with 20 Sinkhorn iterations", "mhc", "validate_mhc_pre",
          "case_mhc_pre", "dsv4hal.reference.mhc:mhc_pre", hidden=4096, sinkhorn_iters=20),
    _spec("mhc_post", "hyper-connection post-mix", "mhc", "validate_mhc_post", "case_mhc_post",
          "dsv4hal.reference.mhc:mhc_post", hidden=4096),
    _spec("mhc_post_pre", "sublayer boundary: post-mix of one sublayer and pre-mix of the next in one pass",
          "mhc", "validate_mhc_post_pre", "case_mhc_post_pre", "dsv4hal.reference.mhc:mhc_post_pre",
          hidden=4096, sinkhorn_iters=20),
    _spec("mhc_head", "hyper-connection head: the 4 streams to one before the final norm", "mhc",
          "validate_mhc_head", "case_mhc_head", "dsv4hal.reference.mhc:mhc_head", hidden=4096),
    _spec("build_attention_metadata", "per-query SWA/C4/C128 indices, lengths and output locations from page tables",
          "attention_metadata", "validate", "case", "dsv4hal.reference.attention_metadata:build_attention_metadata",
          index_topk=512, in_place=True),
)

OP_NAMES: tuple[str, ...] = tuple(o.name for o in OPS)
OPS_BY_NAME: Mapping[str, OpSpec] = MappingProxyType({o.name: o for o in OPS})
