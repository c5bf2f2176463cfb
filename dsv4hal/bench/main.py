"""`dsv4hal bench OP`: run benchmarks side by side in one process and write JSON (and a PNG plot)."""

from __future__ import annotations

import argparse
import importlib
import json
import platform as pyplatform
import sys
from pathlib import Path
from typing import Any

from dsv4hal.errors import Dsv4HalError

BENCHES = {"attention": "dsv4hal.bench.attention", "pack_store": "dsv4hal.bench.cache_ops",
           "topk": "dsv4hal.bench.topk", "moe": "dsv4hal.bench.moe", "mhc": "dsv4hal.bench.mhc",
           "compress": "dsv4hal.bench.compress", "indexer": "dsv4hal.bench.indexer", "ep": "dsv4hal.distributed.bench",
           "offload": "dsv4hal.bench.offload", "linear": "dsv4hal.bench.linear"}
CPU_BENCHES = {"ep", "offload"}  # also run without a GPU (a tiny shape: gloo processes, a tiny pool)


def run_bench(args: argparse.Namespace) -> int:
    import torch

    import dsv4hal
    from dsv4hal.bench.timing import bf16_tflops, copy_bandwidth

    names = list(BENCHES) if args.op == "all" else [n.strip() for n in args.op.split(",")]
    for n in names:
        if n not in BENCHES:
            raise Dsv4HalError(f"unknown benchmark {n!r}", remedy=f"choose from {', '.join(BENCHES)} or all")
    gpu = torch.cuda.is_available()
    if not gpu and not set(names) <= CPU_BENCHES:
        raise Dsv4HalError("benchmarks need a GPU", remedy="run on a machine with a CUDA or ROCm device")
    platform = dsv4hal.select_platform()
    ceilings = {"copy_bytes_per_s": copy_bandwidth(), "bf16_tflops": bf16_tflops()} if gpu else {}
    if gpu:
        print(f"ceilings: copy {ceilings['copy_bytes_per_s'] / 1e12:.2f} TB/s, bf16 {ceilings['bf16_tflops']:.0f} TF",
              flush=True)
    result: dict[str, Any] = {
        "command": "dsv4hal " + " ".join(sys.argv[1:]), "platform": platform.name,
        "device": torch.cuda.get_device_name() if gpu else "cpu", "torch": torch.__version__,
        "libraries": dict(platform.info.libraries), "python": pyplatform.python_version(),
        "timing": ("CUDA graphs of 10 calls, median of 25 replays; host_us = host enqueue time per call, the fastest "
                   "of 30 rounds of 50 calls timed in turns"),
        "ceilings": ceilings,
    }
    from dsv4hal.progress import Progress

    with Progress(len(names), "bench") as bar:
        for n in names:
            try:
                result[n] = importlib.import_module(BENCHES[n]).run(platform, ceilings, quick=args.quick)
            except Exception as exc:  # keep the other benchmarks' results; the JSON records the failure
                bar.write(f"benchmark {n} failed: {type(exc).__name__}: {exc}")
                result.setdefault("errors", {})[n] = f"{type(exc).__name__}: {exc}"
            bar.update(f"{n} done")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    if args.plot:
        from dsv4hal.bench.plot import plot

        plot(result, args.plot)
    if result.get("errors"):  # the other benchmarks' results are written, but a run with a failure has failed
        print(f"dsv4hal bench: {len(result['errors'])} of {len(names)} benchmarks failed: "
              f"{', '.join(result['errors'])}", file=sys.stderr, flush=True)
        return 1
    return 0
