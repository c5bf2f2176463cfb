"""`dsv4hal soak`: an inference engine's lifecycle on one device, with every op, for a fixed time.

What an engine does to a kernel layer between start-up and days of serving, compressed into minutes:
- eager warm-up of the decode step over many batch sizes;
- CUDA-graph capture of the decode step for every batch size on a side stream into one shared memory pool
  (as vLLM and SGLang do), inside `platform.decode_step()` so layers share kernel plans; the graphs are dropped
  and captured again each round, so captures accumulate;
- replays with new positions (new attention metadata, new cache rows) and new inputs written in place;
- eager prefill of random lengths in between (compress, dequant_gather and sparse_attention_prefill too);
- MoE with prepared weights;
- a random sample of eager op calls re-run through the op's pure-PyTorch reference on copies of the inputs taken
  before the call (in-place ops: the written caches and rings are compared too), and some graph replays re-run
  eagerly and compared;
- device memory read at the same point of every round after the first: its floor and ceiling must not both rise
  (memory_growth).

The model is the demo's (dsv4hal.engine_model.DemoModel: SWA, C4 with the indexer and C128 layers, MoE and mHC), at a
moderate size so the reference checks stay cheap. On the CPU there are no graphs: eager rounds only (CI runs a
few seconds of it)."""

from __future__ import annotations

import json
import random
import time
import traceback
from collections import defaultdict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from dsv4hal.engine_model import PAGE, DemoConfig, DemoModel, NullTimer, fill_random, tensors_of
from dsv4hal.prepared import PreparedWeights

SOAK_SIZES = {
    "cuda": DemoConfig(hidden=1024, heads=64, experts=16, inter=512, q_lora=256, o_groups=8, o_lora=256,
                       draw_on_device=True),
    "cpu": DemoConfig(),
}
GPU_BATCH_SIZES = (1, 2, 3, 4, 6, 8, 12, 16, 20, 24, 32, 40, 48, 56, 64)
CPU_BATCH_SIZES = (1, 2, 3)
MAX_PREFILL = 512  # tokens of one eager prefill

# (absolute, relative to the reference's largest magnitude) per op; ops not listed must match exactly.
# Reasons: attention and MoE accumulate in a different order and round activations to bf16 (FlashMLA, Marlin);
# mHC's Sinkhorn and the compressor's softmax pooling are fp32 with reordered sums; index scores multiply FP8
# values exactly and sum in fp32.
TOLERANCE: dict[str, tuple[float, float]] = {
    "sparse_attention_decode": (2e-2, 2e-2), "sparse_attention_prefill": (2e-2, 2e-2),
    "mhc_pre": (2e-3, 1e-2), "mhc_post": (2e-3, 1e-2), "mhc_post_pre": (2e-3, 1e-2), "mhc_head": (2e-3, 1e-2),
    "moe_experts": (5e-2, 5e-2), "compress": (5e-3, 5e-3), "compress_decode": (5e-3, 5e-3),
    "indexer_logits": (1e-3, 1e-3), "moe_route": (1e-5, 1e-5),
}
# whole decode-step output, a graph replay against the same step run eagerly (same inputs, same state)
STEP_TOLERANCE = 5e-2


@dataclass
class SoakStats:
    op_calls: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    replayed_op_calls: int = 0
    captures: int = 0
    replays: int = 0
    eager_steps: int = 0
    prefills: int = 0
    checked: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    max_error: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    failures: list[str] = field(default_factory=list)
    replays_checked: int = 0
    replay_max_error: float = 0.0
    memory: list[dict[str, float]] = field(default_factory=list)
    crashes: list[str] = field(default_factory=list)


def _clone(x: Any) -> Any:
    """A deep copy of tensors inside args (caches are dataclasses holding tensors)."""
    if isinstance(x, torch.Tensor):
        return x.clone()
    if isinstance(x, (tuple, list)):
        return type(x)(_clone(v) for v in x)
    if isinstance(x, dict):
        return {k: _clone(v) for k, v in x.items()}
    if hasattr(x, "__dataclass_fields__") and not isinstance(x, PreparedWeights):
        return replace(x, **{f: _clone(getattr(x, f)) for f in x.__dataclass_fields__
                             if type(x).__dataclass_fields__[f].init})
    return x


