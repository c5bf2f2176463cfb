"""Property-based fuzzing of every op's contract.

Each example takes a valid call from the conformance catalog (small cases), optionally breaks one thing
(dtype, rank, strides, an expand view of a huge size, the device, the argument's type, a scalar, or, for ops
whose checked mode promises it, a value such as -2 or an index past the cache or a NaN), and calls the op on
the CPU platform (checked or not). The outcome must be one of:
  - a typed error (a Dsv4HalError subclass);
  - accepted, and equal to the op's reference run on contiguous copies of the same arguments (valid values);
  - accepted with values the contract leaves unspecified (unchecked mode only; no exception);
never a generic exception, never a refused-in-checked-mode value accepted, never a crash. The portable
Triton kernels of the cheap ops are fuzzed the same way, forced, under the interpreter on the CPU.

Profiles: CI runs a handful of examples per op (seconds). DSV4HAL_FUZZ_EXAMPLES=2000 runs that many per op;
DSV4HAL_FUZZ_JSON=path writes the counts (bench/results/cpu/fuzz-long.json holds a long run's)."""

from __future__ import annotations

import collections
import dataclasses
import functools
import json
import math
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import dsv4hal  # noqa: E402
from dsv4hal.conformance.runner import _prepared, load_catalog  # noqa: E402
from dsv4hal.errors import Dsv4HalError  # noqa: E402
from dsv4hal.ops.catalog import OP_NAMES, OPS_BY_NAME  # noqa: E402
from dsv4hal.plugins import import_target  # noqa: E402
from dsv4hal.prepared import PreparedWeights  # noqa: E402

LONG = int(os.environ.get("DSV4HAL_FUZZ_EXAMPLES", "0"))
FUZZ = settings(max_examples=LONG or 6, deadline=None, database=None, derandomize=not LONG,
                suppress_health_check=list(HealthCheck))
