"""The ops dsv4hal defines. Each op has one typed definition in its module `dsv4hal/ops/<module>.py` (signature,
docstring, validate and case functions: dsv4hal.ops.signatures), its pure-PyTorch reference of the same name in
the reference package's `<module>.py` and its conformance cases in `conformance/cases_<module>.py`. The catalog
holds only what must be read without importing torch (names, one-line summaries, the typical production case used
when a table of choices is printed without one); everything else is found from the definition.

These are the built-in ops. A plugin adds its own (hookspecs.dsv4hal_ops); the ops of a platform are those of its
registry (Registry.ops), which code that lists or checks op names reads."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from dsv4hal.errors import RegistryError

if TYPE_CHECKING:
    from dsv4hal.ops.signatures import OpDefinition


_ROOT = __name__.split(".")[0]


@cache
def _definition(contract: str, name: str) -> OpDefinition[..., Any]:
    return getattr(importlib.import_module(contract), name)


@dataclass(frozen=True)
class OpSpec:
    """What is known of an op without importing torch. A built-in op names its `module`, from which its three
    modules are derived; a plugin's op (hookspecs.dsv4hal_ops) names `contract`, `reference` and `cases` itself."""

    name: str
    summary: str
    module: str = ""  # dsv4hal.ops.<module> defines it, the reference package's <module> holds its reference
    default_case: Mapping[str, object] = field(default_factory=dict)
    # other typical cases: binding at selection accepts a forced kernel that runs any of them (an FP8-only
    # MoE kernel forced for an FP8 checkpoint is not a bad override because the default case is MXFP4)
    alternate_cases: tuple[Mapping[str, object], ...] = ()
    contract: str = ""  # the module holding the op's definition (imports torch)
    reference: str = ""  # "module:function" of the pure-PyTorch reference
    cases: str = ""  # the conformance case module (CASES..., build)

    def __post_init__(self) -> None:
        derived = {"contract": f"dsv4hal.ops.{self.module}",
                   # named, never imported here: ops/ sits below reference/
                   "reference": f"{_ROOT}.reference.{self.module}:{self.name}",
                   "cases": f"dsv4hal.conformance.cases_{self.module}"}
        for attr, value in derived.items():
            if not getattr(self, attr):
                if not self.module:
                    raise RegistryError(f"op {self.name!r}: its OpSpec names neither `module` nor `{attr}`",
                                        remedy=f"name the op's {attr} module (OpSpec(..., {attr}=...))")
                object.__setattr__(self, attr, value)  # frozen: derived once, here

    def definition(self) -> OpDefinition[..., Any]:
        """The op's typed definition (imports the contract module, and so torch)."""
        return _definition(self.contract, self.name)

    # names of the contract functions, for callers that look them up in `contract`
    @property
    def validate(self) -> str:
        return self.definition().validate.__name__

    @property
    def case(self) -> str:
        return self.definition().case.__name__

    # ops with weights: the argument holding them; such an op is decided when its weights are prepared
    # (dsv4hal.prepared)
    @property
    def weights_arg(self) -> str | None:
        return self.definition().weights_arg

    @property
    def weights_case(self) -> str | None:
        fn = self.definition().weights_case
        return None if fn is None else fn.__name__


def _spec(name: str, module: str, summary: str, alternates: tuple[Mapping[str, object], ...] = (),
          **default_case: object) -> OpSpec:
    return OpSpec(name, summary, module, MappingProxyType(default_case),
                  tuple(MappingProxyType(dict(a)) for a in alternates))


# moe_experts' default case: V4-Flash's MXFP4 experts at a decode batch (its alternate: the same with FP8 weights)
_MOE_EXPERTS_CASE = MappingProxyType(dict(format="mxfp4", fp8=None, E=256, H=4096, I=2048, tokens="decode", top_k=6))

