"""`dsv4hal demo`: run the demo from the command line (arguments parsed by dsv4hal.cli), print the per-op
breakdown, and write the JSON and the plot."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from dsv4hal.demo.cpu_comparison import compare_with_cpu
from dsv4hal.demo.plots import plot_breakdown, plot_eager
from dsv4hal.demo.runner import run_demo
from dsv4hal.engine_model.config import SIZES


def check_backend(name: str) -> None:
    """Before the prefill: `name` is a torch.compile backend (dynamo's registry, entry points included)."""
    from torch._dynamo import list_backends  # imports no device runtime

    from dsv4hal.errors import Dsv4HalError

    if name not in list_backends(exclude_tags=()):
        raise Dsv4HalError(f"--compile {name!r} is not a torch.compile backend",
                           remedy=f"use one of {', '.join(list_backends())} (default inductor), or drop --compile")


def main(args: argparse.Namespace) -> int:
    import dsv4hal
    from dsv4hal.errors import Dsv4HalError
    from dsv4hal.output_paths import check_output
    from dsv4hal.progress import Progress

    if getattr(args, "tp", 1) > 1:  # attention tensor-parallel over N processes (dsv4hal.demo.tp)
        from dsv4hal.demo import tp

        return tp.main(args)
    if getattr(args, "ep", 1) > 1:  # the layers over N processes (dsv4hal.demo.ep)
        from dsv4hal.demo import ep

        return ep.main(args)
    check_output(args.json)
    check_output(args.plot, plot=True)
    if args.compile is not None:
        check_backend(args.compile)
    platform = dsv4hal.select_platform(args.platform)
    graph = args.graph if args.graph is not None else platform.device_type == "cuda"
    if graph and platform.device_type != "cuda":
        raise Dsv4HalError("--graph needs a CUDA platform", remedy="drop --graph or run on a GPU")
    if graph and args.steps == 1:  # step 0 runs eagerly (the warm-up, each op timed alone); replays time steps 1..
        raise Dsv4HalError("--steps 1 in graph mode times no graph replay (the first step is the eager warm-up)",
                           remedy="use --steps 2 or more, or --no-graph")
    with Progress(1 + (1 if graph and args.steps else args.steps), "demo") as bar:
        res = run_demo(platform, args.batch, args.context, args.steps, cfg=SIZES[args.size], fill=args.fill,
                       graph=graph, progress=bar.update, compile_backend=args.compile,
                       tokens_per_request=args.tokens_per_request, offload_c4=getattr(args, "offload_c4", None),
                       kernels_per_call_ops=getattr(args, "kernels_per_call", ()))
    outputs = res.pop("outputs")
    layers = res.pop("layer_outputs")
    res["output_rms"] = [float(o.pow(2).mean().sqrt()) for o in outputs]
    res["finite"] = all(bool(torch.isfinite(t).all()) for step in layers for t in step)
    if res["offload_c4"]:
        o = res["offload"]
        print(f"  C4 pool offloaded: {o['working_pages']} of {o['pool_pages']} pages on the device "
              f"({o['working_fraction']:.2f}); {o['hits']} hits, {o['misses']} misses, {o['bytes_in'] / 1e6:.1f} MB in")
    print(f"{res['platform']}: {args.size} layers, fill {args.fill} {res['batch']}x{res['context']} in "
          f"{res['prefill_s']:.2f}s, decode {res['decode_tokens_per_s']:.1f} tokens/s"
          + (f" ({res['tokens_per_request']} tokens per request a step: MTP verify)"
             if res["tokens_per_request"] > 1 else ""))
    if graph:
        how = f", compiled ({args.compile}; first step {res['first_step_s']:.1f} s)" if args.compile else ""
        print(f"  graph step {res['graph_step_us']:.1f} us{how}; ops alone sum {res['sum_ops_alone_us']:.1f} us "
              f"(ratio {res['graph_step_over_sum_ops']:.2f})")
        for name, us in sorted(res["ops_alone_us"].items(), key=lambda kv: -kv[1]):
            print(f"  {name:<26} {us:9.1f} us  floor {res['ops_floor_us'][name]:8.1f} us  "
                  f"({res['kernels'].get(name, '-')})")
        for row in res.get("kernels_per_call", ()):
            times = ", ".join(f"{k} {v:.1f} us" for k, v in sorted(row["us"].items(), key=lambda kv: kv[1]))
            print(f"  {row['op']} call {row['call']} ({row['chosen']} chosen): {times}")
        prof = res.get("step_kernels", {})
        if "top" in prof:
            print(f"  one replay, kernel by kernel: {prof['kernels_us']:.1f} us in {prof['kernel_launches']} kernels")
            for k in prof["top"][:12]:
                print(f"    {k['us']:9.1f} us {k['calls']:4d}x  {k['kernel'][:90]}")
        if "outside_ops" in prof:
            out = prof["outside_ops"]
            print(f"  outside the ops: {out['us']:.1f} us in {out['launches']} kernels")
            for k in out["top"][:12]:
                print(f"    {k['us']:9.1f} us {k['calls']:4d}x  {k['kernel'][:90]}")
    else:
        total = sum(res["decode_breakdown_s"].values()) or 1.0
        for name, sec in sorted(res["decode_breakdown_s"].items(), key=lambda kv: -kv[1]):
            print(f"  {name:<26} {sec * 1e3:9.2f} ms  {100 * sec / total:5.1f}%  ({res['kernels'].get(name, '-')})")
    if args.compare_cpu:
        res["cpu_comparison"] = cmp = compare_with_cpu(platform, graph=graph)
        print(f"  per-layer outputs vs the CPU reference (small config): worst relative RMS error "
              f"{cmp['worst_rel_rms_error']:.3g} (tolerance {cmp['tolerance']}): {'ok' if cmp['ok'] else 'FAIL'}")
    res["command"] = "dsv4hal demo " + " ".join(sys.argv[2:]) if len(sys.argv) > 2 else "dsv4hal demo"
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(res, indent=1) + "\n")
    if args.plot:
        (plot_breakdown if graph else plot_eager)(res, args.plot)
        print(f"  plot: {args.plot}")
    ok = res["finite"] and (not args.compare_cpu or res["cpu_comparison"]["ok"])
    return 0 if ok else 1
