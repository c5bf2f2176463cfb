"""What the multi-process demos (`--ep N`, `--tp N`) share: starting the ranks, a rank's summary, the check of
outputs against the single-rank model, and the printed per-op table."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

COLLECTIVE_TIMEOUT_S = 600.0  # how long a rank may wait in one collective for the others (a full-size prefill)


def spawn(flag: str, world: int, rank_run: Callable[..., dict[str, Any]], opts: dict[str, Any], *,
          timeout_s: float, join_timeout_s: float) -> tuple[list[dict[str, Any]], str]:
    """Run rank_run on `world` processes (gloo on the CPU; NCCL with one GPU a process): every rank's result and
    the process group's backend. `flag` names the option in the errors."""
    import torch

    import dsv4hal
    from dsv4hal.distributed.spawn import ok_results, run_ranks
    from dsv4hal.errors import Dsv4HalError

    device = dsv4hal.select_platform(opts["platform"]).device_type
    if device == "cuda" and torch.cuda.device_count() < world:
        raise Dsv4HalError(f"{flag} {world} runs one process a GPU; this machine has {torch.cuda.device_count()}",
                           remedy=f"use {flag} {torch.cuda.device_count()} or fewer, or the CPU (--platform cpu)")
    backend = "nccl" if device == "cuda" else "gloo"
    return ok_results(run_ranks(rank_run, world, opts, timeout_s=timeout_s, join_timeout_s=join_timeout_s,
                                backend=backend)), backend


def run_rank(opts: dict[str, Any], build: Callable[[Any, Any], Any], input_seed: int
             ) -> tuple[dict[str, Any], Any, Callable[[], dict[str, Any]]]:
    """One rank's demo: the platform opts name, the model build(platform, cfg) makes, run_demo over opts' shape.
    Returns run_demo's result, the model, and a function running the single-rank model on the same requests."""
    import dsv4hal
    from dsv4hal.demo.runner import run_demo
    from dsv4hal.engine_model.config import SIZES

    platform = dsv4hal.select_platform(opts["platform"])
    models: list[Any] = []

    def make(cfg: Any) -> Any:
        models.append(build(platform, cfg))
        return models[-1]

    run = dict(cfg=SIZES[opts["size"]], fill=opts["fill"], tokens_per_request=opts["tokens_per_request"],
               input_seed=input_seed)
    shape = (platform, opts["batch"], opts["context"], opts["steps"])
    res = run_demo(*shape, make_model=make, **run)
    return res, models[0], lambda: run_demo(*shape, **run)


def rank_summary(rank: int, res: dict[str, Any], steps: int) -> dict[str, Any]:
    """A rank's run_demo result as the multi-process demos report it: times per decode step, calls per step."""
    import torch

    steps = max(steps, 1)
    return {"rank": rank, "platform": res["platform"], "device": res["device"], "prefill_s": res["prefill_s"],
            "step_us": res["decode_step_s"] * 1e6, "decode_tokens_per_s": res["decode_tokens_per_s"],
            "ops_us": {k: v / steps * 1e6 for k, v in res["decode_breakdown_s"].items()},
            "calls_per_step": {k: v // steps for k, v in res["decode_calls"].items()}, "kernels": res["kernels"],
            "finite": all(bool(torch.isfinite(o).all()) for o in res["outputs"])}


def compare_outputs(got: Any, expected: Any) -> dict[str, Any]:
    """Each expert-parallel output against the single-rank one, within the EP cells' tolerance scaled by the
    expected output's RMS."""
    from dsv4hal.conformance.types import Tolerance, compare_close
    from dsv4hal.distributed.conformance import TOLERANCE

    worst, problems = 0.0, []
    for i, (g, e) in enumerate(zip(got, expected)):
        rms = max(float(e.double().pow(2).mean().sqrt()), 1e-12)
        tol = Tolerance(TOLERANCE.atol * rms, TOLERANCE.rtol, TOLERANCE.reason)
        err, ok, detail = compare_close(g, e.double(), tol)
        worst = max(worst, err / rms)
        if not ok:
            problems.append(f"call {i}: {detail}")
    ok = not problems and len(got) == len(expected)
    return {"ok": ok, "calls": len(got), "worst_rel_error": worst, "tolerance": {
        "atol_of_rms": TOLERANCE.atol, "rtol": TOLERANCE.rtol, "reason": TOLERANCE.reason}, "problems": problems}


def ops_table(res: dict[str, Any]) -> str:
    """Rank 0's per-op decode times, largest first, with each op's kernel (a collective's: 'collective')."""
    total = sum(res["ops_us"].values()) or 1.0
    return "\n".join(f"  {name:<26} {us / 1e3:9.2f} ms  {100 * us / total:5.1f}%  "
                     f"({res['kernels'].get(name, 'collective')})"
                     for name, us in sorted(res["ops_us"].items(), key=lambda kv: -kv[1]))


def write_result(json_path: str | None, res: dict[str, Any]) -> int:
    """The JSON where asked; the exit code: 0 when every rank's output is finite and the check (if any) passed."""
    if json_path:
        Path(json_path).parent.mkdir(parents=True, exist_ok=True)
        Path(json_path).write_text(json.dumps(res, indent=1) + "\n")
    return 0 if res["finite"] and res.get("check", {"ok": True})["ok"] else 1
