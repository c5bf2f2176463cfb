"""What fp8_linear and fp8_grouped_linear (dsv4hal.ops.linear) check alike, each test run for both ops: the typed
errors of bad calls naming the argument and the remedy, arguments on another device, an output too large for the
device, checked mode's value checks, the CPU conformance cells (the reference, the Triton kernel forced),
torch.compile and opcheck."""

from __future__ import annotations

import pytest
import torch
from conftest import on_the_cpu

import dsv4hal
from dsv4hal import custom_ops
from dsv4hal.conformance import cases_linear as cases
from dsv4hal.conformance.runner import run_conformance
from dsv4hal.errors import Dsv4HalError, InvalidArgumentError
from dsv4hal.ops import linear as contract

LINEAR, GROUPED = "fp8_linear", "fp8_grouped_linear"
OPS = (LINEAR, GROUPED)
VALIDATE = {LINEAR: contract.validate, GROUPED: contract.validate_grouped}
CASES = {LINEAR: cases.CASES, GROUPED: cases.CASES_GROUPED}


def _args(op: str) -> dict:
    """A valid call on the CPU (the CPU platform's): T = 3, N = K = 256, two groups for the grouped op."""
    spec = cases._case("t", 3, 256, 256) if op == LINEAR else cases._grouped_case("t", 3, 2, 256, 256)
    return cases.build(spec, torch.device("cpu"), torch.Generator().manual_seed(0)).args


BAD_CALLS = [(LINEAR, *c) for c in (
    (lambda a: {**a, "x": a["x"].float()}, "x", ".to(torch.bfloat16)"),
    (lambda a: {**a, "x": a["x"][:, :200]}, "x", "pad x"),
    (lambda a: {**a, "x": a["x"][:, :128], "weight": a["weight"][:, :128]}, "weight_scale", "quantize_fp8_block"),
    (lambda a: {**a, "weight": a["weight"][:, :128]}, "weight", "[out_features, in_features]"),
    (lambda a: {**a, "weight": a["weight"].view(torch.uint8)}, "weight", "view(torch.float8_e4m3fn)"),
    (lambda a: {**a, "weight": a["weight"].float()}, "weight", "quantize_fp8_block"),
    (lambda a: {**a, "weight": a["weight"][:0]}, "weight", "[out_features, in_features]"),
    (lambda a: {**a, "weight_scale": a["weight_scale"].double()}, "weight_scale", ".to(torch.float32)"),
    (lambda a: {**a, "weight_scale": a["weight_scale"][:, :1]}, "weight_scale", "quantize_fp8_block"),
    (lambda a: {**a, "weight_scale": a["weight_scale"].to("meta")}, "weight_scale", None),
    (lambda a: {**a, "weight": a["weight"].to("meta")}, "weight", None),
    (lambda a: {**a, "x": torch.cat([a["x"], a["x"]], 1)[:, ::2]}, "x", ".contiguous()"),
    (lambda a: {**a, "x": a["x"][0]}, "x", None),
    (lambda a: {**a, "x": a["x"][:1].expand(2**40, 256)}, "x", "smaller batch"),
)] + [(GROUPED, *c) for c in (
    (lambda a: {**a, "x": a["x"].float()}, "x", ".to(torch.bfloat16)"),
    (lambda a: {**a, "x": a["x"][:, 0]}, "x", None),  # fp8_linear's [T, K]
    (lambda a: {**a, "x": a["x"][..., :200]}, "x", "pad x"),
    (lambda a: {**a, "x": a["x"][:, :0]}, "x", "o_groups"),
    (lambda a: {**a, "x": a["x"][:, :1]}, "weight", "w.view(1, -1, 256)"),  # G = 1 against a weight of 2
    (lambda a: {**a, "weight": a["weight"][0]}, "weight", None),  # rank 2
    (lambda a: {**a, "weight": a["weight"].transpose(1, 2)}, "weight", ".contiguous()"),
    (lambda a: {**a, "weight": a["weight"][:, :, :128]}, "weight", "[G, N, K]"),
    (lambda a: {**a, "weight": a["weight"][:, :0]}, "weight", "[G, N, K]"),
    (lambda a: {**a, "weight": a["weight"].view(torch.uint8)}, "weight", "view(torch.float8_e4m3fn)"),
    (lambda a: {**a, "weight": a["weight"].float()}, "weight", "quantize_fp8_block"),
    (lambda a: {**a, "weight_scale": a["weight_scale"][0]}, "weight_scale", "per group"),
    (lambda a: {**a, "weight_scale": a["weight_scale"][:1]}, "weight_scale", "quantize_fp8_block"),
    (lambda a: {**a, "weight_scale": a["weight_scale"].double()}, "weight_scale", ".to(torch.float32)"),
    (lambda a: {**a, "weight_scale": a["weight_scale"].to("meta")}, "weight_scale", None),
    (lambda a: {**a, "x": torch.cat([a["x"], a["x"]], 2)[..., ::2]}, "x", ".contiguous()"),
    (lambda a: {**a, "x": a["x"][:1].expand(2**38, 2, 256)}, "x", "smaller batch"),
)]


