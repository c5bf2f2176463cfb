"""The typed op surface: one definition per op (signature, docstring, validate, case), the catalog built from it,
and platform.ops as a typed facade that inspect, typing and IDEs read."""

from __future__ import annotations

import importlib
import inspect
import typing

import pytest
import torch
from conftest import ROOT, fake

import dsv4hal
from dsv4hal.conformance.runner import CATALOG_MODULES
from dsv4hal.ops.catalog import MODULES, OP_NAMES, OPS
from dsv4hal.ops.signatures import OpDefinition, define


@pytest.fixture(scope="module")
def platform() -> dsv4hal.Platform:
    return dsv4hal.select_platform(info=fake("cpu"))


def test_pack_store_signature_is_real(platform: dsv4hal.Platform) -> None:
    """The bound pack_store has the real signature and annotations."""
    sig = inspect.signature(dsv4hal.select_platform("cpu").ops.pack_store)
    assert list(sig.parameters) == ["k", "loc", "cache"]
    assert sig.parameters["cache"].annotation is dsv4hal.V4PagedCache and sig.return_annotation is None


@pytest.mark.parametrize("op", OP_NAMES)
def test_every_bound_op_is_typed_as_its_definition(platform: dsv4hal.Platform, op: str) -> None:
    """Every bound op's signature, type hints and docstring sections are its definition's."""
    bound, d = platform.ops[op], OPS[OP_NAMES.index(op)].definition()
    assert isinstance(d, OpDefinition) and d.name == op
    assert list(inspect.signature(bound).parameters) == list(d.params)
    hints = typing.get_type_hints(bound)
    assert set(hints) == {*d.params, "return"} and not any(isinstance(h, str) for h in hints.values())
    for section in ("Arguments:", "Returns:", "Rejected"):
        assert section in bound.__doc__, f"{op}: docstring has no {section}"


@pytest.mark.parametrize("spec", OPS, ids=OP_NAMES)
def test_reference_validate_and_case_take_the_definitions_parameters(spec) -> None:  # noqa: ANN001
    """Each op's reference, validate and case take its definition's parameters."""
    d = spec.definition()
    module, name = spec.reference.split(":")
    ref = getattr(importlib.import_module(module), name)
    assert list(inspect.signature(ref).parameters) == list(d.params)
    assert [p for p in inspect.signature(d.validate).parameters if p != "checked"] == list(d.params)
    assert list(inspect.signature(d.case).parameters) == list(d.params)
    contract = importlib.import_module(spec.contract)
    assert getattr(contract, spec.validate) is d.validate and getattr(contract, spec.case) is d.case


def test_catalog_modules_are_found_from_the_definitions() -> None:
    """Catalog modules are found from the op definitions, one cases module each."""
    assert CATALOG_MODULES == MODULES
    for module in MODULES:
        importlib.import_module(f"dsv4hal.ops.{module}")
        assert (ROOT / "dsv4hal" / "conformance" / f"cases_{module}.py").exists()
    weighted = [s.name for s in OPS if s.weights_arg]
    assert weighted == ["moe_experts"] and OPS[OP_NAMES.index("moe_experts")].weights_case == "case_expert_weights"


def test_a_definition_whose_contract_functions_drift_is_refused() -> None:
    """An op definition whose validate or case parameters drift is refused."""
    def validate(a, b, *, checked=False):  # noqa: ANN001, ANN202
        pass

    def case(a):  # noqa: ANN001, ANN202
        return {}

    with pytest.raises(TypeError, match="case function case takes"):
        @define(validate=validate, case=case)
        def my_op(a: torch.Tensor, b: int) -> None:
            """doc"""

    with pytest.raises(TypeError, match="key function"):
        @define(validate=validate, case=lambda a, b: {}, key=lambda a: (a,))
        def my_op1(a: torch.Tensor, b: int) -> None:
            """doc"""

    @define(validate=validate, case=lambda a, b: {})
    def my_op2(a: torch.Tensor, b: int) -> None:
        """doc"""

    with pytest.raises(TypeError, match="op definition"):
        my_op2(torch.zeros(1), 1)


def test_the_facade_keeps_indexing_iteration_and_the_op_methods(platform: dsv4hal.Platform) -> None:
    """The ops facade keeps indexing, iteration and each op's methods."""
    assert [op.name for op in platform.ops] == list(OP_NAMES)
    assert platform.ops["indexer_topk"] is platform.ops.indexer_topk
    assert platform.ops.indexer_topk.decide().chosen.name == "torch_reference"
    scores, lengths = torch.randn(2, 700), torch.tensor([3, 700], dtype=torch.int32)
    case = platform.ops.indexer_topk.case_of(scores, lengths, 512)
    raw, pages = platform.ops.indexer_topk.kernel(case)(scores, lengths, 512)
    assert pages is None and raw.shape == (2, 512)
    assert callable(platform.ops.moe_experts.prepare_weights)


def test_each_default_case_has_the_features_its_case_function_gives() -> None:
    """An op's default case (explain's and info's case, and what --case may change) names the same features as the
    case its contract computes from real arguments (the first CPU conformance fixture of each op), so every feature
    selection reads can be given on the command line."""
    from dsv4hal.conformance.runner import load_catalog

    platform = dsv4hal.select_platform("cpu")
    seen: set[str] = set()
    for spec, build in load_catalog():
        if spec.op in seen or spec.gpu_only:
            continue
        seen.add(spec.op)
        op = platform.ops[spec.op]
        args = build(spec, torch.device("cpu"), torch.Generator().manual_seed(0)).args
        if op.spec.weights_arg:  # selection sees the weights' case with the call's: prepare them as an engine does
            args = {**args, op.spec.weights_arg: op.prepare_weights(args[op.spec.weights_arg])}
        assert set(op.case_of(**args)) == set(op.spec.default_case), spec.op
    assert seen == set(dsv4hal.OP_NAMES)


def test_the_typed_ops_stub_is_the_one_generated_from_the_catalog() -> None:
    """dsv4hal/ops/typed_ops.py (the typed attributes of platform.ops) equals a fresh stub: every op of the catalog
    is typed, as its definition."""
    from dsv4hal.ops import gen_stub

    assert gen_stub.PATH.read_text() == gen_stub.render(), f"the stub is stale: run `{gen_stub.COMMAND}`"
