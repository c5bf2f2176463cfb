"""Contracts of the MoE ops (spec 5): argument validation and the case features kernels are selected on.

moe_route(router_logits, bias=None, top_k=6, routed_scaling_factor=1.5, hash_table=None, input_ids=None)
    -> (topk_ids int32 [T, k], topk_weights fp32 [T, k])
    Unchecked, a hash-table id outside [0, E) or an input id outside [0, vocab) is a dropped route (id -1,
    weight 0), never a read outside the table or the router's experts.
moe_experts(x, topk_ids, topk_weights, weights: PreparedWeights, swiglu_limit=10.0) -> bf16 [T, H]
    routed experts only; the caller adds the shared expert. `weights` come from
    platform.ops.moe_experts.prepare_weights(ExpertWeights): the kernel is chosen then, the weights are laid
    out for it, and calls run that kernel (weights prepared for another one are refused).

Validation never reads tensor contents unless checked=True (value checks synchronise with the device).
"""

from __future__ import annotations

import dataclasses
import math
from numbers import Real
from typing import Any

import torch

from dsv4hal.checks import (
    check_alloc,
    check_choice,
    check_finite,
    check_materializable,
    check_tensor,
    describe,
    show,
)
from dsv4hal.errors import InvalidArgumentError
from dsv4hal.formats.experts import EXPERT_FORMATS, ExpertWeights
from dsv4hal.formats.fp8 import FP8_FLAVORS, fp8_dtype
from dsv4hal.formats.mxfp4 import GROUP as MXFP4_GROUP
from dsv4hal.formats.mxfp4 import NAN_SCALE_BYTE
from dsv4hal.ops.buckets import MOE_TOKEN_CLASSES
from dsv4hal.ops.signatures import define
from dsv4hal.prepared import PreparedWeights

ROUTE_OP = "moe_route"
EXPERTS_OP = "moe_experts"
# token-count classes: T <= 8 is "few", T <= 64 "decode", larger "prefill". Kernels' speeds cross at these counts
# (bench/results/h200/bench-moe.json: Marlin leads triton_kernels up to T = 8, 227 against 323 us, and trails it from
# T = 16, 433 against 391 us), and a lock measures each class apart
FEW_MAX_TOKENS = 8
DECODE_MAX_TOKENS = 64
FP8_BLOCK = 128
INDEX_DTYPES = (torch.int32, torch.int64)


def token_class(num_tokens: int) -> str:
    if num_tokens <= FEW_MAX_TOKENS:
        return MOE_TOKEN_CLASSES[0]
    return MOE_TOKEN_CLASSES[1] if num_tokens <= DECODE_MAX_TOKENS else MOE_TOKEN_CLASSES[2]


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _check_positive(op: str, name: str, value: object, *, allow_inf: bool) -> float:
    ok = isinstance(value, Real) and not isinstance(value, bool) and value > 0 and not math.isnan(value)
    if not ok or (not allow_inf and math.isinf(value)):
        raise InvalidArgumentError(op, name, "a positive " + ("number" if allow_inf else "finite number"),
                                   show(value))
    return float(value)


def _check_upper_bound(op: str, name: str, idx: torch.Tensor, limit: int, *, allow_negative: bool) -> None:
    """Checked mode only: every index < limit, and >= 0 unless negatives are allowed (reads the tensor)."""
    if idx.numel() == 0:
        return
    bad = idx >= limit if allow_negative else (idx < 0) | (idx >= limit)
    if bool(bad.any()):
        first = int(idx[bad].flatten()[0])
        lower = "< 0 (ignored) or in [0" if allow_negative else "in [0"
        raise InvalidArgumentError(op, name, f"indices {lower}, {limit})", f"index {first}")


def _tensor(op: str, name: str, t: object, *, device: torch.device, **kw: Any) -> torch.Tensor:
    return check_tensor(op, name, t, device=device, **kw)


# ---------------------------------------------------------------- moe_route