def _state_tensors(x: Any) -> list[torch.Tensor]:
    """The tensors an argument holds, dataclasses by their constructor fields only (a cache's cached views are
    derived, not state)."""
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (tuple, list)):
        return [t for v in x for t in _state_tensors(v)]
    if hasattr(x, "__dataclass_fields__"):
        fields = type(x).__dataclass_fields__
        return [t for f in fields if fields[f].init for t in _state_tensors(getattr(x, f))]
    return []


def _max_error(name: str, got: torch.Tensor, want: torch.Tensor) -> tuple[float, float]:
    """(error, bound) of one output tensor; exact ops get bound 0."""
    if name == "indexer_topk" and got.dim() == 2:  # the same set per row; order is free
        got, want = got.sort(dim=-1).values, want.sort(dim=-1).values
    if got.shape != want.shape:
        return float("inf"), 0.0
    g, w = got.double(), want.double()
    if not torch.equal(torch.isfinite(g), torch.isfinite(w)):
        return float("inf"), 0.0
    fin = torch.isfinite(w)
    if not bool(fin.any()):
        return 0.0, 0.0
    err = float((g[fin] - w[fin]).abs().max())
    tol = TOLERANCE.get(name)
    if tol is None or not (got.is_floating_point() and got.dtype.itemsize >= 2):
        return err, 0.0
    return err, tol[0] + tol[1] * float(w[fin].abs().max())


