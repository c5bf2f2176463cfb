"""Adding an op the documented way (docs/adding-an-op.md): the fixture package tests/fixtures/scale_rows_op holds
the six files, and a registry with it as a plugin dispatches, compiles, conformance-checks and lists the op."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest
import torch
from conftest import ROOT, TRITON_DEVICE, registry_with
from fixtures.scale_rows_op import contract, kernel, plugin

import dsv4hal
from dsv4hal import custom_ops
from dsv4hal.conformance.runner import run_conformance
from dsv4hal.errors import InvalidArgumentError, UnknownOpError
from dsv4hal.registry import Registry

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "scale_rows_op"
# the six files docs/adding-an-op.md names, in its table's order
SIX = ("contract.py", "reference.py", "cases.py", "kernel.py", "plugin.py", "test_scale_rows_kernel.py")


@pytest.fixture(scope="module")
def registry() -> Registry:
    return registry_with(("scale_rows_op", plugin))


@pytest.fixture(scope="module")
def platform(registry: Registry) -> dsv4hal.Platform:
    """The platform the machine's Triton runs on: a GPU's, or the CPU's under the interpreter."""
    return dsv4hal.select_platform(None if TRITON_DEVICE.type != "cpu" else "cpu", registry=registry)


def _inputs() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return (torch.randn(5, 96, generator=g).to(TRITON_DEVICE),
            (torch.rand(96, generator=g) + 0.5).to(TRITON_DEVICE))


def test_fixture_op_is_exactly_the_six_documented_files() -> None:
    """The fixture op is the six files the guide's table names (contract, reference, cases, kernel, registration,
    test) and nothing else: no catalog line, no stub, no README edit."""
    files = sorted(p.name for p in FIXTURE.iterdir() if p.name != "__pycache__")
    assert files == sorted(SIX)
    table = re.findall(r"^\| (\d) \|", (ROOT / "docs" / "adding-an-op.md").read_text(), re.M)
    assert table == ["1", "2", "3", "4", "5", "6"]


def test_plugin_op_is_dispatched_to_its_kernel_and_explained(platform: dsv4hal.Platform) -> None:
    """The op runs the fixture's Triton kernel (on the CPU under Triton's interpreter), which explain names with the
    reference it outranks."""
    decision = platform.explain("scale_rows")
    assert decision.chosen.name == "triton_scale_rows"
    text = decision.explain()
    assert "triton_scale_rows" in text and "scale_rows_reference" in text
    x, w = _inputs()
    assert torch.equal(platform.ops.scale_rows(x, w), kernel.scale_rows(x, w))


def test_plugin_op_signature_is_its_definition(platform: dsv4hal.Platform) -> None:
    """platform.ops.scale_rows shows the definition's signature, and its custom op's schema is derived from it."""
    assert inspect.signature(platform.ops.scale_rows) == contract.scale_rows.resolved_signature()
    overload, _ = custom_ops.flatten(platform.ops.scale_rows, *_inputs())
    assert [a.name for a in overload.default._schema.arguments] == ["x", "w", "eps"]


def test_plugin_op_compiles_fullgraph_and_passes_opcheck(platform: dsv4hal.Platform) -> None:
    """torch.compile(fullgraph=True) of a function calling the op matches eager, and its derived custom op passes
    opcheck; a bad argument under compile raises the contract's typed error."""
    x, w = _inputs()
    fn = torch.compile(lambda x, w: platform.ops.scale_rows(x, w) * 2, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(fn(x, w), platform.ops.scale_rows(x, w) * 2)
    overload, flat = custom_ops.flatten(platform.ops.scale_rows, x, w, eps=1e-5)
    torch.library.opcheck(overload, flat)
    torch._dynamo.reset()
    bad = torch.compile(lambda x, w: platform.ops.scale_rows(x, w, True), fullgraph=True, backend="aot_eager")
    with pytest.raises(InvalidArgumentError, match="'eps'"):
        bad(x, w)


def test_plugin_op_conformance_cells_pass(registry: Registry, platform: dsv4hal.Platform) -> None:
    """The conformance runner finds the plugin's cases and every eager cell passes on the fixture kernel."""
    report = run_conformance(platform.name, ops=["scale_rows"], registry=registry)
    cells = [c for c in report.cells if c.op == "scale_rows"]
    assert len(cells) == 3
    assert all(c.status == "pass" and c.implementation == "triton_scale_rows" for c in cells), cells


def test_plugin_op_is_listed(registry: Registry, platform: dsv4hal.Platform) -> None:
    """The op is in the registry's ops, the platform's ops and default decisions (what `dsv4hal info` prints), the
    direct-call entry, and the names an unknown op's error lists; a registry without the plugin has no such op."""
    assert "scale_rows" in registry.op_names
    assert "scale_rows" in [op.name for op in platform.ops]
    assert platform.default_decisions["scale_rows"].chosen.name == "triton_scale_rows"
    x, w = _inputs()
    torch.testing.assert_close(torch.ops.dsv4hal.scale_rows(x, w, 1e-6, platform.handle), kernel.scale_rows(x, w))
    with pytest.raises(UnknownOpError) as e:
        platform.ops["scale_row"]
    assert "scale_rows" in (e.value.remedy or "")
    with pytest.raises(UnknownOpError):
        dsv4hal.select_platform("cpu", registry=registry_with()).ops["scale_rows"]
