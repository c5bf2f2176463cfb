"""The conformance matrix: every op's catalog, case by mode, run on one platform against the oracle.

Statuses: pass, fail, production-unreachable, blocked, deferred, not-run (each with why)."""

from __future__ import annotations

import dataclasses
import importlib
import os
import re
import time
import traceback
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch

from dsv4hal import hardware
from dsv4hal.conformance.cells import DESELECTED, STATUSES, Cell, Report, clone_args, copy_into  # noqa: F401
from dsv4hal.conformance.types import CaseSpec, Fixture, Tolerance, compare_close
from dsv4hal.errors import Dsv4HalError
from dsv4hal.ops.catalog import MODULES, OPS_BY_NAME
from dsv4hal.platform import Platform, load_registry, select_platform
from dsv4hal.prepared import PreparedWeights
from dsv4hal.registry import Registry
from dsv4hal.selection import select_kernel

CATALOG_MODULES = MODULES  # dsv4hal.conformance.cases_<module> for every built-in op module


def load_catalog(ops: Iterable[str] | None = None, *,
                 registry: Registry | None = None) -> list[tuple[CaseSpec, Callable[..., Fixture]]]:
    """The conformance cases (and their builders) of the ops of `registry` (its plugins' ops too; the built-in
    catalog without one), of those named in `ops` if given."""
    wanted = set(ops) if ops else None
    specs = (registry.ops if registry is not None else OPS_BY_NAME).values()
    out = []
    for module in dict.fromkeys(o.cases for o in specs if wanted is None or o.name in wanted):
        mod = importlib.import_module(module)
        specs = [s for attr in sorted(dir(mod)) if attr.startswith("CASES") for s in getattr(mod, attr)]
        out += [(s, mod.build) for s in specs if wanted is None or s.op in wanted]
    return out


def _deselected(spec: CaseSpec, platform: str, impl: str) -> list[Cell]:
    return _not_run_cells(spec, platform, impl, DESELECTED)


def _to_device(x: Any, device: torch.device) -> Any:
    if isinstance(x, torch.Tensor):
        return x.to(device)
    if isinstance(x, (tuple, list)):
        return type(x)(_to_device(v, device) for v in x)
    return x


def _judge(fx: Fixture, got: Any, expected: Any, tol: Tolerance) -> tuple[float, bool, str]:
    if fx.compare is not None:
        return fx.compare(got, expected)
    return compare_close(got, expected, tol)


def _graph_tolerance(op: str, tol: Tolerance) -> Tolerance:
    if op.startswith("sparse_attention"):
        from dsv4hal.conformance.cases_sparse_attention import GRAPH_TOLERANCE

        return GRAPH_TOLERANCE
    return tol


def run_cell(platform: Platform, spec: CaseSpec, build: Callable[..., Fixture], mode: str, seed: int = 0) -> Cell:
    device = torch.device(platform.device_type)
    cell = Cell(spec.op, "", spec.name, mode, spec.compress_ratio, platform.name, "not-run")
    bound = platform.ops[spec.op]
    spec_m = dataclasses.replace(spec, params={**spec.params, "mode": mode})
    t0 = time.perf_counter()
    try:
        fx = _prepared(bound, build(spec_m, device, torch.Generator().manual_seed(seed)))
        weights = fx.args.get(bound.spec.weights_arg or "")
        if isinstance(weights, PreparedWeights):
            cell.implementation = weights.implementation
        else:
            cell.implementation = bound.decide(bound.case_of(**fx.args)).chosen.name
        tol = fx.tolerance or Tolerance(0, 0, "exact")
        if mode == "graph":
            tol = _graph_tolerance(spec.op, tol)
            fx_new = _prepared(bound, build(spec_m, device, torch.Generator().manual_seed(seed + 1)))
            got, args = _run_graph(bound, fx, fx_new)
            expected, fx_used = fx_new.expected, fx_new
        else:
            args = fx.args
            ret = bound(**args)
            if device.type == "cuda":
                torch.cuda.synchronize()
            got, expected, fx_used = ret, fx.expected, fx
        if fx_used.extract is not None:
            got = fx_used.extract(got, args)
        err, ok, detail = _judge(fx_used, got, expected, tol)
        cell.status, cell.max_error, cell.detail = ("pass" if ok else "fail"), err, detail
        cell.tolerance = {"atol": tol.atol, "rtol": tol.rtol, "reason": tol.reason}
    except Dsv4HalError as exc:
        cell.status, cell.detail = "blocked", str(exc).splitlines()[0]
    except Exception as exc:  # a crash in a kernel is a failure of that cell, not of the run
        cell.status = "fail"
        cell.detail = f"{type(exc).__name__}: {exc}"[:500]
        if os.environ.get("DSV4HAL_DEBUG") == "1":
            traceback.print_exc()
    cell.seconds = time.perf_counter() - t0
    return cell


