"""Conformance cells of expert-parallel dispatch + experts + combine, named ep<N>-<layout>-<dtype>-<routing>-<mode>-
<variant>, run on N gloo processes: each rank routes its own tokens, dispatches them, runs moe_experts on what it
received (this rank's physical slots, cpu platform) and combines; the result must equal the single-rank moe_experts
of the same tokens, routes and weights on the cpu platform (the reference):

  * bit for bit where the arithmetic is the same: one rank, standard layout (the loop-back hands moe_experts the
    very rows, and combine adds one partial to zero); decode mode against normal mode always;
  * otherwise within TOLERANCE: every rank's partial sum (standard) or every expert output (batched) is rounded to
    bf16 before the fp32 sum;
  * FP8 dispatch: bit-for-bit/TOLERANCE against the reference on the quantized-then-dequantized tokens, and within
    the moe_experts FP8 tolerance (cases_moe) against the reference on the bf16 tokens.

Variants: "dropped" (a fifth of the routes -1), "empty-rank" (every route to rank 0's experts: the others receive
nothing; the last rank also sends nothing), "replicas" (a redundant slot for N experts, on other ranks)."""

from __future__ import annotations

import functools
import itertools
import time
from typing import Any

import torch

from dsv4hal.conformance.types import Tolerance, compare_close

WORLD_SIZES = (1, 2, 4)
E, H, I, K, VOCAB = 16, 128, 64, 6, 50
TOKENS = (5, 3, 6, 2)  # tokens of rank r (the last rank of empty-rank sends none)
MAX_TOKENS = 8
LAYOUTS, DTYPES, ROUTINGS, MODES = ("standard", "batched"), ("bf16", "fp8"), ("score", "hash"), ("normal", "decode")
VARIANTS = ("dropped", "empty-rank", "replicas")
TOLERANCE = Tolerance(2 ** -6, 2 ** -7, "atol a fraction of the output RMS: each rank's partial sum (or each expert "
                      "output, batched) is rounded to bf16 (2^-9 relative) before the fp32 sum, and partials can "
                      "exceed their sum; a missing or doubled route errs by ~40% of the RMS")


def case_names(world: int) -> list[tuple[str, dict[str, str]]]:
    out = []
    backends = ("loopback",) if world == 1 else ("torch_all_to_all", "torch_all_gather")
    for layout, dtype, routing, mode, variant in itertools.product(LAYOUTS, DTYPES, ROUTINGS, MODES, VARIANTS):
        for backend in backends:
            spec = {"layout": layout, "dtype": dtype, "routing": routing, "mode": mode, "variant": variant,
                    "backend": backend}
            out.append((f"ep{world}-{layout}-{dtype}-{routing}-{mode}-{variant}", spec))
    return out


@functools.cache
def _weights() -> Any:
    from dsv4hal.formats.experts import quantize_experts

    g = torch.Generator().manual_seed(7)
    w13 = torch.randn(E, 2 * I, H, generator=g) * (2.0 / H ** 0.5)
    w2 = torch.randn(E, H, I, generator=g) / I ** 0.5
    return quantize_experts(w13, w2, "fp8_block", "e4m3fn")


