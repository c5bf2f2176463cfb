"""`dsv4hal tune`: on this machine, time every eligible implementation of every op per shape bucket
(dsv4hal.ops.buckets), after checking each one's result against the conformance oracle on the same inputs,
and write a lock (dsv4hal.lock) that selection then follows.

Timing: CUDA-graph replays timed with events (median) on a GPU, an eager median when a kernel cannot be
captured (the lock says so); plain wall-clock medians on the CPU. A bucket with several samples is scored by
the geometric mean of their times. An implementation whose result is wrong, or that raises, is never chosen
and the lock records why. Ties within `margin` keep the static priority's choice, so locks do not flap on
noise.

On the CPU the portable Triton kernels run only under Triton's interpreter (TRITON_INTERPRET=1), a test
harness thousands of times slower than the reference: they are listed as not timed unless `interpreted=True`
(then they are checked and timed like any other candidate, and can never win on speed)."""

from __future__ import annotations

import dataclasses
import datetime
import functools
import importlib
import json
import math
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from dsv4hal import override as ov
from dsv4hal.conformance.runner import clone_args, expected_tokens, load_catalog
from dsv4hal.conformance.types import CaseSpec, Fixture, Tolerance, compare_close
from dsv4hal.errors import Dsv4HalError, LockMismatchError
from dsv4hal.hardware import PlatformInfo
from dsv4hal.lock import FORMAT, MACHINE_FIELDS, dsv4hal_version, hash_libraries, machine_of
from dsv4hal.ops.buckets import DECLARED, FP8, bucket_label, bucket_of
from dsv4hal.ops.catalog import OPS_BY_NAME, OpSpec
from dsv4hal.platform import Platform, load_registry, select_platform
from dsv4hal.plugins import import_target
from dsv4hal.prepared import PreparedWeights
from dsv4hal.progress import Progress
from dsv4hal.registry import KernelImpl, Registry
from dsv4hal.selection import select_kernel

DEFAULT_MARGIN = 0.03


@dataclasses.dataclass
class Sample:
    """One timed input. On a GPU its fixture is dropped once its case is known and built again when its bucket is
    measured, then dropped again (release): full-size samples hold a layer's weights (a V4-Pro FP8 expert set is
    25 GB), and an op's buckets together would not fit in the device's memory."""

    name: str
    case: Mapping[str, object]
    build: Callable[[], Fixture]
    built: Fixture | None = None

    @property
    def fixture(self) -> Fixture:
        if self.built is None:
            self.built = self.build()  # the same inputs again: the builders draw from seeded generators
        return self.built

    def release(self) -> None:
        self.built = None


def _case_of(spec: OpSpec, fx: Fixture) -> Mapping[str, object]:
    contract = importlib.import_module(spec.contract)
    if spec.weights_arg:  # decided when the weights are prepared (for the sample's token count): what selection sees
        return getattr(contract, spec.weights_case)(fx.args[spec.weights_arg], expected_tokens(fx.args))
    return getattr(contract, spec.case)(**fx.args)


def _build(module: str, spec: CaseSpec, device: torch.device, seed: int) -> Fixture:
    build = importlib.import_module(module).build
    spec = dataclasses.replace(spec, params={**spec.params, "mode": "eager"})
    return build(spec, device, torch.Generator().manual_seed(seed))


def _build_case(build: Callable[..., Fixture], cs: CaseSpec, device: torch.device, seed: int) -> Fixture:
    return build(dataclasses.replace(cs, params={**cs.params, "mode": "eager"}), device,
                 torch.Generator().manual_seed(seed))