def expected_tokens(args: Mapping[str, Any]) -> int | None:
    """The token count an op with weights is prepared for in a fixture: the rows of its activations (x)."""
    x = args.get("x")
    return x.shape[0] or None if isinstance(x, torch.Tensor) and x.dim() > 0 else None


def _prepared(bound: Any, fx: Fixture) -> Fixture:
    """Ops with weights get them prepared for this platform's kernel first, as an engine does at load, for the
    case's token count (a prefill case gets the kernel a prefill server would)."""
    name = bound.spec.weights_arg
    if name and not isinstance(fx.args.get(name), PreparedWeights):
        fx.args[name] = bound.prepare_weights(fx.args[name], tokens=expected_tokens(fx.args))
    return fx


def _run_graph(bound: Any, fx: Fixture, fx_new: Fixture) -> tuple[Any, dict[str, Any]]:
    """Capture the op once on fx's inputs, write fx_new's inputs into the same buffers, replay."""
    from dsv4hal.cuda_graphs import capture

    static = clone_args(fx.args)
    graph, ret = capture(lambda: bound(**static))
    copy_into(static, fx_new.args)
    graph.replay()
    torch.cuda.synchronize()
    return ret, static


def _not_run_cells(spec: CaseSpec, platform: str, impl: str, why: str) -> list[Cell]:
    return [Cell(spec.op, impl, spec.name, m, spec.compress_ratio, platform, "not-run", detail=why)
            for m in spec.modes]


def _static_status(spec: CaseSpec, mode: str, on_gpu: bool) -> tuple[str, str] | None:
    if mode in spec.unreachable:
        return "production-unreachable", spec.unreachable[mode]
    if mode in spec.deferred:
        return "deferred", spec.deferred[mode]
    if spec.gpu_only and not on_gpu:
        return "not-run", "full-size shape: run on a GPU platform (too slow for the CPU reference)"
    if mode == "graph" and not on_gpu:
        return "not-run", "CUDA graphs need a GPU"
    return None


