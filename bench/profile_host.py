"""Where the host time of a bound call goes inside its kernel's Python (on a GPU): cProfile over many eager calls of
moe_experts at one token (V4-Flash MXFP4 experts, the portable fused MoE) and of sparse_attention_decode through the
Triton kernel, the top functions by own time. Profiling slows Python calls alike, so shares are read, not absolute
times; the unprofiled time per call is printed first.

    python3 bench/profile_host.py --json out/profile-host.json [--calls 2000]
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import time
from collections.abc import Callable
from pathlib import Path

import torch

import dsv4hal
from dsv4hal.bench.common import bound_op


def _profile(fn: Callable[[], object], calls: int, top: int = 25) -> dict[str, object]:
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    per_call = (time.perf_counter() - t0) * 1e6 / calls
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    torch.cuda.synchronize()
    stats = pstats.Stats(prof)
    rows = []
    for (path, line, name), (_, ncalls, tottime, cumtime, _) in stats.stats.items():  # type: ignore[attr-defined]
        rows.append({"function": f"{Path(path).name}:{line}({name})", "calls_per_call": ncalls / calls,
                     "own_us_per_call": tottime * 1e6 / calls, "cum_us_per_call": cumtime * 1e6 / calls})
    rows.sort(key=lambda r: -r["own_us_per_call"])
    total = sum(r["own_us_per_call"] for r in rows)
    return {"host_us_per_call_unprofiled": per_call, "profiled_us_per_call": total, "top_by_own_time": rows[:top]}


def main() -> None:
    from host_parts import _args  # (bench/ is on the path when this runs as a script)

    ap = argparse.ArgumentParser()
    ap.add_argument("--json", required=True)
    ap.add_argument("--calls", type=int, default=2000)
    a = ap.parse_args()
    platform = dsv4hal.select_platform()
    out: dict[str, object] = {"command": f"python3 bench/profile_host.py --calls {a.calls} --json ..."}
    from dsv4hal.conformance.cases_moe import _expert_weights, _experts_params

    gen = torch.Generator(device="cuda").manual_seed(0)
    params = _experts_params("flash", 1, "mxfp4")
    op = platform.ops.moe_experts
    prepared = op.prepare_weights(_expert_weights(params, torch.device("cuda"), gen), tokens=64)
    x = torch.randn(1, params["H"], device="cuda", generator=gen).bfloat16()
    ids = torch.arange(params["top_k"], device="cuda", dtype=torch.int32)[None]
    tw = torch.rand(1, params["top_k"], device="cuda", generator=gen)
    out["moe_experts T=1 (" + prepared.implementation + ")"] = _profile(lambda: op(x, ids, tw, prepared), a.calls)
    args = _args("cuda")
    attn = bound_op(platform, "sparse_attention_decode", "triton_sparse_decode")
    out["sparse_attention_decode T=1 (triton_sparse_decode)"] = _profile(lambda: attn(**args), a.calls)
    for name, r in out.items():
        if isinstance(r, dict):
            print(f"{name}: {r['host_us_per_call_unprofiled']:.1f} us a call unprofiled")
            for row in r["top_by_own_time"][:14]:
                print(f"   {row['own_us_per_call']:7.2f} us own  {row['cum_us_per_call']:7.2f} cum  "
                      f"x{row['calls_per_call']:.0f}  {row['function']}")
    Path(a.json).parent.mkdir(parents=True, exist_ok=True)
    Path(a.json).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