def declared_samples(op: str, on_gpu: bool, device: torch.device, info: PlatformInfo) -> list[tuple[str, list[Sample]]]:
    """(bucket label, samples) of an op declared in dsv4hal.ops.buckets; checks each sample lands in its bucket."""
    decl = DECLARED[op]
    spec = OPS_BY_NAME[op]
    out = []
    for b in decl.buckets:
        samples = []
        for i, params in enumerate(b.gpu if on_gpu else b.cpu):
            p = {k: (info.fp8 if v == FP8 else v) for k, v in params.items()}
            name = ",".join(f"{k}={v}" for k, v in p.items() if k in ("b", "s", "n"))
            build = functools.partial(_build, f"dsv4hal.conformance.cases_{decl.catalog}",
                                      CaseSpec(op, f"tune/{b.label}/{i}", p), device, i)
            fx = build()
            case = _case_of(spec, fx)
            if bucket_of(op, case) != b.label:
                raise Dsv4HalError(f"dsv4hal.ops.buckets: sample {p} of {op} bucket [{b.label}] has case "
                                   f"[{bucket_label(case)}]",
                                   remedy="fix the sample's parameters in dsv4hal/ops/buckets.py")
            samples.append(Sample(name or f"sample{i}", case, build, None if on_gpu else fx))
        out.append((b.label, samples))
    return out


def derived_samples(op: str, on_gpu: bool, device: torch.device,
                    registry: Registry | None = None) -> list[tuple[str, list[Sample]]]:
    """An op without declared samples: its conformance cases grouped by bucket; on the CPU the first small case
    of each bucket, on a GPU up to three full-size (gpu_only) cases, else the last small one. `registry`: where a
    plugin's op is found (the built-in catalog without one)."""
    spec = (registry.ops if registry is not None else OPS_BY_NAME)[op]
    by_label: dict[str, list[Sample]] = {}
    big: dict[str, bool] = {}
    for seed, (cs, build) in enumerate(load_catalog([op], registry=registry)):
        if "eager" not in cs.modes or "eager" in cs.unreachable or "eager" in cs.deferred:
            continue
        if cs.gpu_only and not on_gpu:
            continue
        again = functools.partial(_build_case, build, cs, device, seed)
        fx = again()
        if spec.weights_arg and isinstance(fx.args.get(spec.weights_arg), PreparedWeights):
            continue  # a case about refusing prepared weights, not a shape
        case = _case_of(spec, fx)
        label, s = bucket_of(op, case), Sample(cs.name, case, again, None if on_gpu else fx)
        del fx  # on a GPU only the kept samples are built again, one bucket at a time
        have = by_label.setdefault(label, [])
        if not on_gpu:
            if not have:
                have.append(s)
        elif cs.gpu_only:
            if not big.get(label):
                have.clear()
            big[label] = True
            if len(have) < 3:
                have.append(s)
        elif not big.get(label):
            have[:] = [s]
    return sorted(by_label.items())


# ----- running and timing --------------------------------------------------------------------------------


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _call(impl: KernelImpl, spec: OpSpec, fx: Fixture) -> tuple[Callable[[], Any], dict[str, Any]]:
    """A zero-argument call of `impl` on fresh copies of the fixture's inputs (weights laid out for it)."""
    fn = import_target(impl.target)
    w = spec.weights_arg
    args = {k: (v if k == w else clone_args(v)) for k, v in fx.args.items()}  # weights are read-only: not copied
    if w:
        args[w] = import_target(impl.prepare)(args[w]) if impl.prepare else args[w]
    return (lambda: fn(**args)), args


def _judge(fx: Fixture, ret: Any, args: dict[str, Any]) -> tuple[float, bool, str]:
    got = fx.extract(ret, args) if fx.extract is not None else ret
    if fx.compare is not None:
        return fx.compare(got, fx.expected)
    return compare_close(got, fx.expected, fx.tolerance or Tolerance(0, 0, "exact"))


def cpu_us(fn: Callable[[], Any], *, budget_s: float = 0.3, max_reps: int = 25) -> float:
    """Median wall-clock microseconds of `fn` (already warmed up), at least 3 calls, about `budget_s` in all."""
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < 3 or (len(times) < max_reps and time.perf_counter() - start < budget_s):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(times)


def gpu_us(fn: Callable[[], Any]) -> tuple[float, str]:
    """CUDA-graph median; eager median when the kernel cannot be captured (method says which and why)."""
    from dsv4hal.bench.timing import eager_us, graph_us

    try:
        return graph_us(fn), "cuda-graph"
    except Exception as exc:  # recorded in the lock: the kernel host-syncs or allocates during capture
        torch.cuda.synchronize()
        return eager_us(fn), f"eager (graph capture failed: {type(exc).__name__}: {str(exc)[:120]})"


