"""Kernel by kernel, one replay of the decode step's CUDA graph: what the step's time is made of, the dsv4hal ops'
kernels and the engine-side work around them (projections, norms, RoPE) alike. A diagnostic for the results README:
the graph step minus the sum of the ops timed alone is the harness, and this says which kernels it is."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch

TOP = 30  # kernels listed by total time; the rest are summed


def profile_replay(graph: Any) -> dict[str, Any]:
    """GPU time per kernel name over one graph.replay() (CUPTI records a graph's kernels one by one)."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        graph.replay()
        torch.cuda.synchronize()
    us: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA and e.device_time > 0:
            name = e.name[:120]
            us[name] += e.device_time
            calls[name] += 1
    ranked = sorted(us, key=lambda n: -us[n])
    rest = ranked[TOP:]
    return {"kernels_us": sum(us.values()), "kernel_launches": sum(calls.values()),
            "top": [{"kernel": n, "calls": calls[n], "us": round(us[n], 2)} for n in ranked[:TOP]],
            "rest": {"kernels": len(rest), "calls": sum(calls[n] for n in rest),
                     "us": round(sum(us[n] for n in rest), 2)}}
