"""`dsv4hal demo --tp N`: the demo's layers over N processes joined by torch.distributed (gloo on the CPU; NCCL with
one GPU a process, rank r on cuda:r), attention tensor-parallel: every rank serves the same requests with heads / N
of each attention's query heads (padded to the count the attention kernel runs) and the output projection's
matching columns; the projection's partial sums are all-reduced (tp_all_reduce); the KV head, indexer, compressors
and MoE are replicated (dsv4hal.engine_model.tp_model). Rank 0's per-op decode times include tp_all_reduce (it waits
for the slowest rank, as a step does).

The partial sums are reduced in fp32 and rounded to bf16 once, after the sum (reduce "fp32", the default): only
the sum's order differs from the single-rank projection, so the router sees the same scores (2 ranks on the CPU:
the same bits). Reduce "bf16" rounds each rank's partial first, as engines reduce to halve the bytes: a later
layer's top-6 may then flip between experts whose scores tie to bf16, which moves that output by a whole route.
With `check`, every rank also runs the single-rank model on the same requests, and each step's output is compared
with it within the expert-parallel cells' tolerance relative to the output's RMS
(dsv4hal.demo.ranks.compare_outputs)."""

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

INPUT_SEED = 101  # the requests every rank serves (tensor parallel: the same tokens on every rank)


def rank_run(rank: int, world: int, opts: dict[str, Any]) -> dict[str, Any]:
    """One rank's prefill and decode steps (dsv4hal.distributed.spawn.run_ranks' target)."""
    import torch.distributed as dist

    from dsv4hal.engine_model.tp_model import TPDemoModel

    res, m, single = run_rank(opts, lambda platform, cfg: TPDemoModel(
        platform, cfg, opts["batch"], dist.group.WORLD, 0, opts["tokens_per_request"], reduce_dtype=opts["reduce"]),
        INPUT_SEED)
    out = {**rank_summary(rank, res, opts["steps"]), "tp_backend": m.tp.decision.chosen.name,
           "heads": {"per_rank": m.heads.heads, "padded": m.heads.padded, "kernels": m.heads.kernels}}
    if opts["check"]:
        out["check"] = compare_outputs(res["outputs"], single()["outputs"])
    return out


def run_tp_demo(world: int, *, platform: str | None = None, size: str = "small", batch: int = 2, context: int = 40,
                steps: int = 3, fill: str = "prefill", tokens_per_request: int = 1, check: bool = False,
                reduce: str = "fp32", timeout_s: float = COLLECTIVE_TIMEOUT_S, join_timeout_s: float = 3600.0
                ) -> dict[str, Any]:
    """The demo on `world` processes; rank 0's step and per-op times (tp_all_reduce among them) and check."""
    from dsv4hal.engine_model.config import SIZES
    from dsv4hal.errors import Dsv4HalError

    cfg = SIZES[size]
    if cfg.heads % world or cfg.o_groups % world:
        raise Dsv4HalError(f"--tp {world}: the {size} layers have {cfg.heads} query heads in {cfg.o_groups} output "
                           f"groups, not both multiples of {world}",
                           remedy=f"give --tp a divisor of {cfg.o_groups} (1, 2, 4 or 8)")
    opts = {"platform": platform, "size": size, "batch": batch, "context": context, "steps": steps, "fill": fill,
            "tokens_per_request": tokens_per_request, "check": check, "reduce": reduce}
    ranks, backend = spawn("--tp", world, rank_run, opts, timeout_s=timeout_s, join_timeout_s=join_timeout_s)
    r0, slowest = ranks[0], max(r["step_us"] for r in ranks)
    res = {"tp": world, "group_backend": backend, "platform": r0["platform"], "device": r0["device"], "size": size,
           "batch": batch, "context": context, "steps": steps, "fill": fill, "tokens_per_request": tokens_per_request,
           "reduce_dtype": reduce, "step_us": r0["step_us"], "step_us_slowest_rank": slowest,
           "tp_all_reduce_us": r0["ops_us"].get("tp_all_reduce", 0.0),
           "decode_tokens_per_s": batch * tokens_per_request / slowest * 1e6 if slowest else 0.0,
           "ops_us": r0["ops_us"], "calls_per_step": r0["calls_per_step"], "tp_backend": r0["tp_backend"],
           "heads": r0["heads"], "kernels": r0["kernels"], "finite": all(r["finite"] for r in ranks),
           "ranks": [{k: r[k] for k in ("rank", "step_us", "prefill_s", "ops_us")} for r in ranks]}
    if check:
        res["check"] = {"ok": all(r["check"]["ok"] for r in ranks),
                        "worst_rel_error": max(r["check"]["worst_rel_error"] for r in ranks),
                        "steps_compared": r0["check"]["calls"], "tolerance": r0["check"]["tolerance"],
                        "problems": [f"rank {r['rank']}: {p}" for r in ranks for p in r["check"]["problems"]]}
    return res


def main(args: argparse.Namespace) -> int:
    """`dsv4hal demo --tp N` (N > 1): run, print the step and the per-op times, write the JSON."""
    from dsv4hal.errors import Dsv4HalError
    from dsv4hal.output_paths import check_output

    unsupported = [f for f, on in (("--graph", args.graph), ("--compile", args.compile), ("--plot", args.plot),
                                   ("--ep", getattr(args, "ep", 1) > 1)) if on]
    if unsupported:
        raise Dsv4HalError(f"--tp runs the decode steps eagerly with the MoE replicated: {', '.join(unsupported)} "
                           "not available with it", remedy="drop " + ", ".join(unsupported))
    check_output(args.json)
    res = run_tp_demo(args.tp, platform=args.platform, size=args.size, batch=args.batch, context=args.context,
                      steps=args.steps, fill=args.fill, tokens_per_request=args.tokens_per_request,
                      check=args.compare_cpu)
    h = res["heads"]
    print(f"{res['platform']}: {args.size} layers over {res['tp']} ranks ({res['group_backend']}), attention "
          f"tensor-parallel ({h['per_rank']} query heads a rank, run as {h['padded']}), {res['batch']} requests; "
          f"decode step {res['step_us'] / 1e3:.2f} ms on rank 0 (slowest rank {res['step_us_slowest_rank'] / 1e3:.2f}"
          f" ms), tp_all_reduce {res['tp_all_reduce_us'] / 1e3:.2f} ms a step ({res['tp_backend']})")
    print(ops_table(res))
    if "check" in res:
        c = res["check"]
        print(f"  outputs against the single-rank model ({c['steps_compared']} steps a rank): worst error "
              f"{c['worst_rel_error']:.3g} of the output RMS (tolerance {c['tolerance']['atol_of_rms']:.3g} + "
              f"{c['tolerance']['rtol']:.3g} relative): {'ok' if c['ok'] else 'FAIL'}")
    return write_result(args.json, res)
