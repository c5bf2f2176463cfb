"""Where mHC's gated ops spend their time at decode sizes: GPU durations (torch.profiler, CUPTI) of every kernel of
mhc_pre / mhc_head on each path (one launch with grid barriers, bench/proto_mhc_one_launch.py; its phases as three
launches; the library's two-launch Triton path; DeepGEMM's GEMM + the Triton apply), the Sinkhorn's share (20
iterations against 1), and a grid barrier alone (two polling schemes), so that a design is chosen from measured
parts.

    python3 bench/profile_mhc_phases.py --json out/profile-mhc-phases.json
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import proto_mhc_one_launch as proto
import torch
import triton
import triton.language as tl
from torch.profiler import ProfilerActivity, profile

from dsv4hal.bench.mhc import _args
from dsv4hal.bench.timing import graph_us
from dsv4hal.kernels import deepgemm_mhc
from dsv4hal.kernels.triton import mhc as tm

REPS = 20


def kernel_us(fn: Any) -> list[tuple[str, float]]:
    """GPU duration of each kernel `fn` launches, in launch order (name, mean us over REPS calls)."""
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(REPS):
            fn()
        torch.cuda.synchronize()
    evs = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA and e.device_time > 0),
                 key=lambda e: e.time_range.start)
    per = max(1, len(evs) // REPS)
    total = [0.0] * per
    for i, e in enumerate(evs[:per * REPS]):
        total[i % per] += e.device_time
    return [(evs[i].name[:50], total[i] / REPS) for i in range(per)] if evs else []


@triton.jit
def _poll_volatile_sync(words, nprog):
    """grid_sync with the wait done by every thread's volatile loads (no block barrier per poll), then one
    acquiring read."""
    tl.debug_barrier()
    gen = tl.atomic_add(words + 32, 0, sem="acquire", scope="gpu")
    arrived = tl.atomic_add(words, 1, sem="acq_rel", scope="gpu")
    if arrived == nprog - 1:
        tl.atomic_xchg(words, 0, sem="relaxed", scope="gpu")
        tl.atomic_add(words + 32, 1, sem="release", scope="gpu")
    else:
        while tl.load(words + 32, volatile=True) == gen:
            pass
    tl.atomic_add(words + 32, 0, sem="acquire", scope="gpu")
    tl.debug_barrier()


@triton.jit
def _barriers_kernel(words, nprog, N: tl.constexpr, VOLATILE: tl.constexpr):
    for _ in tl.static_range(N):
        if VOLATILE:
            _poll_volatile_sync(words, nprog)
        else:
            proto.grid_sync(words, nprog)


def barrier_rows() -> list[dict[str, Any]]:
    rows = []
    words = torch.zeros(64, dtype=torch.int32, device="cuda")
    for volatile in (False, True):
        for g in (32, 128):
            us = {}
            for n in (0, 8):
                us[n] = graph_us(lambda n=n, g=g, v=volatile: _barriers_kernel[(g,)](words, g, N=n, VOLATILE=v,
                                                                          num_warps=4))
            rows.append({"volatile_polling": volatile, "programs": g, "launch_us_0": us[0], "launch_us_8": us[8],
                         "per_barrier_us": (us[8] - us[0]) / 8, "words_at_rest": int(words[0])})
            print("barrier", rows[-1], flush=True)
    return rows


def _pre(args: tuple, mode: str, iters: int, head: bool) -> Any:
    x, fn, base, scale = args
    if mode == "deepgemm":
        return deepgemm_mhc.mhc_pre(x, fn, base, scale, sinkhorn_iters=iters)
    if mode == "two_launch":
        return tm._gated(x, fn, base, scale, 1e-6, 1e-6, iters, head, None)
    return proto._one_launch(x, fn, base, scale, 1e-6, 1e-6, iters, head, None, mode == "three_launches")


def op_rows() -> list[dict[str, Any]]:
    gen = torch.Generator(device="cuda").manual_seed(5)
    rows = []
    for op, t, iters in (("mhc_pre", 1, 20), ("mhc_pre", 1, 1), ("mhc_pre", 64, 20), ("mhc_pre", 64, 1),
                         ("mhc_head", 1, 1), ("mhc_head", 64, 1)):
        args = _args(op, t, 4096, gen)
        head = op == "mhc_head"
        for mode in ("one_launch", "three_launches", "two_launch") + (() if head else ("deepgemm",)):
            row = {"op": op, "T": t, "iters": iters, "mode": mode,
                   "kernels_us": kernel_us(lambda a=args, m=mode, i=iters, h=head: _pre(a, m, i, h)),
                   "graph_us": graph_us(lambda a=args, m=mode, i=iters, h=head: _pre(a, m, i, h))}
            row["kernels_sum_us"] = sum(us for _, us in row["kernels_us"])
            rows.append(row)
            print(op, t, iters, mode, round(row["graph_us"], 2), "sum", round(row["kernels_sum_us"], 2),
                  [(k, round(v, 2)) for k, v in row["kernels_us"]], flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", required=True)
    a = ap.parse_args()
    out = {"command": "python3 bench/profile_mhc_phases.py", "device": torch.cuda.get_device_name(),
           "barriers": barrier_rows(), "ops": op_rows()}
    with open(a.json, "w") as fh:
        json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()
