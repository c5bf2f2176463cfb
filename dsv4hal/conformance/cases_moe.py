"""Conformance catalog of `moe_route` and `moe_experts` (contracts in dsv4hal.ops.moe).

The oracles here are float64 and share no code with dsv4hal.reference.moe:
  * moe_route: sqrt(softplus) by a log1p formula, selection by a stable descending sort. The comparison accepts any
    valid top-k set (a kernel may order the k ids differently, or swap experts whose biased scores tie within the
    tolerance) and then checks the weights against the oracle's formula evaluated at the ids the kernel chose.
  * moe_experts: per expert, the (token, slot) pairs routed to it are merged into one coefficient per token and the
    clamped SwiGLU is evaluated in float64 on the expert's weights. Those weights are the formats' dequantization of
    what quantize produced from random fp32 master weights: the exact values every kernel sees, so the oracle
    carries no quantization error of its own.

Inputs are drawn from `gen` on its device (use a generator on the GPU for the full-size gpu_only cases: the
V4-Pro layer has 25e9 weights) and then placed on `device`.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import torch

from dsv4hal.conformance.types import CaseSpec, Fixture, Tolerance, builder_for, compare_close
from dsv4hal.reference.moe import ExpertWeights, dequantize_expert, quantize_experts

OP_ROUTE = "moe_route"
OP_EXPERTS = "moe_experts"

TOLERANCES: dict[str, Tolerance] = {
    OP_ROUTE: Tolerance(
        1e-5, 1e-4,
        "fp32 softplus/sqrt/normalisation: kernels use fast exp/log intrinsics that differ from float64 by a few "
        "ulps; 1e-4 relative leaves room for that and still catches any wrong expert or formula. An expert may "
        "be swapped for another only when their biased scores tie within the same tolerance",
    ),
    OP_EXPERTS: Tolerance(
        0.5, 5e-2,
        "atol is a fraction of the output RMS (the fixture scales it). Production paths quantize activations "
        "(DeepGEMM/aiter FP8 1x128, FlashInfer MXFP8). Emulating both on the full-size cases on an H200 gave a "
        "relative L2 error of 4.3-4.7% (6.5% with the clamp active) and a worst element of 0.24-0.30 x RMS, "
        "up to 2.9e7 outputs (V4-Pro, T=4096); the reference and emulated bf16-activation paths (Marlin W4A16) "
        "measure 0.17% and 0.02 x RMS. The relative L2 bound below keeps the loose per-element bound from hiding "
        "systematic errors: a wrong expert, nibble order, gate/up order, routing "
        "weight or missing clamp errs by 30-150% of the RMS",
    ),
}
# Besides the elementwise bound the relative L2 error over the whole output must stay below this
# (fp8-activation emulation: at most 6.5%; reference and bf16 paths: 0.17%).
EXPERTS_REL_L2 = 0.1

# Model shapes: (E, H, I). "mini" ones keep V4's top-6 and ratios but fit a CPU test.
SHAPES: dict[str, tuple[int, int, int]] = {
    "flash-mini": (16, 256, 128),
    "pro-mini": (24, 384, 192),
    "flash": (256, 4096, 2048),
    "pro": (384, 7168, 3072),
}
TOP_K = 6
VOCAB = {"mini": 1000, "full": 129280}
CPU_TOKENS = (1, 8, 64)
GPU_TOKENS = (1, 8, 64, 512, 4096)
FORMATS = ("mxfp4", "fp8_block")
CLAMP_GAIN = 20.0  # scales w13 so |g|, |u| ~ N(0, 20): most pre-activations exceed the limit of 10
BIAS_STD = 0.2  # comparable to the spread of sqrt(softplus(N(0,1))), so the bias changes selections
MASKED_FRACTION = 0.3
NAN_TOKENS = ((3, 17), (5, 200))  # (token, column) of x set to NaN in the nan-token cases


def _shape_kind(shape: str) -> str:
    return "mini" if shape.endswith("-mini") else "full"


def _route_cases() -> list[CaseSpec]:
    cases = []
    for shape, tokens, gpu in [(s, CPU_TOKENS, False) for s in ("flash-mini", "pro-mini")] + [
        (s, GPU_TOKENS, True) for s in ("flash", "pro")
    ]:
        e = SHAPES[shape][0]
        for t in tokens:
            for routing in ("bias", "hash"):
                params = {"E": e, "T": t, "top_k": TOP_K, "routing": routing, "vocab": VOCAB[_shape_kind(shape)]}
                cases.append(CaseSpec(OP_ROUTE, f"{shape}-{routing}-T{t}", params, gpu_only=gpu))
    for shape in ("flash", "pro"):
        # Real expert counts are cheap for routing alone; these run on the CPU too.
        params = {"E": SHAPES[shape][0], "T": 64, "top_k": TOP_K, "routing": "bias", "vocab": VOCAB["full"]}
        cases.append(CaseSpec(OP_ROUTE, f"{shape}-bias-T64-cpu", params))
    cases.append(CaseSpec(OP_ROUTE, "flash-mini-nobias-T8",
                          {"E": 16, "T": 8, "top_k": TOP_K, "routing": "plain", "vocab": VOCAB["mini"]}))
    return cases


def _experts_params(shape: str, t: int, fmt: str, **extra: Any) -> dict[str, Any]:
    e, h, i = SHAPES[shape]
    params = {"E": e, "H": h, "I": i, "T": t, "top_k": TOP_K, "format": fmt, "fp8": "e4m3fn",
              "pow2_scales": False, "w13_gain": 1.0, "masked_fraction": 0.0, "swiglu_limit": 10.0}
    params.update(extra)
    return params


def _experts_cases() -> list[CaseSpec]:
    cases = []
    for shape, tokens, gpu in [(s, CPU_TOKENS, False) for s in ("flash-mini", "pro-mini")] + [
        (s, GPU_TOKENS, True) for s in ("flash", "pro")
    ]:
        for fmt in FORMATS:
            for t in tokens:
                cases.append(CaseSpec(OP_EXPERTS, f"{shape}-{fmt}-T{t}", _experts_params(shape, t, fmt), gpu_only=gpu))
    for fmt in FORMATS:
        cases.append(CaseSpec(OP_EXPERTS, f"flash-mini-{fmt}-T8-clamp",
                              _experts_params("flash-mini", 8, fmt, w13_gain=CLAMP_GAIN)))
        cases.append(CaseSpec(OP_EXPERTS, f"flash-mini-{fmt}-T64-epmask",
                              _experts_params("flash-mini", 64, fmt, masked_fraction=MASKED_FRACTION)))
        # every negative id is a dropped route (the contract), not only -1: other ranks' experts as any negative
        cases.append(CaseSpec(OP_EXPERTS, f"flash-mini-{fmt}-T64-epmask-any-negative",
                              _experts_params("flash-mini", 64, fmt, masked_fraction=MASKED_FRACTION,
                                              dropped_ids="any-negative")))
    cases.append(CaseSpec(OP_EXPERTS, "flash-mini-fp8_block-e4m3fnuz-T8",
                          _experts_params("flash-mini", 8, "fp8_block", fp8="e4m3fnuz")))
    # just past the decode class (ops.moe.DECODE_MAX_TOKENS): weights prepared for prefill, every format and flavour
    for fmt, fp8 in (("mxfp4", "e4m3fn"), ("fp8_block", "e4m3fn"), ("fp8_block", "e4m3fnuz")):
        flavour = "-e4m3fnuz" if fp8 == "e4m3fnuz" else ""
        cases.append(CaseSpec(OP_EXPERTS, f"flash-mini-{fmt}{flavour}-T80-prefill",
                              _experts_params("flash-mini", 80, fmt, fp8=fp8)))
    cases.append(CaseSpec(OP_EXPERTS, "flash-mini-fp8_block-ue8m0-T8",
                          _experts_params("flash-mini", 8, "fp8_block", pow2_scales=True)))
    cases.append(CaseSpec(OP_EXPERTS, "flash-clamp-mxfp4-T64",
                          _experts_params("flash", 64, "mxfp4", w13_gain=CLAMP_GAIN), gpu_only=True))
    # a NaN in a token's activations is that token's NaN output row, never a finite one: FP8 paths quantize rows
    # with a max that skips NaNs, so the NaN must be carried as FP8's NaN (decode, prefill, the full-size prefill's
    # per-token gather pass)
    for fmt in FORMATS:
        for t in (8, 80):
            cases.append(CaseSpec(OP_EXPERTS, f"flash-mini-{fmt}-T{t}-nan-token",
                                  _experts_params("flash-mini", t, fmt, nan_tokens=NAN_TOKENS)))
    cases.append(CaseSpec(OP_EXPERTS, "flash-fp8_block-T4096-nan-token",
                          _experts_params("flash", 4096, "fp8_block", nan_tokens=NAN_TOKENS), gpu_only=True))
    return cases


CASES_ROUTE: list[CaseSpec] = _route_cases()
CASES_EXPERTS: list[CaseSpec] = _experts_cases()
# both ops' cases; not named CASES*: the runner collects every CASES* list of a catalog module
ALL_CASES: list[CaseSpec] = CASES_ROUTE + CASES_EXPERTS


# ----- random inputs ------------------------------------------------------------------------------------


def _randn(gen: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=gen, device=gen.device)


def _rand(gen: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.rand(*shape, generator=gen, device=gen.device)


def _distinct_ids(gen: torch.Generator, t: int, e: int, k: int) -> torch.Tensor:
    """k distinct experts per token, uniformly at random: int64 [t, k]."""
    return _rand(gen, t, e).argsort(dim=1)[:, :k]


# ----- moe_route ----------------------------------------------------------------------------------------


def oracle_route_scores(logits: torch.Tensor) -> torch.Tensor:
    """sqrt(softplus(x)) in float64, softplus as max(x, 0) + log1p(exp(-|x|)) (no overflow)."""
    x = logits.double()
    return (x.clamp_min(0) + torch.log1p(torch.exp(-x.abs()))).sqrt()


def _build_route(spec: CaseSpec, device: torch.device, gen: torch.Generator) -> Fixture:
    p = spec.params
    t, e, k = p["T"], p["E"], p["top_k"]
    logits = _randn(gen, t, e)
    bias = _randn(gen, e) * BIAS_STD if p["routing"] == "bias" else None
    args: dict[str, Any] = {"router_logits": logits, "bias": bias, "top_k": k, "routed_scaling_factor": 1.5}
    if p["routing"] == "hash":
        args["hash_table"] = _distinct_ids(gen, p["vocab"], e, k).to(torch.int32)
        args["input_ids"] = torch.randint(0, p["vocab"], (t,), generator=gen, device=gen.device)
    args = {n: v.to(device) if isinstance(v, torch.Tensor) else v for n, v in args.items()}
    expected = _oracle_route(**args)
    tol = TOLERANCES[OP_ROUTE]
    return Fixture(args=args, expected=expected, compare=functools.partial(compare_route, tol=tol), tolerance=tol)


def _oracle_route(
    router_logits: torch.Tensor, bias: torch.Tensor | None, top_k: int, routed_scaling_factor: float,
    hash_table: torch.Tensor | None = None, input_ids: torch.Tensor | None = None,
) -> dict[str, Any]:
    """Everything compare_route needs, in float64 on the CPU."""
    scores = oracle_route_scores(router_logits).cpu()
    biased = scores if bias is None or hash_table is not None else scores + bias.double().cpu()
    if hash_table is not None:
        ids = hash_table.cpu().long()[input_ids.cpu().long()]
    else:
        ids = torch.sort(biased, dim=1, descending=True, stable=True).indices[:, :top_k]
    chosen = scores.gather(1, ids)
    return {
        "ids": ids, "weights": chosen / chosen.sum(1, keepdim=True) * routed_scaling_factor,
        "scores": scores, "biased": biased, "hash": hash_table is not None, "scale": routed_scaling_factor,
    }


def _route_ids_problem(ids: torch.Tensor, expected: dict[str, Any], tol: Tolerance) -> str:
    """Why the chosen ids are not an acceptable top-k ('' if they are)."""
    want = expected["ids"]
    if ids.shape != want.shape or ids.dtype not in (torch.int32, torch.int64):
        return f"ids: expected an int32 tensor of shape {tuple(want.shape)}, got {ids.dtype} {tuple(ids.shape)}"
    e = expected["scores"].shape[1]
    if bool(((ids < 0) | (ids >= e)).any()):
        return f"ids out of [0, {e})"
    got_sorted = ids.sort(dim=1).values
    if bool((got_sorted[:, 1:] == got_sorted[:, :-1]).any()):
        return "an expert is chosen twice for one token"
    if expected["hash"]:
        bad = (got_sorted != want.sort(dim=1).values).any(1)
        return f"token {int(bad.nonzero()[0])}: ids differ from the hash table" if bool(bad.any()) else ""
    # A valid top-k: every chosen expert scores at least the k-th best, up to the tolerance.
    kth = expected["biased"].gather(1, want).min(dim=1, keepdim=True).values
    slack = tol.atol + tol.rtol * kth.abs()
    bad = (expected["biased"].gather(1, ids) < kth - slack).any(1)
    return f"token {int(bad.nonzero()[0])}: an expert outside the top-k was chosen" if bool(bad.any()) else ""


def compare_route(got: Any, expected: dict[str, Any], tol: Tolerance) -> tuple[float, bool, str]:
    """got = (topk_ids, topk_weights). Ids as a set per token; weights against the oracle at the chosen ids."""
    try:
        ids, weights = got
    except (TypeError, ValueError):
        return float("inf"), False, f"expected (topk_ids, topk_weights), got {type(got).__name__}"
    ids = ids.detach().cpu()
    problem = _route_ids_problem(ids, expected, tol)
    if problem:
        return float("inf"), False, problem
    chosen = expected["scores"].gather(1, ids.long())
    want = chosen / chosen.sum(1, keepdim=True) * expected["scale"]
    return compare_close(weights, want, tol)


# ----- moe_experts --------------------------------------------------------------------------------------


def oracle_moe_experts(
    x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, weights: ExpertWeights,
    swiglu_limit: float,
) -> torch.Tensor:
    """float64 [T, H] on x's device: sum over slots of w * clamped-SwiGLU expert, from the dequantized weights."""
    x64 = x.double()
    ids = topk_ids.long()
    w64 = topk_weights.double()
    i = weights.intermediate
    out = torch.zeros(x.shape, dtype=torch.float64, device=x.device)
    for e in torch.unique(ids[ids >= 0]).tolist():
        match = ids == e
        rows = match.any(dim=1).nonzero().squeeze(1)
        coef = (w64 * match).sum(dim=1)[rows]  # a token routed twice to e gets both weights
        w13, w2 = (w.double() for w in dequantize_expert(weights, e))
        gate = (x64[rows] @ w13[:i].T).clamp(max=swiglu_limit)
        up = (x64[rows] @ w13[i:].T).clamp(-swiglu_limit, swiglu_limit)
        act = gate / (1.0 + torch.exp(-gate)) * up
        out[rows] += coef.unsqueeze(1) * (act @ w2.T)
    return out


