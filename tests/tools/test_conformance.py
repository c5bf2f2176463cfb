"""The conformance catalog as tests: every CPU-sized case in eager mode on each platform present here
(the CPU reference always; the GPU platform when this machine has one). The CLI report covers the
other modes; this keeps each cell visible to pytest."""

from __future__ import annotations

import pytest
import torch

import dsv4hal
from dsv4hal.conformance.runner import load_catalog, run_cell


def _platforms() -> list[str]:
    names = ["cpu"]
    if torch.cuda.is_available():
        names.append(dsv4hal.select_platform().name)
    return names


CASES = [(s, b) for s, b in load_catalog() if not s.gpu_only and "eager" in s.modes and "eager" not in s.unreachable]


@pytest.fixture(scope="module", params=_platforms())
def platform(request):  # noqa: ANN001, ANN201
    return dsv4hal.select_platform(request.param)


@pytest.mark.parametrize(("spec", "build"), CASES, ids=[f"{s.op}:{s.name}" for s, _ in CASES])
def test_cell(platform, spec, build) -> None:  # noqa: ANN001
    """Every conformance catalog cell passes on the platform with a finite error."""
    cell = run_cell(platform, spec, build, "eager")
    assert cell.status == "pass", f"{cell.implementation}: {cell.detail}"
    assert cell.max_error is not None and cell.max_error == cell.max_error  # NaN never passes


def test_report_covers_every_op_and_ratio() -> None:
    """The conformance catalog covers every op and attention compress ratios 0, 4 and 128."""
    specs = [s for s, _ in load_catalog()]
    assert {s.op for s in specs} == set(dsv4hal.OP_NAMES)
    assert {s.compress_ratio for s in specs if s.op.startswith("sparse_attention")} == {0, 4, 128}
    unreachable = [s for s in specs if s.unreachable]
    assert unreachable and all(all(v for v in s.unreachable.values()) for s in unreachable)


def test_catalog_lists_each_case_once() -> None:
    """The conformance catalog holds each (op, case) pair once."""
    from dsv4hal.conformance.runner import load_catalog

    keys = [(s.op, s.name) for s, _ in load_catalog()]
    assert len(keys) == len(set(keys)) and any(op == "moe_experts" for op, _ in keys)


class _Layout:  # a library object without __eq__, like triton_kernels' layout descriptors
    def __init__(self, shape: list[int], buf: torch.Tensor) -> None:
        self.shape, self.buf = shape, buf


def test_graph_replay_copy_compares_plain_objects_by_field() -> None:
    """Graph-replay copy_into copies equal-field objects' tensors and refuses differing fields."""
    from dsv4hal.conformance.runner import copy_into

    static = _Layout([2, 3], torch.zeros(2))
    copy_into(static, _Layout([2, 3], torch.ones(2)))  # another instance with equal fields: its tensors are copied
    assert torch.equal(static.buf, torch.ones(2))
    with pytest.raises(ValueError, match="differs between capture and replay"):
        copy_into(static, _Layout([4, 3], torch.ones(2)))


def test_nan_token_compare_wants_the_nan_rows_and_nothing_else() -> None:
    """moe_experts' nan-token cases: the tokens with a NaN input must come out as NaN rows (a kernel that quantizes the
    NaN to a finite code fails), nothing else may be NaN, and the other rows are compared as usual."""
    from dsv4hal.conformance.cases_moe import compare_experts_nan_rows
    from dsv4hal.conformance.types import Tolerance

    want = torch.randn(6, 8, dtype=torch.float64)
    want[2] = float("nan")
    tol = Tolerance(1e-3, 1e-2, "bf16 rounding")
    good = want.clone().to(torch.bfloat16).double()
    assert compare_experts_nan_rows(good.to(torch.bfloat16), want, tol)[1]
    finite = good.clone()
    finite[2] = 0.5  # the NaN quantized away
    extra = good.clone()
    extra[4, 1] = float("nan")
    partial = good.clone()
    partial[2, 3] = 1.0  # a row only partly NaN
    for got in (finite, extra, partial):
        ok, detail = compare_experts_nan_rows(got.to(torch.bfloat16), want, tol)[1:]
        assert not ok and "NaN rows" in detail
    off = good.clone()
    off[0] += 1.0  # a finite row out of tolerance
    assert not compare_experts_nan_rows(off.to(torch.bfloat16), want, tol)[1]
