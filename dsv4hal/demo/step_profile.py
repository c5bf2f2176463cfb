"""Kernel by kernel, one replay of the decode step's CUDA graph: what the step's time is made of, the dsv4hal ops'
kernels and the engine-side work around them (projections, norms, RoPE) alike, each kernel attributed to the op
that launched it or to none.

A graph replay carries no host ranges, so the attribution comes from an eager step profiled with each op call in a
range of its own (`RangeTimer`): its launches, in order, labelled by the range they fell in. The replay runs the
same launches in the same order (one stream), so the i-th replayed launch of a kernel name takes the label of the
i-th eager launch of that name; a name the eager step launched fewer times (or never: Inductor's fused kernels
when the step is compiled) counts as outside the ops."""

from __future__ import annotations

import bisect
import contextlib
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from typing import Any

import torch

TOP = 30  # kernels listed by total time; the rest are summed
OP_RANGE = "dsv4hal.op:"  # the profiler range an op call runs in (RangeTimer)
NAME_CHARS = 120
# host API calls that launch device work (CUDA runtime and driver: cudaLaunchKernel, cuLaunchKernelEx, ...); each
# shares its correlation id with the kernel it launched
LAUNCH_API = ("cuda", "cu")


class RangeTimer:
    """The model's op timer for attribution: each op call in a profiler range named after the op (no sync)."""

    def __call__(self, name: str) -> contextlib.AbstractContextManager[None]:
        return torch.profiler.record_function(OP_RANGE + name)


def _kernel_events(prof: Any) -> Iterator[Any]:
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA and e.device_time > 0:
            yield e


def eager_launch_labels(run: Callable[[], Any]) -> list[tuple[str, str | None]]:
    """(kernel name, op or None) of each kernel `run()` launches, in the order they ran; `run` calls the model's
    forward with a RangeTimer. A kernel is the op's when the host API call that launched it (the runtime or driver
    event with the kernel's correlation id: a Triton launch is no torch op, so only this event dates it) began
    inside the op's range."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        run()
        torch.cuda.synchronize()
    events = list(prof.events())
    cpu = [e for e in events if e.device_type == torch.autograd.DeviceType.CPU]
    ranges = sorted((e.time_range.start, e.time_range.end, e.name[len(OP_RANGE):]) for e in cpu
                    if e.name.startswith(OP_RANGE))
    launched_at = {e.id: e.time_range.start for e in cpu if e.name.startswith(LAUNCH_API)}
    kernels = sorted(_kernel_events(prof), key=lambda e: e.time_range.start)
    return label_launches([(e.name[:NAME_CHARS], e.id) for e in kernels], launched_at, ranges)


def label_launches(kernels: list[tuple[str, int]], launched_at: dict[int, float],
                   ranges: list[tuple[float, float, str]]) -> list[tuple[str, str | None]]:
    """(name, op or None) of each kernel (name, correlation id), in the given order: the op whose host range holds
    the launch time of the API call with the kernel's correlation id; None where no call or no range matches."""
    out = []
    for name, corr in kernels:
        t = launched_at.get(corr)
        out.append((name, None if t is None else _range_at(ranges, t)))
    return out


def _range_at(ranges: list[tuple[float, float, str]], t: float) -> str | None:
    """The op whose range holds host time t (ranges sorted by start and not nested: op calls do not nest)."""
    i = bisect.bisect_right(ranges, (t, float("inf"), "")) - 1
    if i >= 0 and ranges[i][0] <= t <= ranges[i][1]:
        return ranges[i][2]
    return None


def attribute(replay: list[tuple[str, float]], labels: list[tuple[str, str | None]]) -> list[str | None]:
    """The op of each replayed launch (name, us), in replay order: the label of the eager launch of the same name
    and the same rank among that name's launches; None (outside the ops) past the eager launches of that name."""
    by_name: dict[str, list[str | None]] = defaultdict(list)
    for name, op in labels:
        by_name[name].append(op)
    seen: Counter[str] = Counter()
    out = []
    for name, _ in replay:
        ops = by_name.get(name, [])
        out.append(ops[seen[name]] if seen[name] < len(ops) else None)
        seen[name] += 1
    return out


def _ranked(us: dict[str, float], calls: dict[str, int]) -> dict[str, Any]:
    ranked = sorted(us, key=lambda n: -us[n])
    rest = ranked[TOP:]
    return {"top": [{"kernel": n, "calls": calls[n], "us": round(us[n], 2)} for n in ranked[:TOP]],
            "rest": {"kernels": len(rest), "calls": sum(calls[n] for n in rest),
                     "us": round(sum(us[n] for n in rest), 2)}}


def summarise(replay: list[tuple[str, float]], ops: list[str | None] | None = None) -> dict[str, Any]:
    """Totals of a replay's launches (name, us): all kernels by name, and with `ops` (attribute's) each op's
    kernel time and the kernels outside every op by name."""
    us: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    for name, t in replay:
        us[name] += t
        calls[name] += 1
    out = {"kernels_us": round(sum(us.values()), 2), "kernel_launches": len(replay), **_ranked(us, calls)}
    if ops is None:
        return out
    op_us: dict[str, float] = defaultdict(float)
    op_launches: dict[str, int] = defaultdict(int)
    out_us: dict[str, float] = defaultdict(float)
    out_calls: dict[str, int] = defaultdict(int)
    for (name, t), op in zip(replay, ops, strict=True):
        if op is None:
            out_us[name] += t
            out_calls[name] += 1
        else:
            op_us[op] += t
            op_launches[op] += 1
    out["in_ops"] = {op: {"us": round(op_us[op], 2), "launches": op_launches[op]}
                     for op in sorted(op_us, key=lambda o: -op_us[o])}
    out["outside_ops"] = {"us": round(sum(out_us.values()), 2), "launches": sum(out_calls.values()),
                          **_ranked(out_us, out_calls)}
    return out


def replay_launches(graph: Any) -> list[tuple[str, float]]:
    """(kernel name, us) of each kernel of one graph.replay(), in start order (CUPTI records a graph's kernels
    one by one)."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        graph.replay()
        torch.cuda.synchronize()
    events = sorted(_kernel_events(prof), key=lambda e: e.time_range.start)
    return [(e.name[:NAME_CHARS], e.device_time) for e in events]


def profile_replay(graph: Any, eager_step: Callable[[], Any] | None = None) -> dict[str, Any]:
    """GPU time per kernel over one graph.replay(); with `eager_step` (the step's forward with a RangeTimer),
    each kernel attributed to its op or to the work outside the ops."""
    replay = replay_launches(graph)
    labels = eager_launch_labels(eager_step) if eager_step is not None else None
    return summarise(replay, attribute(replay, labels) if labels is not None else None)