OPS: tuple[OpSpec, ...] = (
    _spec("pack_store", "pack_store", "quantize bf16 K [N,512] into the 584-byte V4 paged cache at locations",
          fp8="e4m3fn", page_size=256, size="large"),
    _spec("dequant_gather", "pack_store", "read V4 cache rows back to bf16 [M,512] (sparse-prefill workspace)",
          fp8="e4m3fn", page_size=256, size="large"),
    _spec("sparse_attention_decode", "sparse_attention",
          "sparse MQA over the FP8 V4 cache: SWA + optional C4/C128 extra cache, sink",
          h_q=64, compress_ratio=4, fp8="e4m3fn", swa_page_size=256, extra_page_size=64, extra_width=512,
          extra_class="short", tokens="batch"),
    _spec("sparse_attention_prefill", "sparse_attention", "sparse MQA over a bf16 workspace by indices, sink",
          h_q=64, width=640),
    _spec("indexer_topk", "indexer_topk",
          "top-k (512/1024) of indexer scores with per-row lengths and the page transform",
          alternates=({"k": 512, "page_transform": True, "size": "small"},),  # decode at 32K context (S 8192)
          k=512, page_transform=True, size="large"),
    _spec("compress", "compress", "C4 (overlapping) and C128 compressors with RMSNorm and RoPE",
          ratio=4, hd=512, hadamard=False),
    _spec("compress_decode", "compress",
          "the compressors' decode form: ring-buffer state, one new token a request",
          ratio=4, hd=512, hadamard=False, ring=8),
    _spec("indexer_logits", "indexer_logits", "FP8 (132-byte rows) index scores, weighted ReLU over 64 heads",
          fp8="e4m3fn"),
    _spec("indexer_q_prep", "indexer_logits",
          "the indexer's q: RoPE, Hadamard and per-head FP8 quantization, the q scale folded into the head weights",
          fp8="e4m3fn", dtype="bfloat16"),
    _spec("indexer_store", "indexer_store",
          "quantize index keys [N,128] into 132-byte FP8 rows (amax or pow2 scale) at locations", fp8="e4m3fn",
          scale="amax"),
    _spec("moe_route", "moe", "sqrt-softplus routing with bias or hash table, top-6, renormalised, x1.5",
          hash=False, bias=True, E=256, top_k=6, tokens="decode"),
    _spec("moe_experts", "moe", "SwiGLU experts (clamp 10) with MXFP4 or FP8 128x128 block weights",
          alternates=({**_MOE_EXPERTS_CASE, "format": "fp8_block", "fp8": "e4m3fn"},), **_MOE_EXPERTS_CASE),
    _spec("fp8_linear", "linear",
          "dense x @ W^T with FP8 128x128-block weights and 1x128 FP8 activations (wq_a, wkv, wo_b, ...), bf16 out",
          fp8="e4m3fn", tokens="decode", partial_block=False),
    _spec("fp8_grouped_linear", "linear",
          "grouped x[:, g] @ W[g]^T, fp8_linear per group in one call (V4's wo_a, o viewed as [T, G, K]), bf16 out",
          fp8="e4m3fn", tokens="decode", partial_block=False),
    _spec("mhc_pre", "mhc", "hyper-connection pre-mix with 20 Sinkhorn iterations", hidden=4096, sinkhorn_iters=20),
    _spec("mhc_post", "mhc", "hyper-connection post-mix", hidden=4096),
    _spec("mhc_post_pre", "mhc", "sublayer boundary: post-mix of one sublayer and pre-mix of the next in one pass",
          hidden=4096, sinkhorn_iters=20),
    _spec("mhc_head", "mhc", "hyper-connection head: the 4 streams to one before the final norm", hidden=4096),
    _spec("offload_fetch", "offload",
          "make the C4 pool pages top-k selected resident in a GPU working set from host memory; remap the indices",
          host="pinned", page_size=64),
    _spec("build_attention_metadata", "attention_metadata",
          "per-query SWA/C4/C128 indices, lengths and output locations from page tables",
          index_topk=512, in_place=True),
)

OP_NAMES: tuple[str, ...] = tuple(o.name for o in OPS)
OPS_BY_NAME: Mapping[str, OpSpec] = MappingProxyType({o.name: o for o in OPS})
# the op modules in catalog order (each has a reference module and a conformance case module of the same name)
MODULES: tuple[str, ...] = tuple(dict.fromkeys(o.module for o in OPS))
