"""MoE reference (routing, experts), contracts and the conformance catalog."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

import dsv4hal
from dsv4hal.conformance import cases_moe
from dsv4hal.errors import InvalidArgumentError
from dsv4hal.ops.moe import (
    case_moe_experts,
    case_moe_route,
    validate_expert_weights,
    validate_moe_experts,
    validate_moe_route,
)
from dsv4hal.reference.moe import (
    ExpertWeights,
    dequantize_experts,
    moe_experts,
    moe_route,
    quantize_experts,
    shared_expert,
)


def _sqrt_softplus(v: float) -> float:
    return math.sqrt(math.log1p(math.exp(v)))


def _random_experts(fmt: str, e: int = 5, h: int = 64, i: int = 32, seed: int = 0, **kw) -> ExpertWeights:
    gen = torch.Generator().manual_seed(seed)
    w13 = torch.randn(e, 2 * i, h, generator=gen) / math.sqrt(h)
    w2 = torch.randn(e, h, i, generator=gen) / math.sqrt(i)
    return quantize_experts(w13, w2, fmt, **kw)


def _dense_loop(x, ids, weights, ew: ExpertWeights, limit: float) -> torch.Tensor:
    """Token-by-token, slot-by-slot float64 evaluation (test oracle; loops are fine at these sizes)."""
    w13, w2 = (w.double() for w in dequantize_experts(ew))
    i = ew.intermediate
    out = torch.zeros(x.shape, dtype=torch.float64)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            if e < 0:
                continue
            g = (w13[e, :i] @ x[t].double()).clamp(max=limit)
            u = (w13[e, i:] @ x[t].double()).clamp(-limit, limit)
            out[t] += float(weights[t, j]) * (w2[e] @ (torch.nn.functional.silu(g) * u))
    return out


# ----- routing ------------------------------------------------------------------------------------------


def test_route_hand_example():
    """moe_route picks the top-k logits and weights them by normalised sqrt-softplus."""
    logits = torch.tensor([[0.0, 1.0, 2.0, -1.0]])
    ids, w = moe_route(logits, top_k=2)
    assert ids.dtype == torch.int32 and w.dtype == torch.float32
    assert ids.tolist() == [[2, 1]]
    s2, s1 = _sqrt_softplus(2.0), _sqrt_softplus(1.0)
    assert w[0].tolist() == pytest.approx([1.5 * s2 / (s1 + s2), 1.5 * s1 / (s1 + s2)], rel=1e-6)
    assert float(w.sum()) == pytest.approx(1.5, rel=1e-6)


def test_bias_changes_selection_not_weights():
    """The routing bias changes which experts are chosen but not their weights."""
    logits = torch.tensor([[0.0, 1.0, 2.0, -1.0]])
    ids, w = moe_route(logits, torch.tensor([0.0, 0.0, 0.0, 5.0]), top_k=2, routed_scaling_factor=2.0)
    assert ids.tolist() == [[3, 2]]
    s3, s2 = _sqrt_softplus(-1.0), _sqrt_softplus(2.0)  # unbiased scores
    assert w[0].tolist() == pytest.approx([2.0 * s3 / (s2 + s3), 2.0 * s2 / (s2 + s3)], rel=1e-6)


def test_hash_routing():
    """Hash routing takes experts from the table by input id and ignores the bias."""
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(5, 8, generator=gen)
    table = torch.tensor([[0, 1, 2], [7, 6, 5], [3, 0, 4]], dtype=torch.int32)
    input_ids = torch.tensor([2, 1, 1, 0, 2])
    bias = torch.full((8,), 100.0)  # ignored on hash layers
    ids, w = moe_route(logits, bias, top_k=3, hash_table=table, input_ids=input_ids)
    assert torch.equal(ids, table[input_ids])
    s = torch.nn.functional.softplus(logits).sqrt().gather(1, ids.long())
    assert torch.allclose(w, s / s.sum(1, keepdim=True) * 1.5, rtol=1e-6, atol=0)


# ----- experts ------------------------------------------------------------------------------------------


def _single_expert(gate: float, up: float, down: float) -> ExpertWeights:
    """E=1, H=4, I=1 with x = e0: g = gate, u = up, out[0] = down * silu(g) * u. Exact under pow2 fp8 scales."""
    w13 = torch.zeros(1, 2, 4)
    w13[0, 0, 0], w13[0, 1, 0] = gate, up
    w2 = torch.zeros(1, 4, 1)
    w2[0, 0, 0] = down
    ew = quantize_experts(w13, w2, "fp8_block", pow2_scales=True)
    assert torch.equal(dequantize_experts(ew)[0], w13) and torch.equal(dequantize_experts(ew)[1], w2)
    return ew


@pytest.mark.parametrize(("gate", "up", "g_eff", "u_eff"), [(2.0, 3.0, 2.0, 3.0), (16.0, -12.0, 10.0, -10.0)])
def test_expert_clamp_hand_example(gate: float, up: float, g_eff: float, u_eff: float):
    """The SwiGLU limit clamps gate and up as in the hand-computed example."""
    x = torch.tensor([[1.0, 0.0, 0.0, 0.0]], dtype=torch.bfloat16)
    ids = torch.zeros(1, 1, dtype=torch.int32)
    w = torch.full((1, 1), 1.5)
    out = moe_experts(x, ids, w, _single_expert(gate, up, 0.5), swiglu_limit=10.0)
    want = 1.5 * 0.5 * g_eff / (1 + math.exp(-g_eff)) * u_eff
    assert out.dtype == torch.bfloat16 and out.shape == (1, 4)
    assert float(out[0, 0]) == pytest.approx(want, rel=2**-8)
    assert out[0, 1:].tolist() == [0.0, 0.0, 0.0]
    unclamped = moe_experts(x, ids, w, _single_expert(gate, up, 0.5), swiglu_limit=math.inf)
    active = gate > 10
    assert (abs(float(unclamped[0, 0]) - float(out[0, 0])) > 1.0) == active


@pytest.mark.parametrize("fmt", ["mxfp4", "fp8_block"])
def test_experts_match_dense_loop(fmt: str):
    """Reference moe_experts matches a dense per-route loop, repeated experts counting twice."""
    gen = torch.Generator().manual_seed(2)
    ew = _random_experts(fmt)
    x = (torch.randn(7, 64, generator=gen) * 3).to(torch.bfloat16)
    ids = torch.randint(0, 5, (7, 3), generator=gen, dtype=torch.int32)
    ids[0] = torch.tensor([4, 4, 1])  # the same expert twice for one token counts twice
    w = torch.rand(7, 3, generator=gen) + 0.1
    out = moe_experts(x, ids, w, ew, swiglu_limit=1.0)  # a low limit, so clamping happens
    want = _dense_loop(x, ids, w, ew, 1.0)
    assert out.dtype == torch.bfloat16
    assert torch.allclose(out.double(), want, rtol=2**-8, atol=1e-5)
    assert (want.abs() > 1e-2).float().mean() > 0.9


def test_negative_ids_ignored():
    """Routes with negative expert ids contribute nothing."""
    gen = torch.Generator().manual_seed(3)
    ew = _random_experts("mxfp4")
    x = torch.randn(6, 64, generator=gen).to(torch.bfloat16)
    ids = torch.randint(0, 5, (6, 3), generator=gen, dtype=torch.int32)
    w = torch.rand(6, 3, generator=gen)
    mask = torch.rand(6, 3, generator=gen) < 0.4
    mask[5] = True
    masked = moe_experts(x, torch.where(mask, -1, ids), w, ew)
    zero_weight = moe_experts(x, ids, torch.where(mask, 0.0, w), ew)
    assert torch.equal(masked, zero_weight)
    assert (masked[5] == 0).all() and (masked[:5] != 0).any()
    empty = moe_experts(x, torch.full((6, 3), -1, dtype=torch.int32), w, ew)
    assert (empty == 0).all()


def test_shared_expert_is_the_dense_mlp():
    """shared_expert is the dense SwiGLU MLP, returned in fp32."""
    gen = torch.Generator().manual_seed(4)
    w13 = torch.randn(2 * 32, 64, generator=gen)
    w2 = torch.randn(64, 32, generator=gen)
    x = torch.randn(3, 64, generator=gen).to(torch.bfloat16)
    out = shared_expert(x, w13, w2)
    assert out.dtype == torch.float32
    g = (x.double() @ w13[:32].double().T).clamp(max=10)
    u = (x.double() @ w13[32:].double().T).clamp(-10, 10)
    assert torch.allclose(out.double(), (torch.nn.functional.silu(g) * u) @ w2.double().T, rtol=1e-4, atol=1e-3)


# ----- contracts ----------------------------------------------------------------------------------------


def _expert_args(fmt: str = "mxfp4", **kw) -> dict:
    gen = torch.Generator().manual_seed(5)
    return {
        "x": torch.randn(4, 64, generator=gen).to(torch.bfloat16),
        "topk_ids": torch.randint(0, 5, (4, 2), generator=gen, dtype=torch.int32),
        "topk_weights": torch.rand(4, 2, generator=gen),
        "weights": _random_experts(fmt, **kw),
        "swiglu_limit": 10.0,
    }


def _replace(args: dict, **changes) -> dict:
    return {**args, **changes}


def _prep(args: dict) -> dict:
    """moe_experts takes weights prepared for a kernel; on the CPU platform that is the reference layout."""
    return {**args, "weights": dsv4hal.select_platform("cpu").ops.moe_experts.prepare_weights(args["weights"])}


@pytest.mark.parametrize("fmt", ["mxfp4", "fp8_block"])
def test_validate_experts_accepts_good_args(fmt: str):
    """moe_experts validation accepts good arguments and -1 ids, and reports the case."""
    args = _prep(_expert_args(fmt))
    validate_moe_experts(**args, checked=True)
    args["topk_ids"][0, 0] = -1  # expert-parallel masking is legal
    validate_moe_experts(**args, checked=True)
    assert case_moe_experts(**args) == {
        "format": fmt, "fp8": "e4m3fn" if fmt == "fp8_block" else None, "E": 5, "H": 64, "I": 32, "top_k": 2,
        "tokens": "few",  # T = 4
    }
    hash(frozenset(case_moe_experts(**args).items()))


def test_validate_experts_rejects_bad_args():
    """moe_experts validation refuses each bad input or weight by name."""
    raw = _expert_args("mxfp4")
    args = _prep(raw)
    w = raw["weights"]
    bad = {
        "x": _replace(args, x=args["x"].float()),
        "topk_weights": _replace(args, topk_weights=args["topk_weights"][:, :1]),
        "topk_ids": _replace(args, topk_ids=args["topk_ids"].long()),
        "weights": raw,  # not prepared
        "swiglu_limit": _replace(args, swiglu_limit=float("nan")),
    }
    for name, a in bad.items():
        with pytest.raises(InvalidArgumentError) as info:
            validate_moe_experts(**a)
        assert info.value.argument == name
    bad_weights = {
        "weights.w13_scale": dataclasses.replace(w, w13_scale=w.w13_scale[..., :1]),
        "weights.format": dataclasses.replace(w, format="nvfp4"),
        "weights": (w.w13, w.w13_scale, w.w2, w.w2_scale),
    }
    for name, bw in bad_weights.items():
        with pytest.raises(InvalidArgumentError) as info:
            validate_expert_weights(bw)
        assert info.value.argument == name
    # H = 48 is not a multiple of the 32-element MXFP4 scale group, even with self-consistent shapes.
    u8 = torch.uint8
    w48 = ExpertWeights("mxfp4", torch.zeros(5, 64, 24, dtype=u8), torch.zeros(5, 64, 1, dtype=u8),
                        torch.zeros(5, 48, 16, dtype=u8), torch.zeros(5, 48, 1, dtype=u8))
    with pytest.raises(InvalidArgumentError, match="multiple of 32"):
        validate_expert_weights(w48)


def test_validate_fp8_experts_rejects_flavour_and_scale_mismatch():
    """FP8 expert weights of another FP8 flavour or scale dtype are refused by field."""
    w = _expert_args("fp8_block")["weights"]
    with pytest.raises(InvalidArgumentError, match="float8_e4m3fnuz"):
        validate_expert_weights(dataclasses.replace(w, fp8="e4m3fnuz"))
    with pytest.raises(InvalidArgumentError) as info:
        validate_expert_weights(dataclasses.replace(w, w2_scale=w.w2_scale.double()))
    assert info.value.argument == "weights.w2_scale"


def test_checked_mode_reads_values():
    """Checked moe_experts refuses expert ids past E; unchecked mode checks shapes only."""
    raw = _expert_args("fp8_block")
    args = _prep(raw)
    out_of_range = _replace(args, topk_ids=args["topk_ids"].clone().fill_(5))
    validate_moe_experts(**out_of_range)  # unchecked: shapes only
    with pytest.raises(InvalidArgumentError, match="index 5"):
        validate_moe_experts(**out_of_range, checked=True)
    nan_x = args["x"].clone()
    nan_x[1, 3] = float("nan")
    with pytest.raises(InvalidArgumentError) as info:
        validate_moe_experts(**_replace(args, x=nan_x), checked=True)
    assert info.value.argument == "x"
    nan_w = args["topk_weights"].clone()
    nan_w[0, 0] = float("nan")
    with pytest.raises(InvalidArgumentError) as info:
        validate_moe_experts(**_replace(args, topk_weights=nan_w), checked=True)
    assert info.value.argument == "topk_weights"
    w = raw["weights"]
    w2 = w.w2.clone()
    w2.view(torch.uint8)[3, 0, 0] = 0x7F  # e4m3fn NaN
    with pytest.raises(InvalidArgumentError, match="expert 3"):
        validate_expert_weights(dataclasses.replace(w, w2=w2), checked=True)
    mx = _expert_args("mxfp4")
    scale = mx["weights"].w13_scale.clone()
    scale[2, 0, 0] = 0xFF  # E8M0 NaN
    with pytest.raises(InvalidArgumentError, match="expert 2"):
        validate_expert_weights(dataclasses.replace(mx["weights"], w13_scale=scale), checked=True)


def test_validate_route():
    """moe_route validation accepts good arguments and refuses each bad one."""
    logits = torch.randn(3, 8)
    table = torch.randint(0, 8, (20, 6), dtype=torch.int32)
    input_ids = torch.tensor([0, 19, 4])
    validate_moe_route(logits, torch.zeros(8), 6, 1.5, checked=True)
    validate_moe_route(logits, None, 6, 1.5, table, input_ids, checked=True)
    bad = {
        "router_logits": dict(router_logits=logits.bfloat16()),
        "bias": dict(router_logits=logits, bias=torch.zeros(7)),
        "top_k": dict(router_logits=logits, top_k=9),
        "routed_scaling_factor": dict(router_logits=logits, routed_scaling_factor=0.0),
        "input_ids": dict(router_logits=logits, hash_table=table),
        "hash_table": dict(router_logits=logits, top_k=4, hash_table=table, input_ids=input_ids),
    }
    for name, kw in bad.items():
        with pytest.raises(InvalidArgumentError) as info:
            validate_moe_route(**kw)
        assert info.value.argument == name
    nan_logits = logits.clone()
    nan_logits[2, 2] = float("nan")
    validate_moe_route(nan_logits)
    with pytest.raises(InvalidArgumentError, match="NaN"):
        validate_moe_route(nan_logits, checked=True)
    with pytest.raises(InvalidArgumentError, match="index 8"):
        validate_moe_route(logits, None, 6, 1.5, table.clone().fill_(8), input_ids, checked=True)
    with pytest.raises(InvalidArgumentError, match="index 20"):
        validate_moe_route(logits, None, 6, 1.5, table, torch.tensor([0, 20, 1]), checked=True)
    assert case_moe_route(logits, torch.zeros(8), 6) == {"hash": False, "bias": True, "E": 8, "top_k": 6,
                                                         "tokens": "few"}  # T <= 8
    assert case_moe_route(torch.zeros(65, 8), None, 6, 1.5, table, torch.zeros(65, dtype=torch.long))["hash"]


# ----- conformance catalog ------------------------------------------------------------------------------


def test_catalog_shape():
    """The MoE catalog names are unique and GPU cases cover the model shapes and token counts."""
    names = [c.name for c in cases_moe.ALL_CASES]
    assert len(names) == len(set(names))
    full = {(c.params["E"], c.params["H"], c.params["I"], c.params["T"], c.params["format"])
            for c in cases_moe.CASES_EXPERTS if c.gpu_only}
    for e, h, i in ((256, 4096, 2048), (384, 7168, 3072)):
        for t in (1, 64, 512, 4096):
            assert {(e, h, i, t, "mxfp4"), (e, h, i, t, "fp8_block")} <= full
    cpu = [c for c in cases_moe.ALL_CASES if not c.gpu_only]
    assert {c.params.get("routing") for c in cpu if c.op == "moe_route"} >= {"hash", "bias"}
    assert any(c.params["w13_gain"] > 1 for c in cpu if c.op == "moe_experts")
    assert all(c.modes == ("eager", "graph") for c in cases_moe.ALL_CASES)


@pytest.mark.parametrize("spec", [c for c in cases_moe.ALL_CASES if not c.gpu_only], ids=lambda c: f"{c.op}-{c.name}")
def test_catalog_fixture_passes_on_reference(spec):
    """Every CPU MoE catalog fixture passes on the reference; NaN tokens are refused checked."""
    fixture = cases_moe.build(spec, torch.device("cpu"), torch.Generator().manual_seed(7))
    ref = moe_route if spec.op == "moe_route" else moe_experts
    if spec.op == "moe_route":
        validate_moe_route(**fixture.args, checked=True)
    elif spec.params.get("nan_tokens"):  # checked mode refuses a non-finite x (the contract); the cells run unchecked
        with pytest.raises(InvalidArgumentError, match="finite"):
            validate_moe_experts(**_prep(fixture.args), checked=True)
        validate_moe_experts(**_prep(fixture.args), checked=False)
    else:
        validate_moe_experts(**_prep(fixture.args), checked=True)
    got = ref(**fixture.args)
    err, ok, detail = fixture.compare(got, fixture.expected)
    assert ok, detail
    # The comparison can fail: a wrong answer is rejected.
    if spec.op == "moe_route":
        ids, w = got
        assert not fixture.compare((ids, w * 1.01), fixture.expected)[1]
        wrong = ids.clone()
        wrong[:, 0] = (ids[:, 0] + 1) % spec.params["E"]
        assert not fixture.compare((wrong, w), fixture.expected)[1]
    else:
        assert not fixture.compare(got * 1.2, fixture.expected)[1]
        assert not fixture.compare(torch.full_like(got, float("nan")), fixture.expected)[1]


def test_catalog_clamp_case_is_active():
    """The MoE clamp case fails an unclamped result, so the clamp is exercised."""
    spec = next(c for c in cases_moe.ALL_CASES if c.name.endswith("-clamp") and c.params["format"] == "mxfp4")
    fixture = cases_moe.build(spec, torch.device("cpu"), torch.Generator().manual_seed(8))
    a = fixture.args
    unclamped = cases_moe.oracle_moe_experts(a["x"], a["topk_ids"], a["topk_weights"], a["weights"], math.inf)
    assert not fixture.compare(unclamped, fixture.expected)[1]


def test_route_compare_accepts_reordered_ids():
    """The route comparison accepts reordered routes but not ids split from their weights."""
    spec = next(c for c in cases_moe.ALL_CASES if c.op == "moe_route" and not c.gpu_only and c.params["T"] == 64)
    fixture = cases_moe.build(spec, torch.device("cpu"), torch.Generator().manual_seed(9))
    ids, w = moe_route(**fixture.args)
    perm = torch.randperm(ids.shape[1], generator=torch.Generator().manual_seed(0))
    assert fixture.compare((ids[:, perm], w[:, perm]), fixture.expected)[1]
    assert not fixture.compare((ids[:, perm], w), fixture.expected)[1]
