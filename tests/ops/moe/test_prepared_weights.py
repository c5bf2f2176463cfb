"""Kernel choice fixes the weight layout: moe_experts is decided when its weights are prepared, later calls
run that kernel, and weights prepared for one kernel, or on another device, are refused (typed errors)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from conftest import fake, plugin_module, registry_with
from op_args import DEV

import dsv4hal
from dsv4hal.errors import InvalidArgumentError, PreparedWeightsMismatchError, UnsupportedCaseError
from dsv4hal.reference.moe import ExpertWeights, moe_experts, quantize_experts
from dsv4hal.registry import KernelImpl


def transpose_layout(w: ExpertWeights) -> ExpertWeights:
    """A stand-in vendor layout: expert-major tensors stored transposed (so using them unprepared is wrong)."""
    return dataclasses.replace(w, w13=w.w13.transpose(1, 2).contiguous(), w2=w.w2.transpose(1, 2).contiguous())


def forward_transposed(x, topk_ids, topk_weights, weights, swiglu_limit=10.0):  # noqa: ANN001, ANN201
    logical = dataclasses.replace(weights, w13=weights.w13.transpose(1, 2), w2=weights.w2.transpose(1, 2))
    return moe_experts(x, topk_ids, topk_weights, logical, swiglu_limit)


def _decode_only(case, info):  # noqa: ANN001, ANN202
    return ["decode shapes only (T <= 64)"] if case.get("tokens") == "prefill" else []


def _register(registry) -> None:  # noqa: ANN001
    registry.add_kernel(KernelImpl(
        op="moe_experts", name="transposed_moe", target="test_prepared_weights:forward_transposed",
        prepare="test_prepared_weights:transpose_layout", layout="transposed", platforms=("cpu", "cuda_sm90"),
        priority=10, supports=_decode_only))


@pytest.fixture(scope="module")
def reg():  # noqa: ANN201
    return registry_with(("transposed", plugin_module("transposed", _register)))


def _inputs(t: int = 4):  # noqa: ANN202
    gen = torch.Generator().manual_seed(0)
    w13 = torch.randn(4, 64, 64, generator=gen) * 0.1
    w2 = torch.randn(4, 64, 32, generator=gen) * 0.1
    weights = quantize_experts(w13, w2, "mxfp4")
    x = torch.randn(t, 64, generator=gen).bfloat16()
    ids = torch.randint(0, 4, (t, 2), generator=gen, dtype=torch.int32)
    return x, ids, torch.rand(t, 2, generator=gen), weights


def test_prepare_chooses_and_forward_runs_that_kernel(reg) -> None:  # noqa: ANN001
    """prepare_weights chooses a kernel and the forward runs that same kernel."""
    p = dsv4hal.select_platform(info=fake("cpu"), registry=reg)
    x, ids, tw, w = _inputs()
    prepared = p.ops.moe_experts.prepare_weights(w)
    assert (prepared.implementation, prepared.layout, prepared.platform) == ("transposed_moe", "transposed", "cpu")
    assert prepared.payload.w13.shape == (4, 32, 64) != w.w13.shape  # packed [E, 2I, H/2], stored transposed
    got = p.ops.moe_experts(x, ids, tw, prepared)
    assert torch.equal(got, moe_experts(x, ids, tw, w))


def test_forcing_another_kernel_refuses_prepared_weights(reg) -> None:  # noqa: ANN001
    """Weights prepared for one kernel are refused when another kernel is forced."""
    p = dsv4hal.select_platform(info=fake("cpu"), registry=reg)
    x, ids, tw, w = _inputs()
    prepared = p.ops.moe_experts.prepare_weights(w)
    with dsv4hal.overrides(kernels={"moe_experts": "torch_reference"}):
        forced = dsv4hal.select_platform(info=fake("cpu"), registry=reg)
    with pytest.raises(PreparedWeightsMismatchError, match="transposed_moe") as e:
        forced.ops.moe_experts(x, ids, tw, prepared)
    assert "prepare the weights again" in str(e.value)
    again = forced.ops.moe_experts.prepare_weights(w)
    assert again.implementation == "torch_reference"
    assert torch.equal(forced.ops.moe_experts(x, ids, tw, again), moe_experts(x, ids, tw, w))


def test_weights_from_another_platform_are_refused(reg) -> None:  # noqa: ANN001
    """Weights prepared on another platform are refused, naming the platforms."""
    cpu = dsv4hal.select_platform(info=fake("cpu"), registry=reg)
    hopper = dsv4hal.select_platform(info=fake("sm90"), registry=reg)
    x, ids, tw, w = _inputs()
    prepared = hopper.ops.moe_experts.prepare_weights(w)
    assert prepared.platform == "cuda_sm90"
    with pytest.raises(PreparedWeightsMismatchError, match="platform cpu"):
        cpu.ops.moe_experts(x, ids, tw, prepared)


def test_unprepared_weights_are_a_typed_error(reg) -> None:  # noqa: ANN001
    """Unprepared weights passed to moe_experts are a typed error naming prepare_weights."""
    p = dsv4hal.select_platform(info=fake("cpu"), registry=reg)
    x, ids, tw, w = _inputs()
    with pytest.raises(InvalidArgumentError, match="prepare_weights") as e:
        p.ops.moe_experts(x, ids, tw, w)
    assert e.value.argument == "weights"


def test_no_silent_switch_when_the_prepared_kernel_refuses_the_case(reg) -> None:  # noqa: ANN001
    """If the prepared kernel refuses a case, moe_experts raises rather than switching kernels."""
    p = dsv4hal.select_platform(info=fake("cpu"), registry=reg)
    x, ids, tw, w = _inputs(t=100)
    prepared = p.ops.moe_experts.prepare_weights(w)
    with pytest.raises(UnsupportedCaseError, match="decode shapes only"):
        p.ops.moe_experts(x, ids, tw, prepared)


def test_repeat_calls_skip_validation_and_still_run_the_prepared_kernel(reg, monkeypatch) -> None:  # noqa: ANN001
    """A call with the metadata and weights token of one that passed goes straight to the prepared kernel on the
    payload (the same result as the first call); weights made by the same kernel for the same case share the token
    (and so the fast path entry) but each call runs on its own payload; refusals (another platform's weights, a case
    the kernel refuses, bad tokens) are raised every time, never remembered."""
    p = dsv4hal.select_platform(info=fake("cpu"), registry=reg)
    op = p.ops.moe_experts
    x, ids, tw, w = _inputs()
    prepared = op.prepare_weights(w)
    first = op(x, ids, tw, prepared)
    validations = []
    real = op._validate
    monkeypatch.setattr(op, "_validate", lambda *a, **k: (validations.append(1), real(*a, **k))[1])
    assert torch.equal(op(x, ids, tw, prepared), first) and not validations  # from the fast path
    scaled = dataclasses.replace(w, w13_scale=w.w13_scale + 1)  # same metadata, other values (E8M0 exponents + 1)
    other = op.prepare_weights(scaled)
    assert other is not prepared and other._memo_token is None
    got = op(x, ids, tw, other)
    assert not validations and other._memo_token is prepared._memo_token
    assert torch.equal(got, moe_experts(x, ids, tw, scaled)) and not torch.equal(got, first)
    hopper = dsv4hal.select_platform(info=fake("sm90"), registry=reg).ops.moe_experts.prepare_weights(w)
    big = _inputs(t=100)
    for _ in range(2):
        with pytest.raises(PreparedWeightsMismatchError, match="platform cpu"):
            op(x, ids, tw, hopper)
        with pytest.raises(UnsupportedCaseError, match="decode shapes only"):
            op(*big[:3], prepared)
        with pytest.raises(InvalidArgumentError, match="topk_ids"):
            op(x, ids.long(), tw, prepared)
    assert len(validations) == 6


def test_moe_experts_weights_on_another_device(reference_unchecked) -> None:  # noqa: ANN001
    """moe_experts refuses prepared weights on another device than the activations."""
    w = quantize_experts(torch.randn(2, 64, 64) * 0.1, torch.randn(2, 64, 32) * 0.1, "fp8_block")
    prepared = reference_unchecked.ops.moe_experts.prepare_weights(
        dataclasses.replace(w, **{f: getattr(w, f).to(DEV) for f in ("w13", "w13_scale", "w2", "w2_scale")}))
    meta = dataclasses.replace(prepared, payload=dataclasses.replace(
        prepared.payload, **{f: torch.empty_like(getattr(prepared.payload, f), device="meta")
                             for f in ("w13", "w13_scale", "w2", "w2_scale")}))
    x = torch.randn(3, 64, device=DEV).bfloat16()
    ids = torch.zeros(3, 2, dtype=torch.int32, device=DEV)
    tw = torch.ones(3, 2, device=DEV)
    reference_unchecked.ops.moe_experts(x, ids, tw, prepared)
    with pytest.raises(InvalidArgumentError, match="device"):
        reference_unchecked.ops.moe_experts(x, ids, tw, meta)
