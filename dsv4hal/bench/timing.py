"""GPU timing: CUDA-graph replays timed with events (median), and host enqueue cost per call."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping

import torch

from dsv4hal.cuda_graphs import capture


def graph_us(fn: Callable[[], object], *, inner: int = 10, reps: int = 25) -> float:
    """Median microseconds per call of `fn`, captured `inner` times in one CUDA graph and replayed."""
    fn()
    torch.cuda.synchronize()
    graph, _ = capture(fn, repeat=inner)
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000.0 / inner)
    return statistics.median(times)


def host_us_interleaved(fns: Mapping[str, Callable[[], object]], *, calls: int = 50,
                        rounds: int = 30) -> dict[str, float]:
    """Host enqueue time per call of each function, measured in turns: each round times `calls` calls of every
    function one after another (synchronising between them, untimed), and each keeps its fastest round. A host
    whose speed drifts (other tenants, clocks) then slows all functions of a round alike, so ratios between them
    hold where separate measurements seconds apart differed by up to 40% (H200). On a
    machine without CUDA there is nothing to synchronise (host-only parts)."""
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    for fn in fns.values():
        fn()
    sync()
    best = dict.fromkeys(fns, float("inf"))
    clock = time.perf_counter
    for _ in range(rounds):
        for name, fn in fns.items():
            t0 = clock()
            for _ in range(calls):
                fn()
            best[name] = min(best[name], (clock() - t0) * 1e6 / calls)
            sync()
    return best


def eager_us(fn: Callable[[], object], *, reps: int = 5) -> float:
    """Median microseconds of eager calls timed with events (after one warm-up call): for what a CUDA graph
    cannot hold (host-synchronising code) or runs differently."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000.0)
    return statistics.median(times)


def copy_bandwidth(bytes_: int = 2 << 30) -> float:
    """Device-to-device copy bandwidth in bytes/s, read plus write counted (a copy kernel timed eagerly:
    inside a CUDA graph a plain copy becomes a memcpy node, which runs slower)."""
    src = torch.randn(bytes_ // 4, dtype=torch.bfloat16, device="cuda")
    dst = torch.empty_like(src)
    return bytes_ / (eager_us(lambda: dst.copy_(src), reps=10) * 1e-6)


def bf16_tflops(n: int = 8192) -> float:
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    us = graph_us(lambda: a @ b, inner=3, reps=10)
    return 2 * n**3 / (us * 1e-6) / 1e12