def _expert_weights(p: dict[str, Any], device: torch.device, gen: torch.Generator) -> ExpertWeights:
    """Random master weights (g, u ~ N(0, gain^2) for unit x) quantized in chunks of experts, so a full-size
    layer never exists in fp32 all at once."""
    e, h, i = p["E"], p["H"], p["I"]
    chunk = max(1, (1 << 28) // (3 * h * i))
    parts: ExpertWeights | None = None
    for start in range(0, e, chunk):
        n = min(chunk, e - start)
        w13 = _randn(gen, n, 2 * i, h) * (p["w13_gain"] / math.sqrt(h))
        w2 = _randn(gen, n, h, i) / math.sqrt(i)
        q = quantize_experts(w13, w2, p["format"], p["fp8"], pow2_scales=p["pow2_scales"])
        if parts is None:
            parts = ExpertWeights(p["format"], *(_alloc(getattr(q, f), e, device) for f in _FIELDS), fp8=p["fp8"])
        for f in _FIELDS:
            getattr(parts, f)[start:start + n].copy_(getattr(q, f))
    assert parts is not None
    return parts


_FIELDS = ("w13", "w13_scale", "w2", "w2_scale")


def _alloc(like: torch.Tensor, e: int, device: torch.device) -> torch.Tensor:
    return torch.empty((e, *like.shape[1:]), dtype=like.dtype, device=device)


def _routing(p: dict[str, Any], gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Distinct random experts per token and positive weights summing to 1.5, some slots masked to -1."""
    t, e, k = p["T"], p["E"], p["top_k"]
    ids = _distinct_ids(gen, t, e, k)
    raw = _rand(gen, t, k) + 0.5
    weights = raw / raw.sum(1, keepdim=True) * 1.5
    if p["masked_fraction"]:
        dropped = torch.full_like(ids, -1)
        if p.get("dropped_ids") == "any-negative":  # -1, -2, -E and int32's minimum, in turn
            choices = torch.tensor([-1, -2, -e, -(2**31)], dtype=ids.dtype)
            dropped = choices[torch.arange(ids.numel()).view(ids.shape) % 4]
        ids = torch.where(_rand(gen, t, k) < p["masked_fraction"], dropped, ids)
    return ids.to(torch.int32), weights


def compare_experts(got: Any, expected: torch.Tensor, tol: Tolerance) -> tuple[float, bool, str]:
    """Elementwise atol + rtol*|expected| (tol already scaled to this output), plus a relative L2 bound."""
    err, ok, detail = compare_close(got, expected, tol)
    if not ok:
        return err, ok, detail
    diff = got.detach().cpu().double() - expected.cpu()
    rel = float(diff.norm() / expected.cpu().norm().clamp_min(1e-30))
    if rel > EXPERTS_REL_L2:
        return err, False, f"relative L2 error {rel:.3g} over {EXPERTS_REL_L2}"
    return err, True, ""


def compare_experts_nan_rows(got: Any, expected: torch.Tensor, tol: Tolerance) -> tuple[float, bool, str]:
    """The output's NaNs exactly where the oracle's are (the rows of tokens with a NaN input), compare_experts on
    the other rows."""
    want_nan, got_nan = expected.isnan().cpu(), got.detach().isnan().cpu()
    if not torch.equal(want_nan, got_nan):
        want_rows = want_nan.any(1).nonzero()[:, 0].tolist()
        got_rows = got_nan.any(1).nonzero()[:, 0].tolist()
        return float("nan"), False, (f"NaN rows {got_rows} ({int(got_nan.sum())} NaNs), expected every element of rows "
                                     f"{want_rows} (the tokens with a NaN input) and nothing else")
    keep = ~want_nan.any(1)
    return compare_experts(got[keep.to(got.device)], expected[keep], tol)


def _build_experts(spec: CaseSpec, device: torch.device, gen: torch.Generator) -> Fixture:
    p = dict(spec.params)
    weights = _expert_weights(p, device, gen)
    x = _randn(gen, p["T"], p["H"]).to(torch.bfloat16).to(device)
    for token, col in p.get("nan_tokens", ()):
        x[token, col] = float("nan")
    ids, topk_weights = (v.to(device) for v in _routing(p, gen))
    limit = p["swiglu_limit"]
    expected = oracle_moe_experts(x, ids, topk_weights, weights, limit)
    finite = expected[~expected.isnan().any(1)]
    # Errors of a correct kernel scale with the output's magnitude; so does the absolute tolerance.
    rms = float(finite.pow(2).mean().sqrt()) if finite.numel() else 0.0
    base = TOLERANCES[OP_EXPERTS]
    tol = Tolerance(base.atol * max(rms, 1e-6), base.rtol, f"{base.reason} (output RMS {rms:.3g})")
    compare = compare_experts_nan_rows if p.get("nan_tokens") else compare_experts
    return Fixture(
        args={"x": x, "topk_ids": ids, "topk_weights": topk_weights, "weights": weights, "swiglu_limit": limit},
        expected=expected,
        compare=functools.partial(compare, tol=tol),
        tolerance=tol,
    )


_BUILDERS = {OP_ROUTE: _build_route, OP_EXPERTS: _build_experts}


def build(spec: CaseSpec, device: torch.device, gen: torch.Generator) -> Fixture:
    """Fixture for one case; inputs drawn from `gen` (on gen's device), then placed on `device`."""
    builder = builder_for("cases_moe", _BUILDERS, spec)
    device = torch.device(device)
    if spec.gpu_only and device.type != "cpu" and gen.device.type == "cpu":
        # full-size layers (V4-Pro: 25e9 weights) are drawn on the device: a CPU generator takes minutes
        seed = int(torch.randint(0, 1 << 62, (1,), generator=gen))
        gen = torch.Generator(device).manual_seed(seed)
    return builder(spec, device, gen)
