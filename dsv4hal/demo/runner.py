"""Running the demo: prefill (or a random fill), then decode eagerly or as one CUDA graph of the step, timing
each op; `kernels_in_use` reports the kernel each op ran."""

from __future__ import annotations

import statistics
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from typing import Any

import torch

from dsv4hal.demo.floors import floor_bytes
from dsv4hal.demo.kernels_per_call import check_ops, in_step, kernels_per_call
from dsv4hal.demo.step_profile import RangeTimer, profile_replay
from dsv4hal.engine_model.config import PAGE, DemoConfig
from dsv4hal.engine_model.model import DemoModel, fill_random
from dsv4hal.engine_model.tape import Tape
from dsv4hal.engine_model.timers import NullTimer, Timer
from dsv4hal.errors import Dsv4HalError
from dsv4hal.speculative import chain_rows, check_chain


def run_demo(platform: Any, batch: int = 2, context: int = 40, steps: int = 3, seed: int = 0,
             cfg: DemoConfig | None = None, tape: Tape | None = None, *, fill: str = "prefill",
             graph: bool = False, progress: Any = None, compile_backend: str | None = None,
             tokens_per_request: int = 1, make_model: Callable[[DemoConfig], DemoModel] | None = None,
             input_seed: int | None = None, offload_c4: float | None = None,
             kernels_per_call_ops: Sequence[str] = ()) -> dict[str, Any]:
    """Prefill `batch` prompts of `context` tokens (or fill="random": a synthetic context), then decode `steps`
    tokens; returns outputs and times. With a `tape` (Tape(platform.ops)) every op call is recorded for
    `replay`. graph=True (GPU): the first decode step runs eagerly (recorded and timed op by op), the rest
    replay one CUDA graph of the step. `progress(text)`, if given, is called after the prefill and after each
    eager decode step (once for the graph decode). compile_backend (e.g. "inductor"): the decode step is
    torch.compile'd with that backend, as an engine compiles its model: dsv4hal's ops stay one opaque custom op
    each, the engine-side torch code around them is the backend's to fuse (eager decode then keeps no per-op times).
    tokens_per_request N > 1: each decode step is an MTP verify step, N query tokens per request at consecutive
    positions through every op of the layers (token-wise ops see batch * N rows); every draft is accepted, so a step
    advances each request by N positions and the tokens per second count query tokens. make_model(cfg) builds the
    model instead of DemoModel (an expert-parallel rank's: dsv4hal.demo.ep); input_seed seeds the token embeddings
    (default seed + 1), so ranks can serve different requests with the same weights. offload_c4 (a fraction, 0.25
    for a quarter): after the prefill the C4 pool moves to pinned host memory with a device working set of that
    fraction of its pages (DemoModel.offload_c4); the stats of its fetches are in "offload". kernels_per_call_ops
    (graph mode only, else a Dsv4HalError, as for an op check_ops refuses): each of the first step's calls of these
    ops also runs through every kernel that takes its case ("kernels_per_call": dsv4hal.demo.kernels_per_call)."""
    if kernels_per_call_ops:  # refused before the prefill, not after it
        if not graph:
            raise Dsv4HalError("--kernels-per-call times kernels in CUDA graphs: it needs graph mode",
                               remedy="run on a CUDA platform without --no-graph, or drop --kernels-per-call")
        check_ops(platform, kernels_per_call_ops)
    step_done = progress or (lambda text: None)
    n = tokens_per_request
    cfg = replace(cfg or DemoConfig(), max_pages=-(-(context + steps * n) // PAGE))
    model = (make_model(cfg) if make_model is not None
             else DemoModel(platform, cfg, batch, seed, ops=tape, tokens_per_request=n, swa_ring=fill == "random"))
    dev = model.dev
    g = torch.Generator(dev if cfg.draw_on_device else "cpu").manual_seed(seed + 1 if input_seed is None
                                                                          else input_seed)
    timer = Timer(dev)

    def embed(n: int) -> torch.Tensor:
        return (torch.randn(n, cfg.hidden, generator=g, device=g.device) * 0.5).bfloat16().to(dev)

    outputs, layers = [], []
    t0 = time.perf_counter()
    if fill == "random":
        fill_random(model, batch, context, seed)
    elif fill == "prefill":
        req = torch.arange(batch, device=dev).repeat_interleave(context)
        pos = torch.arange(context, device=dev).repeat(batch)
        outputs.append(model.forward(embed(batch * context), req, pos, timer))
        layers.append(model.layer_outputs)
    else:
        raise ValueError(f"fill must be 'prefill' or 'random', not {fill!r}")
    if offload_c4 is not None:
        model.offload_c4(offload_c4)
    if dev.type == "cuda":
        torch.cuda.synchronize()
    prefill_s = time.perf_counter() - t0
    step_done(f"{fill} of {batch}x{context} tokens")
    res: dict[str, Any] = {
        "platform": platform.name, "device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu",
        "config": asdict(cfg), "batch": batch, "context": context, "steps": steps, "fill": fill,
        "tokens_per_request": n, "offload_c4": offload_c4 is not None,
        "prefill_s": prefill_s, "kernels": kernels_in_use(platform, model),
        "strict": platform.overrides.strict}  # DSV4HAL_STRICT: no PyTorch reference op on a GPU
    decode = Timer(dev)
    first = torch.full((batch,), context, device=dev)
    r, chain = chain_rows(batch, n, first)
    check_chain(r, chain, "demo decode step")
    step = _decode_step(model, compile_backend)
    res["compile_backend"] = compile_backend
    if graph and steps:
        res.update(_decode_graph(platform, model, embed, context, steps, outputs, layers, step,
                                  compile_backend is not None, kernels_per_call_ops))
        step_done(f"{steps} decode steps (graph)")
    else:
        t0 = time.perf_counter()
        timer = decode if compile_backend is None else NullTimer()  # a timer's syncs would split compiled code
        for s in range(steps):
            outputs.append(step(embed(batch * n), r, chain + s * n, timer))
            layers.append(model.layer_outputs)
            step_done(f"decode step {s + 1}/{steps}")
        decode_s = time.perf_counter() - t0
        res["decode_tokens_per_s"] = batch * n * steps / decode_s if steps else 0.0
        res["decode_step_s"] = decode_s / steps if steps else 0.0
    pool = next((w["pool"] for w in model.layers if "pool" in w), None)
    if pool is not None:
        st = pool.stats()
        res["offload"] = {**st, "working_fraction": st["working_pages"] / st["pool_pages"],
                          "requested_fraction": offload_c4}
    res.update(decode_breakdown_s=dict(decode.seconds), decode_calls=dict(decode.calls), outputs=outputs,
               layer_outputs=layers)
    return res


def _decode_step(model: DemoModel, compile_backend: str | None) -> Any:
    """The decode step as a function of (x, req, pos, timer): the model's forward (compiled when asked) inside a
    declared decode step, as an engine runs it (the attention layers of one shape share a scheduler plan; the step
    is entered around the compiled function, which Dynamo cannot trace into)."""
    def forward(x: torch.Tensor, req: torch.Tensor, pos: torch.Tensor, timer: Any) -> torch.Tensor:
        return model.forward(x, req, pos, timer, decode=True)

    inner = forward if compile_backend is None else torch.compile(forward, backend=compile_backend, dynamic=False)

    def step(x: torch.Tensor, req: torch.Tensor, pos: torch.Tensor, timer: Any) -> torch.Tensor:
        with model.p.decode_step():
            return inner(x, req, pos, timer)

    return step


def kernels_in_use(platform: Any, model: DemoModel, calls: list = ()) -> dict[str, str]:
    """The kernel of each op: moe_experts the one its weights were prepared for, ops called in `calls` (a
    Tape's) the one chosen for those calls' cases, others the default case's; '(torch reference)' marks ops
    with no fast kernel here (strict mode would have refused them on a GPU)."""
    used = {n: platform.ops[n].decide(platform.ops[n].case_of(*a, **k)).chosen.name
            for n, a, k, _ in calls if n != "moe_experts"}
    out = {}
    for op in platform.ops:
        name = model.layers[0]["experts"].implementation if op.name == "moe_experts" else (
            used.get(op.name) or op.decide().chosen.name)
        tier = platform.registry.kernels[op.name][name].tier
        out[op.name] = name + (" (torch reference)" if tier == "reference" and platform.info.is_gpu else "")
    return out


def _decode_graph(platform: Any, model: DemoModel, embed: Any, context: int, steps: int, outputs: list,
                  layers: list, step: Any, compiled: bool, per_call_ops: Sequence[str] = ()) -> dict[str, Any]:
    """Step 0 eagerly under a Tape (warm-up, and each op call timed alone); then one CUDA graph of the step
    (`step`: the forward, or its compiled form, compiled first), captured once and replayed for steps 1.. with new
    positions and inputs written into its buffers."""
    from dsv4hal.bench.timing import copy_bandwidth, graph_us
    from dsv4hal.cuda_graphs import capture

    batch, dev, n = model.b, model.dev, model.tpr
    null = NullTimer()
    x = embed(batch * n)
    req, chain = chain_rows(batch, n, torch.full((batch,), context, device=dev))
    pos = chain.clone()
    tape = Tape(platform.ops)
    model.ops = tape
    with platform.decode_step():  # as the captured step runs
        outputs.append(model.forward(x, req, pos, null, decode=True).clone())
    layers.append([t.clone() for t in model.layer_outputs])
    model.ops = platform.ops
    torch.cuda.synchronize()
    alone: dict[str, float] = defaultdict(float)
    floors: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    copy_bw = copy_bandwidth(1 << 30)
    for name, args, kwargs, out in tape.calls:
        op = getattr(platform.ops, name)
        alone[name] += graph_us(lambda op=op, a=args, k=kwargs: in_step(platform, op, a, k), inner=3, reps=10)
        floors[name] += floor_bytes(name, args, kwargs, out) / copy_bw * 1e6
        calls[name] += 1
    per_call = kernels_per_call(platform, tape.calls, per_call_ops,
                                lambda fn: graph_us(fn, inner=3, reps=10)) if per_call_ops else None
    compile_s = None
    if compiled:  # compile outside the capture, timed (a step at the same position: the same cache writes)
        t0 = time.perf_counter()
        step(x, req, pos, null)
        torch.cuda.synchronize()
        compile_s = time.perf_counter() - t0
    graph, final = capture(lambda: step(x, req, pos, null))
    step_layers = model.layer_outputs
    times = []
    for s in range(1, steps):
        x.copy_(embed(batch * n))
        pos.copy_(chain + s * n)
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3)
        outputs.append(final.clone())
        layers.append([t.clone() for t in step_layers])
    step_us = statistics.median(times) if times else float("nan")
    def eager_step() -> Any:  # the step once more at the same position: the same writes (attribution only)
        return _decode_step(model, None)(x, req, pos, RangeTimer())

    # an eager step would move the offload pool's counters, which the result reports: no attribution there
    offloaded = any("pool" in w for w in model.layers)
    try:  # a diagnostic: the run's results stand without it
        step_kernels: dict[str, Any] = profile_replay(graph, None if offloaded else eager_step)
    except Exception as exc:  # noqa: BLE001
        step_kernels = {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
    sum_alone = sum(alone.values())
    return {"decode_tokens_per_s": batch * n / step_us * 1e6 if times else 0.0, "graph_step_us": step_us,
            "graph_replays": len(times), "ops_alone_us": dict(alone), "ops_floor_us": dict(floors),
            "ops_calls_per_step": dict(calls), "sum_ops_alone_us": sum_alone,
            "graph_step_over_sum_ops": step_us / sum_alone if sum_alone else float("nan"),
            "copy_bytes_per_s": copy_bw, "step_kernels": step_kernels, "first_step_s": compile_s,
            **({"kernels_per_call": per_call} if per_call is not None else {}),
            # the kernels the step's real cases chose (the default case's can differ, e.g. moe_route by E)
            "kernels": kernels_in_use(platform, model, tape.calls)}

