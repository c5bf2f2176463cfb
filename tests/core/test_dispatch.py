"""The dispatcher (one table case -> Choice, each case decided once, bounded), plan() (the kernel a call runs,
validated once), and the weighted op's refusal of weights made for another kernel or platform."""

from __future__ import annotations

import pytest
import torch
from conftest import fake

import dsv4hal
from dsv4hal.dispatch import bounded, dispatcher
from dsv4hal.errors import Dsv4HalError, InvalidArgumentError, PreparedWeightsMismatchError
from dsv4hal.plugins import import_target
from dsv4hal.reference import mhc as ref_mhc
from dsv4hal.reference import moe as ref_moe


def _post_args(t: int = 2) -> tuple:
    return (torch.randn(t, 64).bfloat16(), torch.randn(t, 4, 64).bfloat16(), torch.rand(t, 4), torch.rand(t, 4, 4))


def _counting_validate(op, monkeypatch) -> list[int]:  # noqa: ANN001
    calls: list[int] = []
    real = op._validate
    monkeypatch.setattr(op, "_validate", lambda *a, **k: (calls.append(1), real(*a, **k))[1])
    return calls


def test_plan_returns_the_kernel_a_call_runs_and_never_validates_again(monkeypatch) -> None:  # noqa: ANN001
    """plan() validates its example arguments once and returns the very kernel object a call with them runs (the
    one the dispatcher chose for their case, the one the fast path remembers); calling it validates nothing."""
    op = dsv4hal.select_platform(info=fake("cpu")).ops.mhc_post
    a = _post_args()
    calls = _counting_validate(op, monkeypatch)
    planned = op.plan(*a)
    assert calls == [1]
    assert planned is op.dispatcher.choose(op.case_of(*a)).kernel is import_target(op.decide().chosen.target)
    op(*a)
    assert op._fast.find(a, {}) is planned
    calls.clear()
    for t in (2, 3):  # other shapes of the same case: the plan runs them without validation
        b = _post_args(t)
        assert torch.equal(planned(*b), ref_mhc.mhc_post(*b))
    assert calls == []


def test_plan_refuses_bad_example_arguments_and_checks_values_only_in_checked_mode() -> None:
    """plan() raises the typed error a call raises; on a checked platform it also checks values (here a non-finite
    input), at plan time."""
    op = dsv4hal.select_platform(info=fake("cpu")).ops.moe_route
    with pytest.raises(InvalidArgumentError, match="top_k"):
        op.plan(torch.randn(1, 16), top_k=True)
    nan = torch.full((1, 16), float("nan"))
    assert callable(op.plan(nan, top_k=2))  # unchecked: values are not read
    checked = dsv4hal.select_platform(info=fake("cpu"), checked=True).ops.moe_route
    with pytest.raises(InvalidArgumentError, match="finite"):
        checked.plan(nan, top_k=2)


def test_the_dispatcher_decides_each_case_once(monkeypatch) -> None:  # noqa: ANN001
    """A case is selected on its first call only: later calls, decide() and kernel() for it reuse its Choice, whose
    kernel is the function the chosen registration's target names and whose decision chose that registration."""
    op = dsv4hal.select_platform(info=fake("cpu")).ops.mhc_post
    selections = []
    real = dispatcher.select_kernel
    monkeypatch.setattr(dispatcher, "select_kernel", lambda *a, **k: (selections.append(a[2]), real(*a, **k))[1])
    for t in (1, 2, 3):
        op(*_post_args(t))
        op.decide({"hidden": 64})
        op.kernel({"hidden": 64})
    (choice,) = [c for c in op.dispatcher.choices() if c.decision.case == {"hidden": 64}]
    assert choice.decision.chosen is choice.impl and choice.kernel is import_target(choice.impl.target)
    op.decide({"hidden": 128})
    assert op.spec.default_case != {"hidden": 64}  # (the default case is decided when the platform is selected)
    assert selections == [{"hidden": 64}, {"hidden": 128}]


def test_the_dispatcher_table_keeps_at_most_limit_cases_dropping_the_oldest(monkeypatch) -> None:  # noqa: ANN001
    """Past bounded.LIMIT cases the oldest is dropped (and decided again if it comes back); the newest are kept."""
    monkeypatch.setattr(bounded, "LIMIT", 8)
    op = dsv4hal.select_platform(info=fake("cpu")).ops.mhc_post
    for hidden in range(1, 21):
        op.decide({"hidden": hidden})
    cases = [c.decision.case["hidden"] for c in op.dispatcher.choices()]
    assert len(op.dispatcher) == 8 and cases == list(range(13, 21))


def test_the_weighted_op_refuses_weights_made_elsewhere_and_plans_on_their_payload() -> None:
    """moe_experts is a weighted op: weights prepared on another platform are refused by a call and by plan();
    kernel(case) names the remedy; the plan of prepared weights is the prepared kernel called on their payload."""
    cpu = dsv4hal.select_platform(info=fake("cpu"))
    op = cpu.ops.moe_experts
    w = ref_moe.quantize_experts(torch.randn(4, 64, 64) * 0.1, torch.randn(4, 64, 32) * 0.1, "mxfp4")
    x, ids, tw = torch.randn(3, 64).bfloat16(), torch.randint(0, 4, (3, 2), dtype=torch.int32), torch.rand(3, 2)
    foreign = dsv4hal.select_platform(info=fake("sm90")).ops.moe_experts.prepare_weights(w)
    for attempt in (op, op.plan):
        with pytest.raises(PreparedWeightsMismatchError, match="platform cpu"):
            attempt(x, ids, tw, foreign)
    with pytest.raises(Dsv4HalError, match="prepared for"):
        op.kernel(op.spec.default_case)
    prepared = op.prepare_weights(w)
    planned = op.plan(x, ids, tw, prepared)
    assert planned.__wrapped__ is import_target(op.dispatcher.choices()[-1].impl.target)
    assert torch.equal(planned(x, ids, tw, prepared), ref_moe.moe_experts(x, ids, tw, w))
    assert torch.equal(planned(x, ids, tw, weights=prepared), op(x, ids, tw, prepared))
