"""What one conformance cell is made of: a case spec (data), a fixture built from it (inputs
plus the oracle's answer computed from the unquantized inputs) and a comparison."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

MODES = ("eager", "graph", "verify", "draft_extend")


@dataclass(frozen=True)
class Tolerance:
    atol: float
    rtol: float
    reason: str


@dataclass(frozen=True)
class CaseSpec:
    """One row of the catalog. `params` is plain data (shapes, seeds, flags) read by the op's builder.

    `modes` lists the runner modes this case is meant for; `unreachable` maps a mode to the reason
    production never reaches it (the cell is reported production-unreachable, not run);
    `deferred` likewise for work not done yet. `gpu_only` cases are too large for the CPU."""

    op: str
    name: str
    params: Mapping[str, Any] = field(default_factory=dict)
    compress_ratio: int | None = None
    modes: tuple[str, ...] = ("eager", "graph")
    unreachable: Mapping[str, str] = field(default_factory=dict)
    deferred: Mapping[str, str] = field(default_factory=dict)
    gpu_only: bool = False


@dataclass
class Fixture:
    """Inputs for the op under test and the oracle's expected result.

    `args` are the op's keyword arguments. `extract(ret, args)` turns the op's return value into the
    thing compared (e.g. the cache bytes for an in-place store); identity when None.
    `compare(got, expected)` returns (max_error, passed, detail); the default compares tensors with
    the op's tolerance (|got-exp| <= atol + rtol*|exp|), treating NaN as failure."""

    args: dict[str, Any]
    expected: Any
    extract: Callable[[Any, dict[str, Any]], Any] | None = None
    compare: Callable[[Any, Any], tuple[float, bool, str]] | None = None
    tolerance: Tolerance | None = None


def compare_close(got: Any, expected: Any, tol: Tolerance, slack: torch.Tensor | None = None
                  ) -> tuple[float, bool, str]:
    """Elementwise |got - exp| <= atol + rtol*|exp| (+ slack, an elementwise error allowance of a case whose
    error scales with something other than |exp|) over tensors (or tuples of tensors).
    Infinite expected values must be matched exactly; NaN anywhere in `got` fails."""
    if isinstance(expected, (tuple, list)):
        worst, ok, details = 0.0, True, []
        for i, (g, e) in enumerate(zip(got, expected, strict=True)):
            err, good, d = compare_close(g, e, tol)
            worst, ok = max(worst, err), ok and good
            if not good:
                details.append(f"[{i}] {d}")
        return worst, ok, "; ".join(details)
    g = got.detach().to("cpu", torch.float64)
    e = expected.detach().to("cpu", torch.float64)
    if g.shape != e.shape:
        return float("inf"), False, f"shape {tuple(g.shape)} != expected {tuple(e.shape)}"
    if torch.isnan(g).any():
        return float("nan"), False, "NaN in output"
    inf = torch.isinf(e)
    if not torch.equal(g[inf], e[inf]):
        return float("inf"), False, "infinite entries differ"
    fin = ~inf
    diff = (g[fin] - e[fin]).abs()
    if diff.numel() == 0:
        return 0.0, True, ""
    bound = tol.atol + tol.rtol * e[fin].abs()
    if slack is not None:
        bound = bound + slack.detach().to("cpu", torch.float64)[fin]
    err = float(diff.max())
    ok = bool((diff <= bound).all()) and bool(torch.isfinite(g[fin]).all())
    extra = " + the case's slack" if slack is not None else ""
    return err, ok, "" if ok else f"max |diff| {err:.3g} over atol {tol.atol} + rtol {tol.rtol}*|expected|{extra}"


# Builders: op catalog modules expose CASES: list[CaseSpec] and build(spec, device, gen) -> Fixture.
Builder = Callable[[CaseSpec, torch.device, torch.Generator], Fixture]


Builder = Callable[[CaseSpec, torch.device, torch.Generator], Fixture]


def builder_for(catalog: str, builders: Mapping[str, Builder], spec: CaseSpec) -> Builder:
    """The fixture builder of spec.op in a catalog module that covers several ops."""
    try:
        return builders[spec.op]
    except KeyError:
        raise ValueError(f"{catalog} cannot build op {spec.op!r}; expected one of {tuple(builders)}") from None
