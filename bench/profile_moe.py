"""Where a moe_experts call spends its GPU time, kernel by kernel (torch.profiler), for the kernels whose goals are
missed: DeepGEMM FP8 psum at T = 4096 (goal 600 TFLOP/s), triton_kernels and Marlin MXFP4 at T = 64 and 4096.

    python3 bench/profile_moe.py --json out/profile-moe.json
    python3 bench/profile_moe.py --json out/profile-moe-decode.json \
        --runs mxfp4:marlin_mxfp4_sm90:1,mxfp4:marlin_mxfp4_sm90:8
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

import dsv4hal
from dsv4hal.bench.common import bound_op
from dsv4hal.conformance.cases_moe import _expert_weights, _experts_params

RUNS = (("fp8_block", "deepgemm_fp8_psum_sm90", 4096), ("mxfp4", "triton_kernels_mxfp4_sm90", 4096),
        ("mxfp4", "triton_kernels_mxfp4_sm90", 64), ("mxfp4", "marlin_mxfp4_sm90", 64))
CALLS = 5


def _profile(op: object, args: tuple) -> list[dict]:
    for _ in range(2):  # compile and warm up outside the trace
        op(*args)  # type: ignore[operator]
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(CALLS):
            op(*args)  # type: ignore[operator]
        torch.cuda.synchronize()
    rows = [{"kernel": e.key[:160], "us_per_call": e.device_time_total / CALLS, "launches_per_call": e.count / CALLS}
            for e in prof.key_averages() if e.device_time_total > 0]
    return sorted(rows, key=lambda r: -r["us_per_call"])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", required=True)
    ap.add_argument("--runs", help="FORMAT:KERNEL:T,... (default: the goals' runs above)")
    args = ap.parse_args()
    runs = RUNS if not args.runs else [(f, n, int(t)) for f, n, t in (r.split(":") for r in args.runs.split(","))]
    platform = dsv4hal.select_platform()
    gen = torch.Generator(device="cuda").manual_seed(0)
    out: dict = {"device": torch.cuda.get_device_name(), "calls": CALLS, "runs": []}
    weights: dict[str, object] = {}
    for fmt, name, t in runs:
        p = _experts_params("flash", t, fmt)
        if fmt not in weights:
            weights = {fmt: _expert_weights(p, torch.device("cuda"), gen)}  # one format's weights at a time
        op = bound_op(platform, "moe_experts", name)
        x = torch.randn(t, p["H"], device="cuda", generator=gen).to(torch.bfloat16)
        ids = torch.rand(t, p["E"], device="cuda", generator=gen).argsort(1)[:, :p["top_k"]].to(torch.int32)
        tw = torch.rand(t, p["top_k"], device="cuda", generator=gen) + 0.5
        row: dict = {"format": fmt, "kernel": name, "T": t}
        try:
            kernels = _profile(op, (x, ids, tw, op.prepare_weights(weights[fmt])))
            total = sum(r["us_per_call"] for r in kernels)
            row.update(total_us=total, kernels=kernels)
            print(f"{name} T={t}: {total:.1f} us of kernels a call", flush=True)
            for r in kernels[:8]:
                us, n = r["us_per_call"], r["launches_per_call"]
                print(f"  {us:9.1f} us {100 * us / total:5.1f}%  x{n:g}  {r['kernel'][:100]}", flush=True)
        except Exception as exc:  # recorded; the other runs still go
            row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
            print(f"{name} T={t}: {row['error']}", flush=True)
        out["runs"].append(row)
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