def validate_moe_route(
    router_logits: object,
    bias: object = None,
    top_k: object = 6,
    routed_scaling_factor: object = 1.5,
    hash_table: object = None,
    input_ids: object = None,
    *,
    checked: bool = False,
) -> None:
    """Validate moe_route's arguments; raise InvalidArgumentError naming the first bad one.

    router_logits fp32 [T, E]; bias fp32 [E] or None; 1 <= top_k <= E; routed_scaling_factor finite > 0;
    hash_table int32 [vocab, top_k] and input_ids int32/int64 [T] together or not at all; one device.
    checked=True also reads values: finite logits and bias, hash-table ids in [0, E), input ids in [0, vocab).
    Unchecked, hash indices out of range drop routes (moe_route's docstring) instead of reading outside."""
    logits = check_tensor(ROUTE_OP, "router_logits", router_logits, dtype=torch.float32, shape=(None, None))
    t, e = logits.shape
    if bias is not None:
        _tensor(ROUTE_OP, "bias", bias, dtype=torch.float32, shape=(e,), device=logits.device)
    if not isinstance(top_k, int) or isinstance(top_k, bool) or not 1 <= top_k <= e:
        raise InvalidArgumentError(ROUTE_OP, "top_k", f"an int in [1, {e}] (E = {e})", show(top_k))
    _check_positive(ROUTE_OP, "routed_scaling_factor", routed_scaling_factor, allow_inf=False)
    if (hash_table is None) != (input_ids is None):
        given, missing = ("hash_table", "input_ids") if input_ids is None else ("input_ids", "hash_table")
        raise InvalidArgumentError(ROUTE_OP, missing, f"a tensor since {given} is given", "None",
                                   remedy="hash layers need both the token->expert table and the token ids")
    if hash_table is not None:
        _tensor(ROUTE_OP, "hash_table", hash_table, dtype=torch.int32, shape=(None, top_k), device=logits.device)
        _tensor(ROUTE_OP, "input_ids", input_ids, dtype=INDEX_DTYPES, shape=(t,), device=logits.device)
    k = hash_table.shape[1] if hash_table is not None else top_k
    # ids and weights; a strided (e.g. expand) logits view is copied dense by the kernels
    check_alloc(ROUTE_OP, "router_logits (output size)", t * (k * 8 + (0 if logits.is_contiguous() else e * 4)),
                logits.device)
    if checked:
        _check_route_values(logits, bias, hash_table, input_ids)


def _check_route_values(logits: torch.Tensor, bias: Any, hash_table: Any, input_ids: Any) -> None:
    check_finite(ROUTE_OP, "router_logits", logits)
    if bias is not None:
        check_finite(ROUTE_OP, "bias", bias)
    if hash_table is not None:
        _check_upper_bound(ROUTE_OP, "hash_table", hash_table, logits.shape[1], allow_negative=False)
        _check_upper_bound(ROUTE_OP, "input_ids", input_ids, hash_table.shape[0], allow_negative=False)


def case_moe_route(
    router_logits: torch.Tensor,
    bias: torch.Tensor | None = None,
    top_k: int = 6,
    routed_scaling_factor: float = 1.5,
    hash_table: torch.Tensor | None = None,
    input_ids: torch.Tensor | None = None,
) -> dict[str, Any]:
    """Hashable features of a moe_route call (what kernels declare support for)."""
    return {
        "hash": hash_table is not None,
        "bias": bias is not None and hash_table is None,
        "E": router_logits.shape[1],
        "top_k": hash_table.shape[1] if hash_table is not None else top_k,
        "tokens": token_class(router_logits.shape[0]),
    }


# ---------------------------------------------------------------- moe_experts