class CheckingOps:
    """Stands in for platform.ops: counts every call, and re-runs a random sample through the reference on
    copies of the inputs taken before the call (so in-place ops are checked too)."""

    def __init__(self, platform: Any, stats: SoakStats, rate: float, rng: random.Random,
                 logical_weights: dict[int, Any]) -> None:
        from dsv4hal.plugins import import_target

        self._p, self._stats, self.rate, self._rng = platform, stats, rate, rng
        self._weights = logical_weights
        self._refs: dict[str, Callable[..., Any]] = {}
        self._ref_of = lambda name: self._refs.setdefault(name, import_target(platform.registry.ops[name].reference))
        self.sampling = True

    def __getattr__(self, name: str) -> Any:
        op = getattr(self._p.ops, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            self._stats.op_calls[name] += 1
            if not self.sampling or self._rng.random() >= self.rate:
                return op(*args, **kwargs)
            before_a, before_k = _clone(args), _clone(kwargs)
            out = op(*args, **kwargs)
            self._check(name, out, args, kwargs, before_a, before_k)
            return out

        def prepare_weights(weights: Any, **kwargs: Any) -> Any:  # remember the logical weights for the reference
            prepared = op.prepare_weights(weights, **kwargs)
            self._weights[id(prepared)] = weights
            return prepared

        call.prepare_weights = prepare_weights  # type: ignore[attr-defined]
        return call

    def _check(self, name: str, out: Any, args: tuple, kwargs: dict, ref_a: tuple, ref_k: dict) -> None:
        ref_a = tuple(self._weights.get(id(a), a) for a in ref_a)  # prepared weights -> the logical ones
        want = self._ref_of(name)(*ref_a, **ref_k)
        pairs = list(zip(tensors_of(out), tensors_of(want), strict=False))
        # in-place results: every argument after the fast call against its copy after the reference call
        # (prepared weights are the kernel's own layout: the reference had the logical ones)
        for got_arg, ref_arg in zip((*args, *kwargs.values()), (*ref_a, *ref_k.values()), strict=True):
            if not isinstance(got_arg, PreparedWeights):
                pairs += list(zip(_state_tensors(got_arg), _state_tensors(ref_arg), strict=True))
        n_got, n_want = len(tensors_of(out)), len(tensors_of(want))
        if n_got != n_want:
            self._stats.failures.append(f"{name}: {n_got} outputs, reference has {n_want}")
        worst = 0.0
        for got, ref in pairs:
            err, bound = _max_error(name, got, ref)
            worst = max(worst, err if bound == 0.0 else err / max(bound, 1e-30) * TOLERANCE[name][0])
            if err > bound:
                self._stats.failures.append(f"{name}: error {err:.3g} over {bound:.3g} (shape {tuple(got.shape)})")
        self._stats.checked[name] += 1
        self._stats.max_error[name] = max(self._stats.max_error[name], worst)


def _memory() -> dict[str, float]:
    free, total = torch.cuda.mem_get_info()
    return {"allocated": float(torch.cuda.memory_allocated()), "reserved": float(torch.cuda.memory_reserved()),
            "device_used": float(total - free)}


def run_soak(platform: Any, minutes: float, *, seed: int = 0, context: int = 2048, sample_rate: float = 0.02,
             batch_sizes: tuple[int, ...] | None = None, replays_per_size: int = 20,
             progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run the lifecycle for `minutes` (at least one round) and return the report (see module docstring)."""
    dev = torch.device(platform.device_type)
    gpu = dev.type == "cuda"
    sizes = batch_sizes or (GPU_BATCH_SIZES if gpu else CPU_BATCH_SIZES)
    cfg = replace(SOAK_SIZES["cuda" if gpu else "cpu"], max_pages=-(-context // PAGE))
    if not gpu:
        context = min(context, 64)
    bmax = max(sizes)
    rng = random.Random(seed)
    stats = SoakStats()
    say = progress or (lambda s: None)
    t0 = time.monotonic()
    deadline = t0 + minutes * 60.0
    logical: dict[int, Any] = {}
    checking = CheckingOps(platform, stats, sample_rate, rng, logical)
    result: dict[str, Any] = {"platform": platform.name, "minutes": minutes, "context": context,
                              "batch_sizes": list(sizes), "config": asdict(cfg), "sample_rate": sample_rate}
    try:
        model = DemoModel(platform, cfg, bmax, seed, ops=checking)
        checking.sampling = False
        fill_random(model, bmax, context, seed)
        checking.sampling = True
        g = torch.Generator(dev).manual_seed(seed + 1)
        rounds, pool, side = 0, None, None
        while True:
            rounds += 1
            if rounds == 1:  # check every op once at the largest shapes: the checker's copies are warm too
                checking.rate = 1.0
                _eager_round(model, platform, (bmax,), context, g, stats, rng)
                _prefill(model, checking, context, g, stats, rng, length=min(context, MAX_PREFILL))
                checking.rate = sample_rate
            _eager_round(model, platform, sizes, context, g, stats, rng)
            _prefill(model, checking, context, g, stats, rng)
            if gpu:
                if pool is None:  # one pool and one capture stream for the whole run, as engines keep them (a
                    # new stream each round would also get its own cuBLAS workspace, which is never returned)
                    pool, side = torch.cuda.graph_pool_handle(), torch.cuda.Stream()
                _graph_round(model, platform, sizes, context, g, stats, rng, replays_per_size, pool, side)
                stats.memory.append({"round": rounds, "t_s": time.monotonic() - t0, **_memory()})
            say(f"round {rounds}: {sum(stats.op_calls.values()) + stats.replayed_op_calls} op calls, "
                f"{stats.captures} captures, {stats.replays} replays, {sum(stats.checked.values())} checked, "
                f"{len(stats.failures)} failures, {time.monotonic() - t0:.0f}s")
            if time.monotonic() >= deadline:
                break
    except Exception as exc:  # a crash ends the soak; the report says where
        stats.crashes.append(f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=8)}")
        if gpu:
            try:
                torch.cuda.synchronize()
            except Exception as dead:  # the context may be gone
                stats.crashes.append(f"after the crash: {type(dead).__name__}: {dead}")
    result.update(_summary(stats, time.monotonic() - t0))
    return result


def _step_inputs(model: DemoModel, b: int, context: int, g: torch.Generator) -> tuple[torch.Tensor, ...]:
    dev = model.dev
    x = (torch.randn(b, model.cfg.hidden, generator=g, device=dev) * 0.5).bfloat16()
    req = torch.arange(b, device=dev)
    pos = torch.randint(1, context, (b,), generator=g, device=dev)
    return x, req, pos


def _eager_round(model: DemoModel, platform: Any, sizes: tuple[int, ...], context: int, g: torch.Generator,
                 stats: SoakStats, rng: random.Random) -> None:
    null = NullTimer()
    for b in rng.sample(list(sizes), k=min(len(sizes), 4)):
        x, req, pos = _step_inputs(model, b, context, g)
        with platform.decode_step():
            out = model.forward(x, req, pos, null, decode=True)
        if not bool(torch.isfinite(out).all()):
            stats.failures.append(f"eager decode step, batch {b}: non-finite output")
        stats.eager_steps += 1


def _prefill(model: DemoModel, ops: CheckingOps, context: int, g: torch.Generator, stats: SoakStats,
             rng: random.Random, length: int | None = None) -> None:
    """A new request: random length, real prefill of one request slot; then the prefill-attention path over the
    bf16 workspace gathered from its SWA cache rows."""
    dev = model.dev
    b = rng.randrange(model.b)
    n = length or rng.randint(1, min(context, MAX_PREFILL))
    req = torch.full((n,), b, device=dev)
    pos = torch.arange(n, device=dev)
    x = (torch.randn(n, model.cfg.hidden, generator=g, device=dev) * 0.5).bfloat16()
    model.forward(x, req, pos, NullTimer())
    w = model.layers[0]
    kv = ops.dequant_gather(w["swa"], model.loc(req, pos))
    width = 128  # a causal window over the request's own rows, -1 beyond its start
    idx = pos[:, None] - torch.arange(width, device=dev)[None, :]
    idx = torch.where(idx >= 0, idx, -1).int()
    lengths = (pos + 1).clamp(max=width).int()
    q = (torch.randn(n, model.cfg.heads, 512, generator=g, device=dev) * 0.1).bfloat16()
    ops.sparse_attention_prefill(q, kv, idx, lengths, w["sink"], 512 ** -0.5)
    stats.prefills += 1


def _graph_round(model: DemoModel, platform: Any, sizes: tuple[int, ...], context: int, g: torch.Generator,
                 stats: SoakStats, rng: random.Random, replays: int, pool: Any, side: Any) -> None:
    """Capture the decode step for every batch size on a side stream into one pool, replay each with new
    positions and inputs, re-run a few replays eagerly and compare, then drop the graphs."""
    null = NullTimer()
    raw_ops = model.ops
    counting = _CountingOps(platform.ops)
    model.ops = counting
    graphs = []
    try:
        for b in sizes:
            x, req, pos = _step_inputs(model, b, context, g)
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side), platform.decode_step():
                model.forward(x, req, pos, null, decode=True)  # warm-up: lazy plans and autotuning outside capture
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            counting.calls = 0
            with torch.cuda.graph(graph, pool=pool, stream=side), platform.decode_step():
                out = model.forward(x, req, pos, null, decode=True)
            stats.captures += 1
            # every tensor the graph reads stays alive with it: a freed input would be reused by the
            # allocator and the replay would read whatever lands there
            graphs.append((b, graph, x, req, pos, out, counting.calls))
        check = set(rng.sample(range(len(graphs)), k=min(2, len(graphs))))
        for i, (b, graph, x, req, pos, out, calls) in enumerate(graphs):
            for r in range(replays):
                x.copy_(torch.randn(x.shape, generator=g, device=x.device) * 0.5)
                pos.copy_(torch.randint(1, context, pos.shape, generator=g, device=pos.device))
                graph.replay()
                stats.replays += 1
                stats.replayed_op_calls += calls
                if r == replays - 1 and i in check:
                    got = out.clone()
                    want = model.forward(x, req, pos, null, decode=True)
                    err = float((got.double() - want.double()).abs().max() / want.double().abs().max().clamp_min(1e-30))
                    stats.replays_checked += 1
                    stats.replay_max_error = max(stats.replay_max_error, err)
                    if not err <= STEP_TOLERANCE:
                        stats.failures.append(f"graph replay, batch {b}: relative error {err:.3g} against eager")
            if not bool(torch.isfinite(out).all()):
                stats.failures.append(f"graph replay, batch {b}: non-finite output")
    finally:
        model.ops = raw_ops
        del graphs
    for name, n in counting.by_op.items():
        stats.op_calls[name] += n


class _CountingOps:
    """Counts calls (captures count once per capture; replays are counted from the capture's count)."""

    def __init__(self, ops: Any) -> None:
        self._ops, self.calls, self.by_op = ops, 0, defaultdict(int)

    def __getattr__(self, name: str) -> Any:
        op = getattr(self._ops, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls += 1
            self.by_op[name] += 1
            return op(*args, **kwargs)

        call.prepare_weights = getattr(op, "prepare_weights", None)  # type: ignore[attr-defined]
        return call


MEMORY_KINDS = ("reserved", "device_used")


def memory_growth(mem: list[dict[str, float]]) -> tuple[dict[str, float] | None, dict[str, float] | None]:
    """(growth, spread) of the reads taken after warm-up, at the same point of every round.

    growth: how far the later half of the run rose above the earlier half, as a fraction of the latter: the smaller
    of the rise of its floor (lowest read) and of its ceiling (highest read). A leak raises every read, so both
    rise; the allocator's caching of eager prefills of random lengths moves single reads up and down by a few
    percent with no trend, which moves one of them at most (a ceiling-only measure failed H200 soaks whose one high
    read landed in the later half: soak-memory-swing.json, reserved 956-1013 MB, allocated flat within 0.1%). spread:
    (max - min) / min of all reads, that swing, reported beside it."""
    if len(mem) < 2:
        return None, None
    half = len(mem) // 2
    early, late = mem[:half], mem[half:]

    def rise(pick: Callable[..., float], k: str) -> float:
        base = pick(m[k] for m in early)
        return (pick(m[k] for m in late) - base) / max(base, 1.0)

    growth = {k: min(rise(min, k), rise(max, k)) for k in MEMORY_KINDS}
    spread = {k: (max(m[k] for m in mem) - min(m[k] for m in mem)) / max(min(m[k] for m in mem), 1.0)
              for k in MEMORY_KINDS}
    return growth, spread


def _summary(stats: SoakStats, seconds: float) -> dict[str, Any]:
    growth, spread = memory_growth(stats.memory)
    eager = sum(stats.op_calls.values())
    return {
        "seconds": seconds, "op_calls": eager + stats.replayed_op_calls, "eager_op_calls": eager,
        "replayed_op_calls": stats.replayed_op_calls, "op_calls_by_op": dict(stats.op_calls),
        "captures": stats.captures, "replays": stats.replays, "eager_steps": stats.eager_steps,
        "prefills": stats.prefills, "checked_calls": sum(stats.checked.values()), "checked_by_op": dict(stats.checked),
        "max_error_by_op": dict(stats.max_error), "replays_checked": stats.replays_checked,
        "replay_max_rel_error": stats.replay_max_error, "results_outside_tolerance": len(stats.failures),
        "failures": stats.failures[:50], "crashes": len(stats.crashes), "crash_details": stats.crashes,
        "memory": stats.memory, "memory_growth_after_warmup": growth, "memory_spread_after_warmup": spread,
        "ok": not stats.failures and not stats.crashes and (growth is None or max(growth.values()) <= 0.01),
    }


def main(args: Any) -> int:
    import sys

    import dsv4hal
    from dsv4hal.output_paths import check_output

    check_output(args.json)  # an unwritable path fails now, not after the run (the CLI checks the numbers)
    platform = dsv4hal.select_platform(args.platform)
    res = run_soak(platform, args.minutes, seed=args.seed, context=args.context,
                   progress=lambda s: print(s, file=sys.stderr, flush=True))
    res["command"] = "dsv4hal " + " ".join(sys.argv[1:])
    if platform.device_type == "cuda":
        res["device"] = torch.cuda.get_device_name()
    res["kernels"] = {op.name: op.decide().chosen.name for op in platform.ops if op.name != "moe_experts"}
    print(f"soak {platform.name}: {res['seconds']:.0f}s, {res['op_calls']} op calls ({res['eager_op_calls']} eager), "
          f"{res['captures']} captures, {res['replays']} replays, {res['checked_calls']} checked, "
          f"{res['results_outside_tolerance']} outside tolerance, {res['crashes']} crashes, memory growth "
          f"{res['memory_growth_after_warmup']}: {'ok' if res['ok'] else 'FAIL'}")
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1, default=str) + "\n")
    return 0 if res["ok"] else 1