FUZZ_TRITON = settings(FUZZ, max_examples=max(LONG // 4, 1) if LONG else 4)
DEV = torch.device("cpu")  # the CPU platform; the GPU platforms are fuzzed through the conformance matrix
I32_MIN = -(2**31)
HUGE = 2**36
COUNTS: collections.Counter[str] = collections.Counter()
FINDINGS: list[str] = []
TRITON = {"pack_store": "triton_pack_store", "dequant_gather": "triton_dequant_gather",
          "indexer_topk": "triton_radix_topk", "build_attention_metadata": "triton_attention_metadata",
          "fp8_linear": "triton_fp8_linear", "fp8_grouped_linear": "triton_fp8_grouped_linear"}


@pytest.fixture(scope="module", autouse=True)
def _write_counts():  # noqa: ANN202
    start = time.perf_counter()
    yield
    path = os.environ.get("DSV4HAL_FUZZ_JSON")
    if path:
        out = {"examples_per_op": LONG or FUZZ.max_examples, "seconds": round(time.perf_counter() - start, 1),
               "torch": torch.__version__, "counts": {
                   "calls": COUNTS["calls"], "typed_errors": COUNTS["typed"],
                   "accepted_and_matching": COUNTS["matching"],
                   "accepted_unspecified_unchecked": COUNTS["unspecified"],
                   "generic_exceptions": COUNTS["generic"], "accepted_but_wrong": COUNTS["wrong"], "crashes": 0},
               "by_mutation": {k[4:]: v for k, v in sorted(COUNTS.items()) if k.startswith("mut:")},
               "by_op": {k[3:]: v for k, v in sorted(COUNTS.items()) if k.startswith("op:")},
               "findings": FINDINGS[:50],
               "command": "DSV4HAL_FUZZ_EXAMPLES=2000 DSV4HAL_FUZZ_JSON=bench/results/cpu/fuzz-long.json "
                          "python3 -m pytest -q tests/core/test_fuzz_contracts.py"}
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(out, indent=1) + "\n")


# ------------------------------------------------------------------ platforms and the catalog

@functools.cache
def _platform(checked: bool, triton: bool) -> Any:
    if triton:
        with dsv4hal.overrides(kernels=TRITON):
            return dsv4hal.select_platform("cpu", checked=checked)
    return dsv4hal.select_platform("cpu", checked=checked)


@functools.cache
def _cases(op: str) -> tuple[tuple[str, Callable[..., Any]], ...]:
    skip = ("1000", "seq257", "ctx200")  # the slowest small cases: the fuzz wants many calls, not big ones
    small = [(s.name, b) for s, b in load_catalog([op]) if s.op == op and not s.gpu_only]
    return tuple((n, b) for n, b in small if not any(x in n for x in skip)) or tuple(small)


@functools.cache
def _fixture(op: str, name: str) -> dict[str, Any]:
    spec, build = next((s, b) for s, b in load_catalog([op]) if s.name == name)
    fx = build(spec, DEV, torch.Generator().manual_seed(0))
    return _prepared(_platform(False, False).ops[op], fx).args


def _clone(x: Any, contiguous: bool = False) -> Any:
    """A deep copy of tensors (optionally made contiguous); dataclasses are rebuilt with copied fields."""
    if isinstance(x, torch.Tensor):
        if x.device.type == "meta" or (x.numel() > 1 and 0 in x.stride()):
            return x  # nothing to copy, or an expand view (read-only: copying it is what must never happen)
        if contiguous:
            return x.contiguous().clone()
        # the same view over new memory: clone() would make a strided view dense
        extent = 1 + sum((n - 1) * st for n, st in zip(x.shape, x.stride())) if x.numel() else 0
        buf = torch.empty(x.storage_offset() + extent, dtype=x.dtype, device=x.device)
        y = buf.as_strided(x.shape, x.stride(), x.storage_offset())
        y.copy_(x)
        return y
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return dataclasses.replace(x, **{f.name: _clone(getattr(x, f.name), contiguous)
                                         for f in dataclasses.fields(x) if f.init})
    if isinstance(x, dict):
        return {k: _clone(v, contiguous) for k, v in x.items()}
    return x


def _leaves(args: dict[str, Any]) -> list[tuple[str, ...]]:
    """Paths to tensors: top-level arguments and the fields of dataclass arguments (caches, out, payloads)."""
    paths: list[tuple[str, ...]] = []
    for name, v in args.items():
        if isinstance(v, torch.Tensor):
            paths.append((name,))
        elif dataclasses.is_dataclass(v) and not isinstance(v, type):
            inner = v.payload if isinstance(v, PreparedWeights) else v
            prefix = (name, "payload") if isinstance(v, PreparedWeights) else (name,)
            if dataclasses.is_dataclass(inner):
                paths += [(*prefix, f.name) for f in dataclasses.fields(inner)
                          if f.init and isinstance(getattr(inner, f.name), torch.Tensor)]
    return paths


def _get(args: dict[str, Any], path: tuple[str, ...]) -> Any:
    v: Any = args[path[0]]
    for p in path[1:]:
        v = getattr(v, p)
    return v


def _set(args: dict[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
    def put(obj: Any, rest: tuple[str, ...]) -> Any:
        if not rest:
            return value
        return dataclasses.replace(obj, **{rest[0]: put(getattr(obj, rest[0]), rest[1:])})
    return {**args, path[0]: put(args[path[0]], path[1:])}


# ------------------------------------------------------------------ mutations

DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.int32, torch.int64, torch.uint8, torch.bool)


def _strided(t: torch.Tensor, dim: int) -> torch.Tensor:
    shape = list(t.shape)
    shape[dim] *= 2
    big = torch.zeros(shape, dtype=t.dtype, device=t.device)
    view = big.unflatten(dim, (t.shape[dim], 2)).select(dim + 1, 0)
    view.copy_(t)
    return view


@st.composite
def structural(draw: st.DrawFn, args: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """Break the layout or type of one argument; values stay valid (an accepted call must match the reference)."""
    kind = draw(st.sampled_from(["none", "dtype", "rank", "stride", "expand", "device", "type", "scalar"]))
    leaves = _leaves(args)
    scalars = [k for k, v in args.items() if isinstance(v, (int, float)) and v is not None]
    if kind == "scalar":
        if not scalars:
            return "none", args
        name = draw(st.sampled_from(scalars))
        v = args[name]
        new = draw(st.sampled_from([True, False, 0, -1, math.inf, -math.inf, math.nan, "1", None, float(v),
                                    int(v) if math.isfinite(v) else 0, v * 2]))
        return f"scalar:{name}={new!r}", {**args, name: new}
    if kind == "none" or not leaves:
        return "none", args
    path = draw(st.sampled_from(leaves))
    if "payload" in path and kind != "device":
        return "none", args  # prepared weights are opaque: only prepare_weights makes them (their device is checked)
    t: torch.Tensor = _get(args, path)
    label = ".".join(path)
    if kind == "dtype":
        dt = draw(st.sampled_from([d for d in DTYPES if d != t.dtype]))
        return f"dtype:{label}:{dt}", _set(args, path, t.to(dt))
    if kind == "rank":
        how = draw(st.sampled_from(["unsqueeze", "flatten", "select"]))
        if how == "unsqueeze" or t.dim() == 0:
            return f"rank:{label}:+1", _set(args, path, t.unsqueeze(0))
        if how == "flatten" and t.dim() > 1:
            return f"rank:{label}:flat", _set(args, path, t.reshape(-1))
        if t.shape[0] == 0:
            return "none", args
        return f"rank:{label}:[0]", _set(args, path, t[0])
    if kind == "stride":
        if t.dim() == 0:
            return "none", args
        dim = draw(st.integers(0, t.dim() - 1))
        return f"stride:{label}:dim{dim}", _set(args, path, _strided(t, dim))
    if kind == "expand":
        if t.dim() == 0 or t.numel() == 0:
            return "none", args
        base = t.narrow(0, 0, 1)
        if math.prod(t.shape[1:]) * HUGE >= 2**62:
            return "none", args
        return f"expand:{label}:{HUGE}", _set(args, path, base.expand(HUGE, *t.shape[1:]))
    if kind == "device":
        return f"device:{label}:meta", _set(args, path, t.to("meta"))
    new = draw(st.sampled_from([None, 3.0, [1, 2], "x"]))
    return f"type:{label}:{type(new).__name__}", _set(args, path, new)


def _poke(t: torch.Tensor, flat_index: int, value: float | int) -> torch.Tensor:
    t = t.clone()
    t.view(-1)[flat_index % t.numel()] = value
    return t


def _num_slots(cache: Any) -> int:
    return int(cache.num_slots)


# For each op whose contract promises checked-mode value checks: (argument, bad values) generators. Each
# returns the mutated args, or None when the chosen argument is empty.
def _index_values(limit: int) -> list[int]:
    return [-2, I32_MIN, limit, limit + 7, 2**31 - 1]


def _bad_values(op: str, args: dict[str, Any]) -> list[tuple[str, Callable[[int, int], dict[str, Any] | None]]]:
    out: list[tuple[str, Callable[[int, int], dict[str, Any] | None]]] = []

    def index(name: str, limit: int) -> None:
        t = args[name]

        def f(i: int, j: int) -> dict[str, Any] | None:
            if t.numel() == 0:
                return None
            values = _index_values(limit)
            return {**args, name: _poke(t, i, values[j % len(values)])}
        out.append((name, f))

    def nonfinite(name: str) -> None:
        t = args[name]

        def f(i: int, j: int) -> dict[str, Any] | None:
            if t.numel() == 0:
                return None
            return {**args, name: _poke(t, i, (math.nan, math.inf, -math.inf)[j % 3])}
        out.append((name, f))

    def lengths(name: str, width: int) -> None:
        t = args[name]

        def f(i: int, j: int) -> dict[str, Any] | None:
            if t.numel() == 0:
                return None
            return {**args, name: _poke(t, i, (-1, width + 1, I32_MIN)[j % 3])}
        out.append((name, f))

    if op == "sparse_attention_decode":
        index("swa_indices", _num_slots(args["swa_cache"]))
        lengths("swa_lengths", args["swa_indices"].shape[1])
        nonfinite("q")
        nonfinite("sink")
        if args.get("extra_cache") is not None:
            index("extra_indices", _num_slots(args["extra_cache"]))
            lengths("extra_lengths", args["extra_indices"].shape[1])
    elif op == "sparse_attention_prefill":
        index("indices", args["kv"].shape[0])
        lengths("lengths", args["indices"].shape[1])
        for n in ("q", "kv", "sink"):
            nonfinite(n)
    elif op in ("pack_store", "dequant_gather"):
        index("loc", _num_slots(args["cache"]))
        if op == "pack_store":
            nonfinite("k")
    elif op == "indexer_topk":
        nonfinite("scores")
        lengths("lengths", args["scores"].shape[1])
        if args.get("page_table") is not None:
            pt, ln, ps = args["page_table"], args["lengths"], args.get("page_size", 64)

            def page(i: int, j: int) -> dict[str, Any] | None:
                used = [(r, c) for r in range(pt.shape[0]) for c in range(min(pt.shape[1], -(-int(ln[r]) // ps)))]
                if not used:
                    return None
                r, c = used[i % len(used)]
                bad = pt.clone()
                bad[r, c] = (-1, -2, I32_MIN)[j % 3]
                return {**args, "page_table": bad}
            out.append(("page_table", page))
    elif op == "build_attention_metadata":
        pos, pt = args["positions"], args["page_table"]

        def position(i: int, j: int) -> dict[str, Any] | None:
            if pos.numel() == 0:
                return None
            return {**args, "positions": _poke(pos, i, (-1, pt.shape[1] * 256, I32_MIN)[j % 3])}
        out.append(("positions", position))

        def table(i: int, j: int) -> dict[str, Any] | None:
            if pos.numel() == 0:
                return None
            r = i % pos.shape[0]
            bad = pt.clone()
            bad[r, (j // 3) % (int(pos[r]) // 256 + 1)] = (-1, -2, I32_MIN)[j % 3]
            return {**args, "page_table": bad}
        out.append(("page_table", table))
        f2s = args["full_to_swa"]

        def f2s_bad(i: int, j: int) -> dict[str, Any] | None:
            if f2s.numel() == 0:
                return None
            return {**args, "full_to_swa": _poke(f2s, i, (-2, I32_MIN)[j % 2])}
        out.append(("full_to_swa", f2s_bad))
    elif op == "moe_route":
        nonfinite("router_logits")
    elif op in ("fp8_linear", "fp8_grouped_linear"):
        nonfinite("x")
        nonfinite("weight_scale")
    elif op == "moe_experts":
        e = int(args["weights"].case["E"])
        ids = args["topk_ids"]

        def expert(i: int, j: int) -> dict[str, Any] | None:
            if ids.numel() == 0:
                return None
            return {**args, "topk_ids": _poke(ids, i, (e, e + 5, 2**31 - 1)[j % 3])}
        out.append(("topk_ids", expert))
        nonfinite("x")
        nonfinite("topk_weights")
    return out


class Call:
    """One fuzzed call (a plain class: hypothesis prints failing draws with this repr, not tensor contents)."""

    def __init__(self, case: str, mutation: str, checked: bool, invalid: bool, args: dict[str, Any]) -> None:
        self.case, self.mutation, self.checked, self.args = case, mutation, checked, args
        self.invalid = invalid  # a value checked mode must refuse

    def __repr__(self) -> str:  # hypothesis prints failing draws: shapes, not tensor contents
        def short(v: Any) -> str:
            if isinstance(v, torch.Tensor):
                return f"{v.dtype} {tuple(v.shape)} stride {v.stride()} on {v.device}"
            return type(v).__name__ if dataclasses.is_dataclass(v) else repr(v)
        args = ", ".join(f"{k}={short(v)}" for k, v in self.args.items())
        return f"Call({self.case!r}, {self.mutation!r}, checked={self.checked}, invalid={self.invalid}, {args})"


@st.composite
def calls(draw: st.DrawFn, op: str, triton: bool = False) -> Call:
    name, _ = draw(st.sampled_from(_cases(op)))
    args = _clone(_fixture(op, name))
    checked = draw(st.booleans())
    bad = _bad_values(op, args)
    if bad and draw(st.integers(0, 3)) == 0:  # a quarter of the calls break a value
        arg, make = draw(st.sampled_from(bad))
        mutated = make(draw(st.integers(0, 10**6)), draw(st.integers(0, 10**6)))
        if mutated is not None:
            return Call(name, f"value:{arg}", checked, True, mutated)
    mutation, args = draw(structural(args))
    return Call(name, mutation, checked, False, args)


# ------------------------------------------------------------------ the oracle

def _flatten(x: Any) -> list[Any]:
    if isinstance(x, (tuple, list)):
        return [y for v in x for y in _flatten(v)]
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return [y for f in dataclasses.fields(x) if f.init for y in _flatten(getattr(x, f.name))]
    if isinstance(x, dict):
        return [y for v in x.values() for y in _flatten(v)]
    return [x]


def _same(op: str, got: Any, want: Any, args: dict[str, Any]) -> str:
    """'' when equal, else why. Floats are compared closely (strided inputs may reorder a reduction)."""
    if op == "indexer_topk":
        from dsv4hal.conformance.cases_indexer_topk import check_topk

        raw, pages = got
        a = _clone(args, contiguous=True)
        _, ok, detail = check_topk((raw, pages), a["scores"], a["lengths"], a.get("page_table"), a["k"],
                                   a.get("page_size", 64))
        if not ok:
            return detail
        return ""
    g, w = _flatten(got), _flatten(want)
    if len(g) != len(w):
        return f"{len(g)} outputs, the reference {len(w)}"
    for i, (x, y) in enumerate(zip(g, w)):
        if isinstance(y, torch.Tensor):
            if not isinstance(x, torch.Tensor) or x.shape != y.shape or x.dtype != y.dtype:
                return f"output {i}: {getattr(x, 'dtype', type(x))} {tuple(getattr(x, 'shape', ()))}, reference " \
                       f"{y.dtype} {tuple(y.shape)}"
            if x.device.type == "meta" or y.device.type == "meta":
                continue  # every tensor moved to the meta device is a consistent call: shapes are all there is
            if x.is_floating_point():
                tol = {torch.bfloat16: 2e-2, torch.float16: 2e-3}.get(y.dtype, 1e-4)  # ~2 ulp of a reordered sum
                if not torch.allclose(x.double(), y.double(), rtol=tol, atol=tol, equal_nan=True):
                    return f"output {i}: max |diff| {float((x.double() - y.double()).abs().nan_to_num().max()):.3g}"
            elif not torch.equal(x, y):
                return f"output {i}: {int((x != y).sum())} entries differ"
        elif x != y and not (isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y)):
            return f"output {i}: {x!r} != {y!r}"
    return ""


def _classify(op: str, case: str, mutation: str, checked: bool, invalid: bool, args: dict[str, Any],
              triton: bool) -> str:
    platform = _platform(checked, triton)
    COUNTS["calls"] += 1
    COUNTS[f"op:{op}"] += 1
    COUNTS[f"mut:{mutation.split(':')[0]}"] += 1
    where = f"{op} [{case}] {mutation} checked={checked}{' triton' if triton else ''}"
    mine = _clone(args)
    try:
        got = platform.ops[op](**mine)
    except Dsv4HalError:
        COUNTS["typed"] += 1
        return "typed"
    except Exception as exc:  # noqa: BLE001 - the property under test
        COUNTS["generic"] += 1
        FINDINGS.append(f"generic {type(exc).__name__} from {where}: {str(exc)[:200]}")
        return f"generic exception {type(exc).__name__}: {exc}"
    if invalid:
        if checked:
            COUNTS["wrong"] += 1
            FINDINGS.append(f"checked mode accepted {where}")
            return "checked mode accepted an invalid value"
        COUNTS["unspecified"] += 1
        return "unspecified"
    if any(isinstance(t, torch.Tensor) and t.numel() >= HUGE for t in _flatten(args)):
        COUNTS["wrong"] += 1
        FINDINGS.append(f"accepted an expand view of a huge size: {where}")
        return "accepted an expand view of a huge size"
    ref_args = _clone(args, contiguous=True)
    if isinstance(ref_args.get("weights"), PreparedWeights):  # the reference takes logical weights
        ref_args["weights"] = ref_args["weights"].payload
    reference = import_target(OPS_BY_NAME[op].reference)
    try:
        want = reference(**ref_args)
    except Exception as exc:  # noqa: BLE001
        COUNTS["wrong"] += 1
        FINDINGS.append(f"accepted, but the reference raised {type(exc).__name__} on {where}: {str(exc)[:200]}")
        return f"accepted, but the reference on contiguous copies raised {type(exc).__name__}: {exc}"
    # in-place ops: compare the arguments after the call too
    after = [v.payload if isinstance(v, PreparedWeights) else v for v in mine.values()]
    why = _same(op, (got, after), (want, list(ref_args.values())), args) \
        if op != "indexer_topk" else _same(op, got, want, args)
    if why:
        COUNTS["wrong"] += 1
        FINDINGS.append(f"accepted but wrong: {where}: {why}")
        return f"accepted but wrong: {why}"
    COUNTS["matching"] += 1
    return "matching"


def _check(op: str, call: Call, triton: bool = False) -> None:
    outcome = _classify(op, call.case, call.mutation, call.checked, call.invalid, call.args, triton)
    assert outcome in ("typed", "matching", "unspecified"), \
        f"{op} [{call.case}] {call.mutation} checked={call.checked}: {outcome}"[:2000]


# ------------------------------------------------------------------ the properties

FUZZED_OPS = [op for op in OP_NAMES if op in OPS_BY_NAME]


@pytest.mark.parametrize("op", FUZZED_OPS)
@FUZZ
@given(data=st.data())
def test_contract_fuzz_cpu(op: str, data: st.DataObject) -> None:
    """Fuzzed calls of each op on the CPU either run per the contract or raise a typed error."""
    if not _cases(op):
        pytest.skip(f"{op} has no small conformance case")
    _check(op, data.draw(calls(op), label="call"))


@pytest.mark.parametrize("op", sorted(TRITON))
@FUZZ_TRITON
@given(data=st.data())
def test_contract_fuzz_triton_interpreter(op: str, data: st.DataObject) -> None:
    """Fuzzed calls of each Triton kernel under the interpreter honour the op's contract."""
    pytest.importorskip("triton")
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("the CPU platform runs Triton only under its interpreter (a GPU machine fuzzes the CPU reference)")
    _check(op, data.draw(calls(op, triton=True), label="call"), triton=True)


def test_select_platform_builds_the_registry_once_under_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Concurrent select_platform calls build the plugin registry only once."""
    import dsv4hal.platform as platform_mod

    built: list[int] = []
    real = platform_mod.build_registry

    def slow_build(**kw: Any) -> Any:
        built.append(1)
        time.sleep(0.05)  # widen the window in which a second thread could start another build
        return real(**kw)

    monkeypatch.setattr(platform_mod, "build_registry", slow_build)
    monkeypatch.setattr(platform_mod, "_registries", {})
    results: list[Any] = []
    errors: list[BaseException] = []
    barrier = threading.Barrier(12)

    def worker() -> None:
        try:
            barrier.wait()
            results.append(dsv4hal.select_platform())
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert len(built) == 1, f"the registry was built {len(built)} times"
    assert len(results) == 12 and len({id(p.registry) for p in results}) == 1