def _expected_weight_specs(w: ExpertWeights, e: int, h: int, i: int) -> dict[str, tuple[torch.dtype, tuple[int, ...]]]:
    """Dtype and shape of each ExpertWeights tensor for E experts, hidden h, intermediate i."""
    if w.format == "mxfp4":
        u8 = torch.uint8
        return {
            "w13": (u8, (e, 2 * i, h // 2)), "w13_scale": (u8, (e, 2 * i, h // MXFP4_GROUP)),
            "w2": (u8, (e, h, i // 2)), "w2_scale": (u8, (e, h, i // MXFP4_GROUP)),
        }
    q, f32, b = fp8_dtype(w.fp8), torch.float32, FP8_BLOCK
    return {
        "w13": (q, (e, 2 * i, h)), "w13_scale": (f32, (e, _ceil_div(2 * i, b), _ceil_div(h, b))),
        "w2": (q, (e, h, i)), "w2_scale": (f32, (e, _ceil_div(h, b), _ceil_div(i, b))),
    }


def _check_expert_weights(w: object, h: int, device: torch.device) -> ExpertWeights:
    if not isinstance(w, ExpertWeights):
        raise InvalidArgumentError(EXPERTS_OP, "weights", "an ExpertWeights", describe(w),
                                   remedy="build it with dsv4hal.quantize_experts")
    check_choice(EXPERTS_OP, "weights.format", w.format, EXPERT_FORMATS)
    check_choice(EXPERTS_OP, "weights.fp8", w.fp8, FP8_FLAVORS)
    w13 = check_tensor(EXPERTS_OP, "weights.w13", w.w13, shape=(None, None, None))
    e, two_i = w13.shape[:2]
    if e < 1 or two_i < 2 or two_i % 2:
        raise InvalidArgumentError(EXPERTS_OP, "weights.w13", "[E >= 1, 2I (even, > 0), *]", describe(w13))
    i = two_i // 2
    if w.format == "mxfp4":
        for name, k in (("x (hidden size H)", h), ("weights.w2 (intermediate size I)", i)):
            if k % MXFP4_GROUP:
                raise InvalidArgumentError(EXPERTS_OP, name, f"a reduction dim that is a multiple of {MXFP4_GROUP}"
                                           " (one MXFP4 scale a 32-group)", f"{k}")
    for name, (dtype, shape) in _expected_weight_specs(w, e, h, i).items():
        _tensor(EXPERTS_OP, f"weights.{name}", getattr(w, name), dtype=dtype, shape=shape, device=device)
    return w


def validate_expert_weights(weights: object, *, checked: bool = False) -> ExpertWeights:
    """Validate logical expert weights before they are prepared for a kernel (types first: the hidden size and
    device are read from w13; every tensor's device before checked mode reads values)."""
    if isinstance(weights, ExpertWeights):
        check_choice(EXPERTS_OP, "weights.format", weights.format, EXPERT_FORMATS)
        w13 = check_tensor(EXPERTS_OP, "weights.w13", weights.w13, shape=(None, None, None))
        h, device = int(w13.shape[2]) * (2 if weights.format == "mxfp4" else 1), w13.device
    else:
        h, device = 0, torch.device("cpu")  # _check_expert_weights refuses it
    w = _check_expert_weights(weights, h, device)
    fields = ("w13", "w13_scale", "w2", "w2_scale")
    # meta tensors hold no data: no kernel runs them and checked mode cannot read them
    check_materializable(EXPERTS_OP, [getattr(w, f) for f in fields], {}, [f"weights.{f}" for f in fields])
    if checked:
        _check_weight_values(w)
    return w


def case_expert_weights(weights: ExpertWeights, tokens: int | None = None) -> dict[str, Any]:
    """Features of the logical weights that fix the kernel (and so the layout), and the token class the weights
    are prepared for (`tokens` per call expected; None: one), as a call's case states it."""
    return {"format": weights.format, "fp8": weights.fp8 if weights.format == "fp8_block" else None,
            "E": weights.num_experts, "H": weights.hidden, "I": weights.intermediate,
            "tokens": token_class(1 if tokens is None else tokens)}


def _check_prepared(weights: object, h: int) -> PreparedWeights:
    if not isinstance(weights, PreparedWeights) or weights.op != EXPERTS_OP:
        raise InvalidArgumentError(
            EXPERTS_OP, "weights", "PreparedWeights made by platform.ops.moe_experts.prepare_weights",
            describe(weights),
            remedy="prepare the ExpertWeights once, before serving: prepared = platform.ops.moe_experts."
                   "prepare_weights(expert_weights)")
    if weights.case["H"] != h:
        raise InvalidArgumentError(EXPERTS_OP, "x", f"hidden size {weights.case['H']} (the weights')", f"{h}")
    return weights


def _check_payload_device(weights: PreparedWeights, device: torch.device) -> None:
    """Every tensor of the prepared payload (a dataclass for every kernel) sits on x's device (host attributes)."""
    payload = weights.payload
    names = [f.name for f in dataclasses.fields(payload)] if dataclasses.is_dataclass(payload) else []
    for name in names:
        t = getattr(payload, name)
        if isinstance(t, torch.Tensor) and t.device != device:
            raise InvalidArgumentError(EXPERTS_OP, "weights", f"weights prepared on x's device ({device})",
                                       f"weights.{name} on {t.device}",
                                       remedy="prepare the weights on the device the tokens use")


def validate_moe_experts(
    x: object,
    topk_ids: object,
    topk_weights: object,
    weights: object,
    swiglu_limit: object = 10.0,
    *,
    checked: bool = False,
) -> None:
    """Validate moe_experts' arguments; raise InvalidArgumentError naming the first bad one.

    x bf16 [T, H]; topk_ids int32 [T, k]; topk_weights fp32 [T, k]; weights an ExpertWeights whose tensors match
    its format for hidden H (mxfp4 also needs H % 32 == 0 and I % 32 == 0); swiglu_limit > 0 (inf disables
    the clamp); everything, the prepared weights included, on x's device. checked=True also reads values:
    ids < E, finite x and topk_weights, no NaN codes in the expert weights and finite fp8 block scales.

    Negative topk_ids: unlike the attention indices (where only -1 is "unused"), every negative id is a
    dropped route, as the reference and every MoE kernel document (expert parallelism maps experts owned by
    other ranks to negative ids); checked mode accepts them."""
    xt = check_tensor(EXPERTS_OP, "x", x, dtype=torch.bfloat16, shape=(None, None))
    t, h = xt.shape
    ids = _tensor(EXPERTS_OP, "topk_ids", topk_ids, dtype=torch.int32, shape=(t, None), device=xt.device)
    k = ids.shape[1]
    if k < 1:
        raise InvalidArgumentError(EXPERTS_OP, "topk_ids", "[T, k] with k >= 1", describe(ids))
    tw = _tensor(EXPERTS_OP, "topk_weights", topk_weights, dtype=torch.float32, shape=(t, k), device=xt.device)
    w = _check_prepared(weights, h)
    _check_payload_device(w, xt.device)
    _check_positive(EXPERTS_OP, "swiglu_limit", swiglu_limit, allow_inf=True)
    # output, a dense copy of x and the fp32 accumulator of the fused kernels
    check_alloc(EXPERTS_OP, "x (output size)", t * (h * 8 + k * 16), xt.device)
    if checked:
        _check_upper_bound(EXPERTS_OP, "topk_ids", ids, int(w.case["E"]), allow_negative=True)
        check_finite(EXPERTS_OP, "x", xt)
        check_finite(EXPERTS_OP, "topk_weights", tw)


def _fp8_nan_mask(q: torch.Tensor, flavor: str) -> torch.Tensor:
    """NaN codes: e4m3fn 0x7F/0xFF, e4m3fnuz 0x80 (fp8.py's table); compared on bytes to avoid an fp32 copy."""
    raw = q.view(torch.uint8)
    return (raw & 0x7F) == 0x7F if flavor == "e4m3fn" else raw == 0x80


def _check_weight_values(w: ExpertWeights) -> None:
    """Checked mode: loops over experts so a full-size layer never needs a second full-size temporary."""
    for name in ("w13", "w2"):
        q, scale = getattr(w, name), getattr(w, f"{name}_scale")
        for e in range(w.num_experts):
            if w.format == "mxfp4":
                bad = bool((scale[e] == NAN_SCALE_BYTE).any())
                what = f"scale byte 0x{NAN_SCALE_BYTE:X} (E8M0 NaN) in expert {e}"
            else:
                bad = bool(_fp8_nan_mask(q[e], w.fp8).any()) or not bool(torch.isfinite(scale[e]).all())
                what = f"a NaN FP8 code or non-finite block scale in expert {e}"
            if bad:
                raise InvalidArgumentError(EXPERTS_OP, f"weights.{name}", "finite expert weights", what,
                                           remedy="re-quantize the checkpoint tensor; its source held NaN or inf")


def case_moe_experts(
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    weights: PreparedWeights,
    swiglu_limit: float = 10.0,
) -> dict[str, Any]:
    """Hashable features of a moe_experts call (what kernels declare support for)."""
    return {**weights.case, "top_k": topk_ids.shape[1], "tokens": token_class(x.shape[0])}


def fake_moe_route(router_logits, bias=None, top_k=6, routed_scaling_factor=1.5, hash_table=None,  # noqa: ANN001
                   input_ids=None) -> tuple[torch.Tensor, torch.Tensor]:  # noqa: ANN001
    """The outputs' shapes and dtypes (under torch.compile)."""
    k = top_k if hash_table is None else hash_table.shape[1]
    t = router_logits.shape[0]
    return router_logits.new_empty(t, k, dtype=torch.int32), router_logits.new_empty(t, k)


def fake_moe_experts(x, topk_ids, topk_weights, weights, swiglu_limit=10.0) -> torch.Tensor:  # noqa: ANN001
    """The output's shape and dtype (under torch.compile)."""
    return x.new_empty(x.shape)


@define(validate=validate_moe_route, case=case_moe_route, fake=fake_moe_route)
def moe_route(router_logits: torch.Tensor, bias: torch.Tensor | None = None, top_k: int = 6,
              routed_scaling_factor: float = 1.5, hash_table: torch.Tensor | None = None,
              input_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """V4's router: sqrt(softplus(logits)) scores, top-k chosen on score + bias (or read from a hash table for
    hash layers), weights renormalised and times routed_scaling_factor.

    Arguments:
        router_logits: (T, E), torch.float32.
        bias: (E,), torch.float32, the selection bias; or None.
        top_k: an int in [1, E] (6 in V4).
        routed_scaling_factor: a positive finite float (1.5 in V4).
        hash_table: (vocab, top_k), torch.int32, expert ids per token id (hash layers); None with input_ids None.
            Unchecked, an id outside [0, E) (-1 included) is a dropped route: id -1, weight 0.
        input_ids: (T,), torch.int32 or torch.int64; given iff hash_table is. Unchecked, one outside [0, vocab)
            (-1 included) reads no table row: all its token's routes are dropped (ids -1, weights 0).

    Returns:
        topk_ids: (T, k), torch.int32; topk_weights: (T, k), torch.float32 (k = hash_table's width or top_k).
        Dropped routes (unchecked hash indices) have id -1 (moe_experts skips negative ids) and weight 0; the
        token's kept weights are renormalised among themselves; a token with none kept has weights 0, not NaN.

    Rejected (InvalidArgumentError): other dtypes, shapes or devices, top_k outside [1, E], only one of
    hash_table/input_ids. Checked mode also refuses non-finite logits or bias and out-of-range table entries
    and input ids.
    """


@define(validate=validate_moe_experts, case=case_moe_experts, fake=fake_moe_experts,
        weights=("weights", validate_expert_weights, case_expert_weights))
def moe_experts(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, weights: PreparedWeights,
                swiglu_limit: float = 10.0) -> torch.Tensor:
    """The routed experts: SwiGLU (clamped at swiglu_limit) MLPs with MXFP4 or FP8 128x128 block weights, summed
    with the routing weights. The caller adds the shared expert.

    Arguments:
        x: (T, H), torch.bfloat16.
        topk_ids: (T, k), torch.int32, k >= 1: expert ids; every negative id is a dropped route (expert
            parallelism).
        topk_weights: (T, k), torch.float32.
        weights: PreparedWeights from platform.ops.moe_experts.prepare_weights(ExpertWeights), on x's device: the
            kernel was chosen then, and these calls run it.
        swiglu_limit: a positive float (inf disables the clamp).

    Returns:
        (T, H), torch.bfloat16. A token whose x holds a NaN gets a NaN row (one with a routed expert), as the
        reference: kernels that quantize activations carry it as FP8's NaN (conformance cases "nan-token").

    Rejected: InvalidArgumentError for other dtypes, shapes or devices, unprepared weights or a hidden size other
    than the weights'; PreparedWeightsMismatchError for weights prepared on another platform or for another
    kernel than a forced one. Checked mode also refuses ids >= E and non-finite x or topk_weights.
    """
