"""`dsv4hal demo --ep N`: the demo's layers over N processes joined by torch.distributed (gloo on the CPU; NCCL with
one GPU a process, rank r on cuda:r). Every rank holds E / N experts of each layer and serves its own requests
(`--batch` of them: data-parallel attention); each MoE layer dispatches its tokens to the experts' ranks, runs
moe_experts there and combines the outputs back (dsv4hal.engine_model.ep_model). Rank 0's per-op decode times
include ep_dispatch and ep_combine (each waits for the slowest rank, as a step does).

With `check`, every MoE call (each layer of the prefill and of every decode step) is compared with the single-rank
moe_experts on the same tokens, routes and weights (all experts of the layer, the same weights) within the
expert-parallel cells' tolerance (dsv4hal.distributed.conformance.TOLERANCE, relative to the output's RMS): partial
sums are rounded to bf16 on their rank before the sum, so they match closely but not bit for bit. Every rank also
runs the single-rank model on its requests and reports how far the model outputs are apart; that figure is not
held to the tolerance, because the rounding can flip a later layer's top-6 choice among experts whose scores tie
to bf16, which moves that output by a whole route."""

from __future__ import annotations

import argparse
from typing import Any

from dsv4hal.demo.ranks import (
    COLLECTIVE_TIMEOUT_S,
    compare_outputs,
    ops_table,
    rank_summary,
    run_rank,
    spawn,
    write_result,
)

INPUT_SEED = 101  # rank r's requests: embeddings seeded INPUT_SEED + r (the weights: seed 0 on every rank)


def rank_run(rank: int, world: int, opts: dict[str, Any]) -> dict[str, Any]:
    """One rank's prefill and decode steps (dsv4hal.distributed.spawn.run_ranks' target)."""
    import torch.distributed as dist

    from dsv4hal.engine_model.ep_model import EPDemoModel

    res, model, single = run_rank(opts, lambda platform, cfg: EPDemoModel(
        platform, cfg, opts["batch"], dist.group.WORLD, 0, opts["tokens_per_request"], check=opts["check"]),
        INPUT_SEED + rank)
    out = {**rank_summary(rank, res, opts["steps"]), "ep_backends": model.backends(),
           "local_experts": model.ep_prefill.local_experts()}
    if opts["check"]:
        out["check"] = compare_outputs(*zip(*model.checked))
        apart = compare_outputs(res["outputs"], single()["outputs"])
        out["check"]["model_outputs_rel_error"] = apart["worst_rel_error"]
    return out


def run_ep_demo(world: int, *, platform: str | None = None, size: str = "small", batch: int = 2, context: int = 40,
                steps: int = 3, fill: str = "prefill", tokens_per_request: int = 1, check: bool = False,
                timeout_s: float = COLLECTIVE_TIMEOUT_S, join_timeout_s: float = 3600.0) -> dict[str, Any]:
    """The demo on `world` processes; rank 0's step and per-op times, every rank's summary (and check)."""
    from dsv4hal.engine_model.config import SIZES
    from dsv4hal.errors import Dsv4HalError

    experts = SIZES[size].experts
    if experts % world:
        raise Dsv4HalError(f"--ep {world}: the {size} layers have {experts} experts, not a multiple of {world}",
                           remedy="give --ep a divisor of the expert count (small: 2, 4, 8; flash: up to 256)")
    opts = {"platform": platform, "size": size, "batch": batch, "context": context, "steps": steps, "fill": fill,
            "tokens_per_request": tokens_per_request, "check": check}
    ranks, backend = spawn("--ep", world, rank_run, opts, timeout_s=timeout_s, join_timeout_s=join_timeout_s)
    r0, slowest = ranks[0], max(r["step_us"] for r in ranks)
    res = {"ep": world, "group_backend": backend, "platform": r0["platform"],
           "device": r0["device"], "size": size, "batch_per_rank": batch, "context": context, "steps": steps,
           "fill": fill, "tokens_per_request": tokens_per_request, "step_us": r0["step_us"],
           "step_us_slowest_rank": slowest,
           "decode_tokens_per_s": world * batch * tokens_per_request / slowest * 1e6 if slowest else 0.0,
           "ops_us": r0["ops_us"], "calls_per_step": r0["calls_per_step"], "ep_backends": r0["ep_backends"],
           "kernels": r0["kernels"], "finite": all(r["finite"] for r in ranks),
           "ranks": [{k: r[k] for k in ("rank", "step_us", "prefill_s", "ops_us", "local_experts")} for r in ranks]}
    if check:
        res["check"] = {"ok": all(r["check"]["ok"] for r in ranks),
                        "worst_rel_error": max(r["check"]["worst_rel_error"] for r in ranks),
                        "moe_calls_per_rank": r0["check"]["calls"],
                        "model_outputs_rel_error": max(r["check"]["model_outputs_rel_error"] for r in ranks),
                        "tolerance": r0["check"]["tolerance"],
                        "problems": [f"rank {r['rank']}: {p}" for r in ranks for p in r["check"]["problems"]]}
    return res


def main(args: argparse.Namespace) -> int:
    """`dsv4hal demo --ep N` (N > 1): run, print the step and the per-op times, write the JSON."""
    from dsv4hal.errors import Dsv4HalError
    from dsv4hal.output_paths import check_output

    unsupported = [f for f, on in (("--graph", args.graph), ("--compile", args.compile), ("--plot", args.plot))
                   if on]
    if unsupported:
        raise Dsv4HalError(f"--ep runs the decode steps eagerly: {', '.join(unsupported)} not available with it",
                           remedy="drop " + ", ".join(unsupported))
    check_output(args.json)
    res = run_ep_demo(args.ep, platform=args.platform, size=args.size, batch=args.batch, context=args.context,
                      steps=args.steps, fill=args.fill, tokens_per_request=args.tokens_per_request,
                      check=args.compare_cpu)
    print(f"{res['platform']}: {args.size} layers over {res['ep']} ranks ({res['group_backend']}), "
          f"{res['batch_per_rank']} requests a rank; decode step {res['step_us'] / 1e3:.2f} ms on rank 0 (slowest "
          f"rank {res['step_us_slowest_rank'] / 1e3:.2f} ms), {res['decode_tokens_per_s']:.1f} tokens/s in all")
    print(f"  expert-parallel backend: prefill {res['ep_backends']['prefill']}, decode {res['ep_backends']['decode']}")
    print(ops_table(res))
    if "check" in res:
        c = res["check"]
        print(f"  MoE layers against single-rank moe_experts ({c['moe_calls_per_rank']} calls a rank): worst error "
              f"{c['worst_rel_error']:.3g} of the output RMS (tolerance {c['tolerance']['atol_of_rms']:.3g} + "
              f"{c['tolerance']['rtol']:.3g} relative): {'ok' if c['ok'] else 'FAIL'}; the model outputs differ from "
              f"the single-rank model's by {c['model_outputs_rel_error']:.3g} of their RMS")
    return write_result(args.json, res)
