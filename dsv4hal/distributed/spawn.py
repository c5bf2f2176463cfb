"""Run a function on N local processes joined in a process group (gloo on the CPU; NCCL with one GPU a process,
rank r on cuda:r), every collective and the join bounded by a timeout: a rank that hangs or dies is reported, never
waited on forever."""

from __future__ import annotations

import datetime
import os
import queue
import tempfile
import traceback
from collections.abc import Callable
from typing import Any

import torch.multiprocessing as mp

from dsv4hal.errors import ExpertParallelError


def _entry(fn: Callable[..., Any], rank: int, world: int, init_file: str, timeout_s: float, out: Any,
           args: tuple[Any, ...], backend: str = "gloo") -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    try:
        if backend == "nccl":  # one GPU a process, before any CUDA work of this rank
            torch.cuda.set_device(rank)
        dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=timeout_s))
        try:
            out.put((rank, "ok", fn(rank, world, *args)))
        finally:
            dist.destroy_process_group()
    except BaseException as exc:  # reported to the parent, which raises
        out.put((rank, "error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=4)}"))


def run_ranks(fn: Callable[..., Any], world: int, *args: Any, timeout_s: float = 20.0,
              join_timeout_s: float = 120.0, backend: str = "gloo") -> dict[int, tuple[str, Any]]:
    """{rank: ("ok", fn's result) or ("error", message)} from fn(rank, world, *args) on `world` processes in a
    `backend` group ("gloo", or "nccl": rank r runs on cuda:r).
    `fn` must be importable (spawn pickles it by name). A rank that reports nothing within join_timeout_s is
    terminated and reported as an error."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    fd, init_file = tempfile.mkstemp(prefix="dsv4hal-ep-")
    os.close(fd)
    os.unlink(init_file)  # the file store creates it
    procs = [ctx.Process(target=_entry, args=(fn, r, world, init_file, timeout_s, out, args, backend), daemon=True)
             for r in range(world)]
    for p in procs:
        p.start()
    results: dict[int, tuple[str, Any]] = {}
    deadline = datetime.datetime.now() + datetime.timedelta(seconds=join_timeout_s)
    try:
        while len(results) < world:
            left = (deadline - datetime.datetime.now()).total_seconds()
            if left <= 0:
                break
            try:
                rank, status, value = out.get(timeout=min(left, 1.0))
                results[rank] = (status, value)
            except queue.Empty:
                if all(not p.is_alive() for p in procs) and out.empty():
                    break
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)
        if os.path.exists(init_file):
            os.unlink(init_file)
    for r, p in enumerate(procs):
        why = f"exited with code {p.exitcode}" if p.exitcode is not None else f"ran past {join_timeout_s} s"
        results.setdefault(r, ("error", f"rank {r} reported nothing: {why}"))
    return results


def ok_results(results: dict[int, tuple[str, Any]]) -> list[Any]:
    """Every rank's result, or ExpertParallelError naming the ranks that failed."""
    bad = {r: v for r, (s, v) in results.items() if s != "ok"}
    if bad:
        raise ExpertParallelError("ranks failed: " + "; ".join(f"rank {r}: {v}" for r, v in sorted(bad.items())),
                                  remedy="see each rank's error", failures={r: str(v) for r, v in bad.items()})
    return [results[r][1] for r in sorted(results)]