def _interpreted(impl: KernelImpl, info: PlatformInfo) -> bool:
    return not info.is_gpu and "triton" in impl.requires


def measure(impl: KernelImpl, spec: OpSpec, samples: Sequence[Sample], device: torch.device) -> dict[str, Any]:
    """Check `impl` on every sample against the oracle, then time it; the lock's record of this candidate."""
    per: dict[str, float] = {}
    worst, method = 0.0, ""
    for s in samples:
        try:
            call, args = _call(impl, spec, s.fixture)
            ret = call()
            _sync(device)
            err, ok, detail = _judge(s.fixture, ret, args)
        except Exception as exc:  # a crashing kernel is a failed candidate, never a chosen one
            return {"status": "failed", "reasons": [f"sample {s.name}: {type(exc).__name__}: {str(exc)[:300]}"]}
        if not ok:
            return {"status": "wrong", "max_error": _num(err),
                    "reasons": [f"sample {s.name}: {detail or 'result differs from the oracle'}"]}
        worst = max(worst, err)
        if device.type == "cuda":
            per[s.name], method = gpu_us(call)
        else:
            per[s.name], method = cpu_us(call), "wall-clock median"
    us = math.exp(sum(math.log(max(v, 1e-3)) for v in per.values()) / len(per))
    tol = samples[0].fixture.tolerance
    return {"status": "measured", "us": round(us, 3), "per_sample_us": {k: round(v, 3) for k, v in per.items()},
            "method": method, "max_error": _num(worst), "tolerance": tol.reason if tol else "exact"}


def _num(x: float) -> float | str:
    return x if math.isfinite(x) else str(x)


def choose(cands: Mapping[str, dict[str, Any]], static: str | None, margin: float) -> tuple[str | None, str]:
    """The fastest checked candidate, unless it beats the static choice by less than `margin` (noise)."""
    timed = {n: c["us"] for n, c in cands.items() if c["status"] == "measured"}
    if not timed:
        return None, "no implementation passed the check: " + "; ".join(
            f"{n}: {c['status']} ({'; '.join(c.get('reasons', []))})" for n, c in cands.items())
    best = min(sorted(timed), key=lambda n: timed[n])
    if static in timed and best != static:
        gain = 1 - timed[best] / timed[static]
        if gain < margin:
            return static, (f"static choice kept: {best} is only {gain:.1%} faster ({timed[best]:.1f} vs "
                            f"{timed[static]:.1f} us), below the {margin:.0%} margin")
        return best, (f"fastest of {len(timed)} checked ({timed[best]:.1f} us); the static choice {static} takes "
                      f"{timed[static]:.1f} us ({timed[static] / timed[best]:.2f}x)")
    if best == static:
        return best, f"fastest of {len(timed)} checked ({timed[best]:.1f} us), same as the static choice"
    why = cands.get(static or "", {}).get("status", "not a candidate")
    return best, f"fastest of {len(timed)} checked ({timed[best]:.1f} us); the static choice {static} was {why}"


def _candidates(registry: Registry, op: str, case: Mapping[str, object], platform: Platform, o: ov.Overrides,
                samples: Sequence[Sample], interpreted: bool) -> tuple[dict[str, dict[str, Any]], str | None]:
    decision = select_kernel(registry, op, case, platform.info, platform.name, o)
    spec, device = registry.ops[op], torch.device(platform.device_type)
    impls = registry.kernels[op]
    out: dict[str, dict[str, Any]] = {}
    for c in decision.candidates:
        entry: dict[str, Any] = {"priority": c.priority, "tier": c.tier, "plugin": c.plugin}
        if c.status == "rejected":
            entry.update(status="ineligible", reasons=list(c.reasons))
        elif _interpreted(impls[c.name], platform.info) and not interpreted:
            entry.update(status="not-timed", reasons=[
                "runs under Triton's interpreter on the CPU (a test harness, not a kernel): its time means "
                "nothing; `dsv4hal tune --interpreted` checks and times it anyway"])
        else:
            entry.update(measure(impls[c.name], spec, samples, device))
        out[c.name] = entry
    return out, decision.chosen.name