@pytest.mark.parametrize(("op", "change", "arg", "remedy"), BAD_CALLS)
def test_bad_calls_raise_typed_errors_naming_the_argument_and_remedy(op: str, change, arg: str,  # noqa: ANN001
                                                                     remedy: str | None) -> None:
    """Wrong dtypes or ranks, K not a multiple of 128, no groups, a G, N or K that differs between x, the weight and
    its scales, a transposed weight, scale shapes or devices, a strided K and a huge output raise
    InvalidArgumentError naming the argument, with the remedy where there is one; nothing else is raised."""
    p = dsv4hal.select_platform("cpu")
    with pytest.raises(InvalidArgumentError) as e:
        p.ops[op](**change(_args(op)))
    assert f"'{arg}'" in str(e.value)
    if remedy is not None:
        assert remedy in (e.value.remedy or ""), e.value.remedy


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("arg", ["weight", "weight_scale"])
def test_the_contract_refuses_an_argument_on_another_device(op: str, arg: str) -> None:
    """validate refuses a weight or scale on another device than x, naming it and the move."""
    args = _args(op)
    args[arg] = args[arg].to("meta")
    with pytest.raises(InvalidArgumentError, match=f"'{arg}'") as e:
        VALIDATE[op](**args)
    assert ".to('cpu')" in (e.value.remedy or "")


@pytest.mark.parametrize("op", OPS)
def test_the_contract_refuses_an_output_larger_than_the_device(op: str) -> None:
    """An expand view of x (no memory of its own) whose output, every group's, would not fit the device is refused
    by the contract's output-size check."""
    args = _args(op)
    args["x"] = args["x"][:1].expand(2**36, *args["x"].shape[1:])
    with pytest.raises(InvalidArgumentError, match=r"'x \(output size\)'"):
        VALIDATE[op](**args)


@pytest.mark.parametrize("op", OPS)
def test_checked_mode_refuses_non_finite_values_and_unchecked_runs(op: str) -> None:
    """Checked mode refuses a NaN in x and an inf in weight_scale (reading values); unchecked mode runs the call, the
    NaN's (token, group) row NaN."""
    args = _args(op)
    args["x"][1].view(-1)[5] = float("nan")  # token 1, group 0
    checked, unchecked = dsv4hal.select_platform("cpu", checked=True), dsv4hal.select_platform("cpu")
    with pytest.raises(InvalidArgumentError, match="'x'"):
        checked.ops[op](**args)
    out = unchecked.ops[op](**args)
    assert bool(torch.isnan(out[1].view(-1, out.shape[-1])[0]).all())
    good = _args(op)
    good["weight_scale"].view(-1)[1] = float("inf")
    with pytest.raises(InvalidArgumentError, match="'weight_scale'"):
        checked.ops[op](**good)


@pytest.mark.parametrize("op", OPS)
def test_every_error_of_a_drawn_bad_call_is_typed(op: str) -> None:
    """Arguments of the wrong kind entirely (None, lists, scalars) give typed errors only."""
    p = dsv4hal.select_platform("cpu")
    a = _args(op)
    for name in a:
        for junk in (None, [1, 2], 3.0):
            with pytest.raises(Dsv4HalError):
                p.ops[op](**{**a, name: junk})


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("triton", [False, pytest.param(True, marks=on_the_cpu)])
def test_cpu_conformance_cells_pass(op: str, triton: bool) -> None:
    """Every CPU conformance cell of the op passes, on the reference and with the Triton kernel forced."""
    forced = f"triton_{op}" if triton else None
    with dsv4hal.overrides(kernels={op: forced} if forced else {}):
        report = run_conformance("cpu", ops=[op])
    cells = [c for c in report.cells if c.op == op and c.status != "not-run"]
    assert len(cells) == sum(not s.gpu_only for s in CASES[op])
    assert all(c.status == "pass" and c.implementation == (forced or "torch_reference") for c in cells), cells


@pytest.mark.parametrize("op", OPS)
def test_compiles_fullgraph_and_passes_opcheck(op: str) -> None:
    """torch.compile(fullgraph=True) of a function calling the op matches eager; its custom op passes opcheck (the
    schema check is left out: its allclose has no CPU kernel for float8); a bad argument under compile raises the
    contract's typed error."""
    p = dsv4hal.select_platform("cpu")
    x, w, s = _args(op).values()
    bound = p.ops[op]
    fn = torch.compile(lambda x, w, s: bound(x, w, s).float() * 2, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(fn(x, w, s), bound(x, w, s).float() * 2)
    overload, flat = custom_ops.flatten(bound, x, w, s)
    torch.library.opcheck(overload, flat, test_utils=("test_autograd_registration", "test_faketensor",
                                                      "test_aot_dispatch_dynamic"))
    torch._dynamo.reset()
    bad = torch.compile(lambda x, w, s: bound(x, w, s), fullgraph=True, backend="aot_eager")
    with pytest.raises(InvalidArgumentError, match="'weight_scale'"):
        bad(x, w, s[..., :1])
