"""Shape buckets: the case features `dsv4hal tune` measures separately, per op, with representative inputs.

A bucket is a projection of an op's case (the dict its contract's case function returns, or for an op with
weights the weights' case, which is what selection sees when the weights are prepared) onto the op's bucket
features. Selection only ever sees that case, so a bucket can never be finer than it: two shapes in one
case class (topk at 1 x 256K and 64 x 256K are both size=large) share a bucket, and a GPU bucket lists
several samples whose times are combined (geometric mean).

Samples are parameter dicts for the op's conformance builder (dsv4hal.conformance.cases_<catalog>.build), so
tune times exactly the inputs conformance checks; "$fp8" stands for the machine's FP8 flavour. The fp8
flavour is deliberately not a bucket feature: a machine has one, and a case of the other flavour maps to
the same bucket (the locked kernel must then accept it, or selection refuses the lock loudly).

Ops declared here with buckets get small CPU samples and production-sized GPU samples. Ops declared with
features only get their samples from their conformance cases (tune groups them by bucket: on the CPU the
first small case, on a GPU up to three full-size ones). An op without a declaration (a new op) is treated
the same way, keyed on all its case features. Model dimensions (hidden size, expert count) are left out of
the features on purpose: a machine serves one model, and the CPU's small conformance shapes must map to
the same buckets as production ones. Importing this module is cheap: no torch."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

FP8 = "$fp8"  # replaced by the machine's FP8 flavour when the sample is built
# The token classes of the case features named "tokens" (here, torch-free, for the CLI's --case parsing): the MoE
# ops' (dsv4hal.ops.moe.token_class) and sparse_attention_decode's: one query row, up to 64, more
# (dsv4hal.ops.sparse_attention.decode_token_class)
MOE_TOKEN_CLASSES = ("few", "decode", "prefill")
DECODE_TOKEN_CLASSES = ("single", "batch", "wide")


@dataclass(frozen=True)
class Bucket:
    op: str
    key: Mapping[str, object]  # the op's bucket features -> values
    cpu: tuple[Mapping[str, Any], ...]  # conformance-builder params timed on the CPU (small)
    gpu: tuple[Mapping[str, Any], ...]  # the same on a GPU (production sizes)

    @property
    def label(self) -> str:
        return bucket_label(self.key)


@dataclass(frozen=True)
class OpBuckets:
    op: str
    catalog: str  # dsv4hal.conformance.cases_<catalog> builds the samples
    features: tuple[str, ...]
    buckets: tuple[Bucket, ...] = ()  # empty: samples come from the op's conformance cases


def bucket_label(key: Mapping[str, object]) -> str:
    """The canonical text of a bucket (the key of the lock's table): sorted feature=value pairs."""
    return ",".join(f"{k}={v}" for k, v in sorted(key.items())) or "(any case)"


def bucket_of(op: str, case: Mapping[str, object]) -> str:
    """The bucket label of a case: its projection on the op's declared features (all features when the op
    declares none). Cheap: it runs once per case class when a lock is in force."""
    decl = DECLARED.get(op)
    if decl is None:
        return bucket_label(case)
    return bucket_label({f: case.get(f) for f in decl.features})


def missing_features(op: str, case: Mapping[str, object]) -> list[str]:
    """Bucket features a case does not state (the catalog's typical cases are partial for some ops): the lock
    decides full cases, those of real calls."""
    decl = DECLARED.get(op)
    return [] if decl is None else [f for f in decl.features if f not in case]


def _ro(d: Mapping[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(dict(d))


def _topk() -> OpBuckets:
    # size: "large" when the score width exceeds 16384 (dsv4hal.ops.indexer_topk.case)
    cpu_shape = {"small": ((4, 4096),), "large": ((1, 20000),)}
    gpu_shape = {"small": ((1, 8192), (64, 8192)), "large": ((1, 262144), (8, 65536), (64, 262144))}
    buckets = []
    for k in (512, 1024):
        for pt in (True, False):
            for size in ("small", "large"):
                def params(shapes: tuple[tuple[int, int], ...], k: int = k, pt: bool = pt) -> tuple:
                    return tuple(_ro({"k": k, "b": b, "s": s, "lengths": "full", "page_table": pt}) for b, s in shapes)
                buckets.append(Bucket("indexer_topk", _ro({"k": k, "page_transform": pt, "size": size}),
                                      params(cpu_shape[size]), params(gpu_shape[size])))
    return OpBuckets("indexer_topk", "indexer_topk", ("k", "page_transform", "size"), tuple(buckets))


def _cache_op(op: str) -> OpBuckets:
    # page sizes of the SWA (256), C4 (64) and C128 (2) pools (dsv4hal.formats.v4_cache.PAGE_SIZE_BY_RATIO);
    # size: "large" from 4096 rows (dsv4hal.ops.pack_store.LARGE_N): prefill chunks; "small": decode batches
    cpu_rows = {"small": (64,), "large": (4096,)}
    gpu_rows = {"small": (1, 64), "large": (4096, 32768)}
    buckets = []
    for page_size in (256, 64, 2):
        for size in ("small", "large"):
            def params(rows: tuple[int, ...], p: int = page_size) -> tuple:
                return tuple(_ro({"page_size": p, "fp8": FP8, "n": n, "kind": "random", "loc_dtype": "int64",
                                  "prefill": "zeros"}) for n in rows)
            buckets.append(Bucket(op, _ro({"page_size": page_size, "size": size}), params(cpu_rows[size]),
                                  params(gpu_rows[size])))
    return OpBuckets(op, "pack_store", ("page_size", "size"), tuple(buckets))


DECLARED: Mapping[str, OpBuckets] = MappingProxyType({b.op: b for b in (
    _topk(), _cache_op("pack_store"), _cache_op("dequant_gather"),
    # features only: samples from the conformance cases
    # width and token classes, not exact values (dsv4hal.ops.sparse_attention.EXTRA_SHORT_MAX says why)
    OpBuckets("sparse_attention_decode", "sparse_attention", ("compress_ratio", "extra_class", "h_q", "tokens")),
    OpBuckets("sparse_attention_prefill", "sparse_attention", ("h_q",)),
    OpBuckets("moe_route", "moe", ("hash", "tokens")),
    # the weights' case, decided at prepare_weights: tokens is the class the weights are prepared for
    OpBuckets("moe_experts", "moe", ("format", "fp8", "tokens")),
    # the token class orders the GEMMs (decode reads the weight once, prefill is compute); a partial last weight
    # block is a bucket apart, as DeepGEMM's binding refuses it
    OpBuckets("fp8_linear", "linear", ("tokens", "partial_block")),
    OpBuckets("fp8_grouped_linear", "linear", ("tokens", "partial_block")),  # the same for every group at once
    OpBuckets("mhc_pre", "mhc", ("sinkhorn_iters",)),
    OpBuckets("mhc_post", "mhc", ()),
    OpBuckets("mhc_post_pre", "mhc", ("sinkhorn_iters",)),
    OpBuckets("mhc_head", "mhc", ()),
)})