def _inputs(rank: int, world: int, routing: str, variant: str, seed: int) -> tuple[torch.Tensor, ...]:
    from dsv4hal.reference.moe import moe_route

    g = torch.Generator().manual_seed(seed * 100 + rank)
    t = 0 if variant == "empty-rank" and world > 1 and rank == world - 1 else TOKENS[rank]
    x = torch.randn(t, H, generator=g).to(torch.bfloat16)
    logits = torch.randn(t, E, generator=g)
    if routing == "hash":
        table = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(VOCAB)]).to(torch.int32)
        ids, w = moe_route(logits, hash_table=table, input_ids=torch.randint(0, VOCAB, (t,), generator=g))
    else:
        ids, w = moe_route(logits, torch.randn(E, generator=g) * 0.1, top_k=K)
    if variant == "dropped":
        ids = torch.where(torch.rand(ids.shape, generator=g) < 0.2, -1, ids)
    if variant == "empty-rank":
        ids = ids % (E // world)  # rank 0's experts only
    return x, ids.to(torch.int32), w


def _expert_map(world: int, variant: str) -> Any:
    from dsv4hal.distributed.expert_map import ExpertMap

    if variant != "replicas":
        return None
    return ExpertMap.from_slots(list(range(E)) + list(range(world)), E)  # experts 0..N-1 twice


def _run_cell(rank: int, world: int, spec: dict[str, str], seed: int, group: Any, cpu: Any) -> tuple[float, str]:
    """(max error, problem or '') of one cell on this rank."""
    import torch.distributed as dist

    from dsv4hal.distributed import ExpertParallel, local_expert_weights, run_local_experts
    from dsv4hal.formats.fp8_block import act_dequant_1x128, act_quant_1x128

    weights = _weights()
    x, ids, w = _inputs(rank, world, spec["routing"], spec["variant"], seed)
    emap = _expert_map(world, spec["variant"])
    ep = ExpertParallel(num_experts=E, hidden=H, top_k=K, group=group, expert_map=emap, max_tokens_per_rank=MAX_TOKENS,
                        dtype=spec["dtype"], platform=cpu, backend=spec["backend"])
    prepared = cpu.ops.moe_experts.prepare_weights(local_expert_weights(weights, ep.local_experts()))

    def step(decode: bool) -> torch.Tensor:
        d = ep.dispatch(x, ids, w, layout=spec["layout"], decode=decode)  # type: ignore[arg-type]
        return ep.combine(run_local_experts(cpu, d, prepared), d.handle)

    got = step(spec["mode"] == "decode")
    full = cpu.ops.moe_experts.prepare_weights(weights)
    x_in = x if spec["dtype"] == "bf16" or not x.shape[0] else act_dequant_1x128(*act_quant_1x128(x)).to(torch.bfloat16)
    expected = cpu.ops.moe_experts(x_in, ids, w, full)
    received = ep.reset_counters().sum()
    kept = torch.tensor([int((ids >= 0).sum()), int(received)])
    if group is not None:
        dist.all_reduce(kept, group=group)
    if kept[0] != kept[1]:
        return float("nan"), f"{int(kept[1])} routes received over the ranks, {int(kept[0])} routed"
    if spec["mode"] == "decode" and not torch.equal(got, step(False)):
        return float("nan"), "decode mode differs from normal mode"
    if world == 1 and spec["layout"] == "standard":
        err = float((got.float() - expected.float()).abs().max()) if got.numel() else 0.0
        return err, "" if torch.equal(got, expected) else "not bit for bit equal to moe_experts"
    rms = float(expected.float().pow(2).mean().sqrt()) if expected.numel() else 0.0
    tol = Tolerance(TOLERANCE.atol * max(rms, 1e-6), TOLERANCE.rtol, TOLERANCE.reason)
    err, ok, detail = compare_close(got, expected.double(), tol)
    if ok and spec["dtype"] == "fp8" and x.shape[0]:
        from dsv4hal.conformance.cases_moe import OP_EXPERTS, TOLERANCES, compare_experts

        base = TOLERANCES[OP_EXPERTS]
        ref = cpu.ops.moe_experts(x, ids, w, full).double()
        fp8_tol = Tolerance(base.atol * max(rms, 1e-6), base.rtol, base.reason)
        _, ok, detail = compare_experts(got, ref, fp8_tol)
        detail = f"against the bf16 tokens: {detail}" if not ok else ""
    return err, "" if ok else (detail or "outside the tolerance")


def rank_worker(rank: int, world: int, seed: int, names: list[str] | None) -> list[dict[str, Any]]:
    """Every cell of this world size on this rank (run_ranks' target)."""
    import torch.distributed as dist

    import dsv4hal

    cpu = dsv4hal.select_platform("cpu")
    group = dist.group.WORLD if world > 1 else None
    out = []
    for name, spec in case_names(world):
        if names is not None and name not in names:
            continue
        start = time.perf_counter()
        try:
            err, problem = _run_cell(rank, world, spec, seed, group, cpu)
        except Exception as exc:  # a cell's failure is its result; the other cells still run
            err, problem = float("nan"), f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
        out.append({"case": name, "implementation": spec["backend"], "max_error": err, "problem": problem,
                    "seconds": time.perf_counter() - start})
    return out


def run_ep_cells(world_sizes: tuple[int, ...] = WORLD_SIZES, *, seed: int = 0, names: list[str] | None = None,
                 timeout_s: float = 20.0, join_timeout_s: float = 240.0) -> list[Any]:
    """dsv4hal.conformance.cells.Cell for every case (a cell passes when every rank passes it)."""
    from dsv4hal.conformance.cells import Cell
    from dsv4hal.distributed.spawn import run_ranks

    cells = []
    for world in world_sizes:
        if world == 1:  # the loop-back has no group: run in this process
            results = {0: ("ok", rank_worker(0, 1, seed, names))}
        else:
            results = run_ranks(rank_worker, world, seed, names, timeout_s=timeout_s, join_timeout_s=join_timeout_s)
        failed = {r: v for r, (s, v) in results.items() if s != "ok"}
        for name, spec in case_names(world):
            if names is not None and name not in names:
                continue
            if failed:
                cells.append(Cell("ep_dispatch_combine", spec["backend"], name, "eager", None, "cpu", "fail",
                                  detail="; ".join(f"rank {r}: {str(v).splitlines()[0]}" for r, v in failed.items())))
                continue
            per_rank = [next(c for c in results[r][1] if c["case"] == name) for r in range(world)]
            problems = [f"rank {r}: {c['problem']}" for r, c in enumerate(per_rank) if c["problem"]]
            errs = [c["max_error"] for c in per_rank]
            cells.append(Cell("ep_dispatch_combine", spec["backend"], name, "eager", None, "cpu",
                              "fail" if problems else "pass", max_error=max(errs),
                              tolerance={"atol": TOLERANCE.atol, "rtol": TOLERANCE.rtol, "reason": TOLERANCE.reason},
                              detail="; ".join(problems), seconds=max(c["seconds"] for c in per_rank)))
    return cells