def tune(platform_name: str | None = None, *, ops: Iterable[str] | None = None, registry: Registry | None = None,
         info: PlatformInfo | None = None, interpreted: bool = False, margin: float = DEFAULT_MARGIN,
         progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Measure and return the lock's data (write it with write_lock). Runs on this machine's platform: a
    platform that does not fit raises PlatformNotFoundError. DSV4HAL_LOCK and forced kernels are ignored."""
    o = dataclasses.replace(ov.current(), kernels={}, lock=None)
    reg = registry or load_registry(o)
    platform = select_platform(platform_name, info=info, registry=reg, overrides=o)
    wanted = list(reg.ops) if ops is None else list(ops)
    unknown = [op for op in wanted if op not in reg.ops]
    if unknown:
        raise Dsv4HalError(f"tune: unknown ops {', '.join(unknown)}", remedy=f"valid ops: {', '.join(reg.ops)}")
    on_gpu, device = platform.device_type == "cuda", torch.device(platform.device_type)
    say = progress or (lambda line: None)
    table: dict[str, Any] = {}
    for op in wanted:
        buckets = (declared_samples(op, on_gpu, device, platform.info) if op in DECLARED and DECLARED[op].buckets
                   else derived_samples(op, on_gpu, device, reg))
        entry: dict[str, Any] = {"features": list(DECLARED[op].features) if op in DECLARED else "all",
                                 "buckets": {}}
        for i, (label, samples) in enumerate(buckets):
            record: dict[str, Any] = {"samples": [s.name for s in samples], "case": dict(samples[0].case)}
            try:
                cands, static = _candidates(reg, op, samples[0].case, platform, o, samples, interpreted)
            except Dsv4HalError as exc:  # no implementation at all for this bucket: the lock says so
                cands, static = {}, None
                record["why"] = str(exc).splitlines()[0]
            chosen, why = choose(cands, static, margin) if cands else (None, record["why"])
            record.update(chosen=chosen, static=static, why=why, candidates=cands)
            entry["buckets"][label] = record
            times = ", ".join(f"{n} {c['us']:.1f}us" if c["status"] == "measured" else f"{n} {c['status']}"
                              for n, c in cands.items())
            say(f"[{op} {i + 1}/{len(buckets)}] [{label}]: {chosen or 'NONE'} ({times})")
            for s in samples:
                s.release()
            if device.type == "cuda":
                torch.cuda.empty_cache()
        table[op] = entry
    requirements = {r for impls in reg.kernels.values() for k in impls.values() if k.applies_to(platform.name)
                    for r in k.requires}
    return {
        "format": FORMAT,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "dsv4hal": dsv4hal_version(),
        "platform": platform.name,
        "machine": {**machine_of(platform.info), "sm_count": platform.info.sm_count,
                    "device_count": platform.info.device_count, "detected_by": platform.info.detected_by},
        "libraries": dict(sorted(platform.info.libraries.items())),
        "plugins": dict(sorted(reg.plugin_versions.items())),
        "files": hash_libraries(r for r in requirements if platform.info.has(r)),
        "settings": {"margin": margin, "interpreted": interpreted, "python": sys.version.split()[0],
                     "timing": "CUDA-graph median (eager where capture fails)" if on_gpu else "wall-clock median",
                     "score": "geometric mean of the samples' times"},
        "ops": table,
    }


def write_lock(data: Mapping[str, Any], path: str | Path) -> None:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(data, indent=1, default=str) + "\n")


def summary(data: Mapping[str, Any]) -> list[str]:
    """A markdown table of the buckets whose measured choice differs from the static priority (or that have
    none), for results READMEs; empty when the lock agrees with the priorities everywhere."""
    rows = []
    for op, entry in data["ops"].items():
        for label, b in entry["buckets"].items():
            chosen, static = b.get("chosen"), b.get("static")
            if chosen and chosen == static:
                continue
            us = {n: c.get("us") for n, c in b.get("candidates", {}).items()}
            st = f"{static} ({_us(us.get(static))})" if static else "-"
            if not chosen:
                rows.append(f"| {op} | {label} | {st} | none | - | {b['why']} |")
                continue
            gain = f"{us[static] / us[chosen]:.2f}x" if us.get(static) and us.get(chosen) else "static not measured"
            rows.append(f"| {op} | {label} | {st} | {chosen} ({_us(us.get(chosen))}) | {gain} | {b['why']} |")
    head = ["| op | bucket | static priority | measured choice | static / measured | why |",
            "|---|---|---|---|---|---|"]
    return head + rows if rows else []


def _us(x: float | None) -> str:
    return "not measured" if x is None else f"{x:.1f} us"


def merge(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """`tune --update`: add the ops just measured to an existing lock made on the same machine and software."""
    keys = ("format", "dsv4hal", "platform", "libraries", "plugins")
    diffs = [k for k in keys if old.get(k) != new.get(k)]
    diffs += [f"machine.{f}" for f in MACHINE_FIELDS if old["machine"].get(f) != new["machine"].get(f)]
    if diffs:
        raise LockMismatchError(f"tune --update: the existing lock differs from this machine in {', '.join(diffs)}",
                                remedy="tune all ops again without --update (a lock describes one machine)")
    return {**new, "ops": {**old["ops"], **new["ops"]}}


def check(path: str, platform_name: str | None = None) -> list[str]:
    """Every difference between a lock and this machine, library versions and file hashes included."""
    from dsv4hal.lock import check_hashes, differences, load_lock

    lock = load_lock(path)
    o = dataclasses.replace(ov.current(), kernels={}, lock=None)
    reg = load_registry(o)
    platform = select_platform(platform_name or lock.platform, registry=reg, overrides=o)
    return differences(lock, platform.name, platform.info, reg) + check_hashes(lock)


def main(args: Any) -> int:
    """`dsv4hal tune`: progress per (op, bucket) on stderr, the lock at --out."""
    if args.check:
        diffs = check(args.check, args.platform)
        if diffs:
            raise LockMismatchError(f"lock {args.check} does not match this machine:\n"
                                    + "\n".join(f"  - {d}" for d in diffs),
                                    remedy="re-run `dsv4hal tune` on this machine and ship the new lock")
        print(f"lock {args.check} matches this machine, its libraries and their files")
        return 0
    from dsv4hal.lock import load_lock
    from dsv4hal.output_paths import check_output

    for path in (args.out, args.markdown):  # before measuring: an unwritable output must not cost the run
        check_output(path)
    old = load_lock(args.out).data if args.update and Path(args.out).exists() else None
    ops = [o.strip() for o in args.ops.split(",") if o.strip()] if args.ops else None
    with Progress(None, "tune") as bar:  # a bar on a terminal (tqdm), plain lines otherwise
        data = tune(args.platform, ops=ops, interpreted=args.interpreted, margin=args.margin, progress=bar.update)
    if old is not None:
        data = merge(old, data)
    write_lock(data, args.out)
    table = summary(data)
    if args.markdown:
        Path(args.markdown).parent.mkdir(parents=True, exist_ok=True)
        Path(args.markdown).write_text("\n".join(table or ["The measured choice equals the static priority in "
                                                           "every bucket."]) + "\n")
    print("\n".join(table))
    n = sum(len(e["buckets"]) for e in data["ops"].values())
    unchosen = sum(not b.get("chosen") for e in data["ops"].values() for b in e["buckets"].values())
    print(f"wrote {args.out}: platform {data['platform']}, {len(data['ops'])} ops, {n} buckets, "
          f"{max(len(table) - 2, 0) - unchosen} measured choices differ from the static priority"
          + (f", {unchosen} buckets with NO passing implementation" if unchosen else ""))
    return 1 if unchosen else 0