def run_conformance(platform_name: str | None = None, *, ops: Iterable[str] | None = None,
                    progress: Callable[[int, int, Cell], None] | None = None, seed: int = 0,
                    cases: str | None = None, registry: Registry | None = None) -> Report:
    """Run the catalog on the selected platform (ops: a subset of ops; cases: a regular expression the case
    names must match; registry: the plugins' registry, whose ops' cases are run, loaded if not given). A
    platform that does not fit this machine yields not-run cells naming the implementation it would use and why it
    did not run."""
    from dsv4hal.conformance.decode_step import RATIOS, case_name, decode_step_cells
    from dsv4hal.conformance.decode_step_verify import verify_cases, verify_cells

    registry = registry or load_registry()
    full = load_catalog(registry=registry)
    wanted = _check_ops(ops, full)
    pattern = _case_pattern(cases)
    catalog = [c for c in full
               if (wanted is None or c[0].op in wanted) and (pattern is None or pattern.search(c[0].name))]
    step_ratios = tuple(r for r in RATIOS if (wanted is None or "decode_step" in wanted)
                        and (pattern is None or pattern.search(case_name(r))))
    verify = verify_cases(pattern) if wanted is None or "decode_step" in wanted else ()
    if not catalog and not step_ratios and not verify:
        names = [s.name for s, _ in full if wanted is None or s.op in wanted][:6]
        raise Dsv4HalError(f"no conformance case matches ops {sorted(wanted) if wanted else 'all'} and --cases "
                           f"{cases!r}", remedy="--cases is a regular expression searched in case names, such as: "
                           + "; ".join(names + [case_name(RATIOS[0])]))
    chosen = {id(c[0]) for c in catalog}
    skipped = [c for c in full if id(c[0]) not in chosen]
    info = hardware.detect(registry.requirements())
    spec_platform = registry.platforms.get(platform_name or "")
    fits = spec_platform is not None and not spec_platform.claims(info)
    if platform_name and spec_platform is not None and not fits:
        return _absent_platform_report(platform_name, catalog, info, registry)
    platform = select_platform(platform_name, info=info, registry=registry)
    report = Report(platform.name, platform.info.to_json())
    on_gpu = platform.device_type == "cuda"
    todo = [(s, b, m) for s, b in catalog for m in s.modes]
    # a decode_step ratio, and a verify case (ratio, tokens per request), yields an eager and a graph cell
    total = len(todo) + 2 * len(step_ratios) + 2 * len(verify)
    for i, (spec, build, mode) in enumerate(todo):
        static = _static_status(spec, mode, on_gpu)
        if static is not None:
            impl = _impl_name(platform, spec)
            cell = Cell(spec.op, impl, spec.name, mode, spec.compress_ratio, platform.name, static[0],
                        detail=static[1])
        else:
            cell = run_cell(platform, spec, build, mode, seed)
        report.cells.append(cell)
        if progress:
            progress(i + 1, total, cell)
    for spec, _ in skipped:
        report.cells += _deselected(spec, platform.name, _impl_name(platform, spec))
    done = len(todo)
    steps = [lambda r=r: decode_step_cells(platform, seed, ratios=(r,)) for r in step_ratios]
    steps += [lambda c=c: verify_cells(platform, seed, cases=(c,)) for c in verify]
    for cells in steps:
        for cell in cells():
            report.cells.append(cell)
            done += 1
            if progress:
                progress(done, total, cell)
    return report


def _check_ops(ops: Iterable[str] | None, catalog: list) -> set[str] | None:
    if ops is None:
        return None
    wanted = {o.strip() for o in ops if o.strip()}
    known = {s.op for s, _ in catalog} | {"decode_step"}
    unknown = sorted(wanted - known)
    if unknown or not wanted:
        raise Dsv4HalError(f"unknown op(s) {', '.join(map(repr, unknown)) or '(none given)'}",
                           remedy=f"choose from {', '.join(sorted(known))} (comma-separated)")
    return wanted


def _case_pattern(cases: str | None) -> re.Pattern[str] | None:
    if not cases:
        return None
    try:
        return re.compile(cases)
    except re.error as exc:
        raise Dsv4HalError(f"--cases {cases!r} is not a regular expression: {exc}",
                           remedy="escape special characters with a backslash, e.g. --cases 'mxfp4-T(1|8)$'") from None


def _impl_name(platform: Platform, spec: CaseSpec) -> str:
    try:
        return platform.ops[spec.op].decide().chosen.name
    except Dsv4HalError:
        return "-"


def _absent_platform_report(name: str, catalog: list, info: hardware.PlatformInfo, registry: Any) -> Report:
    """Cells of a platform with no hardware here: not-run, with the kernel it would bind were its
    vendor libraries installed (decided on a simulated PlatformInfo of its first architecture)."""
    spec = registry.platforms[name]
    sim = hardware.simulated(spec.archs[0], libraries={r: "simulated" for r in registry.requirements() | {"torch"}})
    from dsv4hal.override import current

    why = f"no hardware: {'; '.join(spec.claims(info))}"
    report = Report(name, {**info.to_json(), "simulated_for_selection": sim.arch})
    for case, _ in catalog:
        ops_spec = registry.ops[case.op]
        try:
            impl = select_kernel(registry, case.op, ops_spec.default_case, sim, name, current()).chosen.name
        except Dsv4HalError:
            impl = "-"
        for cell in _not_run_cells(case, name, impl, why):
            static = _static_status(case, cell.mode, True)
            if static and static[0] != "not-run":
                cell.status, cell.detail = static
            report.cells.append(cell)
    return report
