"""Randomized call sequences through the vendor-bound ops of one platform, as an engine makes them.

Every conformance case whose kernel is a vendor's (FlashMLA, DeepGEMM, Marlin, triton_kernels, vLLM's router, ...)
runs in a shuffled order of shapes, eager and captured in a CUDA graph then replayed on new inputs, several rounds in
one process, each result checked against the oracle. Then the ways an engine's own code can hand a kernel garbage:
- the bound decode timed with `triton.testing.do_bench_cudagraph` straight after its inputs were made: its warm-up
  call runs on a fresh side stream that does not wait for the kernels writing those inputs, so the call may read
  whatever the allocator's blocks held before (lengths included);
- unchecked decode calls whose lengths lie outside [0, width] (negative, past the index rows, int32's extremes).
After each, a valid call must still run and match its oracle: a device assertion or a fault would end the process's
CUDA context. Run it in a process of its own (`python3 -m dsv4hal.conformance.sequence --json PATH`); exit code 0
when every cell passed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from dsv4hal.conformance.runner import Cell, expected_tokens, load_catalog, run_cell
from dsv4hal.conformance.types import CaseSpec
from dsv4hal.platform import Platform, select_platform
from dsv4hal.prepared import PreparedWeights
from dsv4hal.step import decode_step

DECODE = "sparse_attention_decode"
# V4-Flash's C4 layer at T = 1024: SWA 128 + top-512, 64 heads (the shape of the timing that ended a context)
RACE_SHAPE = {"T": 1024, "heads": 64, "swa": 128, "extra": 512, "pages": 64, "extra_pages": 2048}


def _kernel_tier(platform: Platform, spec: CaseSpec, build: Any) -> tuple[str, str]:
    """(implementation, tier) the platform binds for a case's default inputs."""
    bound = platform.ops[spec.op]
    fx = build(dataclasses.replace(spec, params={**spec.params, "mode": "eager"}), torch.device(platform.device_type),
               torch.Generator().manual_seed(0))
    weights = fx.args.get(bound.spec.weights_arg or "")
    if bound.spec.weights_arg:
        weights = bound.prepare_weights(weights, tokens=expected_tokens(fx.args))
        name = weights.implementation if isinstance(weights, PreparedWeights) else ""
    else:
        name = bound.decide(bound.case_of(**fx.args)).chosen.name
    tier = next((k.tier for k in platform.registry.kernels_for(spec.op) if k.name == name), "")
    return name, tier


def vendor_cases(platform: Platform, full: bool = False) -> list[tuple[CaseSpec, Any]]:
    """The catalog's cases that this platform runs on a vendor's kernel, in eager and graph modes (full: the
    full-size model shapes too, minutes each round)."""
    out = []
    reg = platform.registry
    for spec, build in load_catalog():
        if not {"eager", "graph"} & set(spec.modes) or spec.unreachable.keys() >= {"eager", "graph"}:
            continue
        if spec.gpu_only and not full:
            continue
        if not any(k.tier == "vendor" and k.applies_to(platform.name) for k in reg.kernels_for(spec.op)):
            continue
        try:
            _, tier = _kernel_tier(platform, spec, build)
        except Exception:  # noqa: BLE001  (a case this platform refuses is the conformance run's to report)
            continue
        if tier == "vendor":
            out.append((spec, build))
    return out


def _cache(platform: Platform, pages: int, page_size: int, g: torch.Generator) -> Any:
    import dsv4hal

    c = dsv4hal.V4PagedCache.empty(pages, page_size, platform.info.fp8, device="cuda")
    n = pages * page_size
    keys = torch.randn(n, 512, generator=g, device="cuda") * torch.rand(n, 1, generator=g, device="cuda") * 4
    platform.ops.pack_store(keys.bfloat16(), torch.arange(n, device="cuda"), c)
    return c


def _decode_args(platform: Platform, g: torch.Generator) -> dict[str, Any]:
    s = RACE_SHAPE
    t, i32 = s["T"], dict(device="cuda", dtype=torch.int32)
    swa, extra = _cache(platform, s["pages"], 256, g), _cache(platform, s["extra_pages"], 64, g)
    return dict(q=(torch.randn(t, s["heads"], 512, generator=g, device="cuda") * 0.5).bfloat16(), swa_cache=swa,
                swa_indices=torch.randint(0, swa.num_slots, (t, s["swa"]), generator=g, **i32),
                swa_lengths=torch.full((t,), s["swa"], **i32),
                sink=torch.randn(s["heads"], generator=g, device="cuda"), softmax_scale=512 ** -0.5,
                extra_cache=extra, extra_indices=torch.randint(0, extra.num_slots, (t, s["extra"]), generator=g, **i32),
                extra_lengths=torch.full((t,), s["extra"], **i32))


def _decode_error(platform: Platform, args: dict[str, Any]) -> float:
    """Relative error of the bound decode against the PyTorch reference on the same inputs (a few rows)."""
    from dsv4hal.reference.sparse_attention import sparse_attention_decode as reference

    rows = slice(0, 16)
    sub = {k: (v[rows] if isinstance(v, torch.Tensor) and k not in ("sink",) else v) for k, v in args.items()}
    out, _ = platform.ops[DECODE](**sub)
    ref, _ = reference(**sub)
    return float((out.float() - ref.float()).norm() / ref.float().norm())


def _garbage_cells(platform: Platform, seed: int) -> list[Cell]:
    """The decode handed inputs an engine's bug can produce, then a valid call checked (the context must live)."""
    from triton.testing import do_bench_cudagraph

    from dsv4hal.cuda_graphs import capture

    g = torch.Generator(device="cuda").manual_seed(seed)
    cells = []

    def cell(case: str, run: Any) -> None:
        c = Cell(DECODE, platform.ops[DECODE].decide().chosen.name, case, "eager", 4, platform.name, "fail")
        t0 = time.perf_counter()
        try:
            detail = run()
            torch.cuda.synchronize()
            err = _decode_error(platform, _decode_args(platform, g))
            c.max_error, c.status = err, "pass" if err <= 2e-2 else "fail"
            c.detail = f"{detail}; a valid call after it: relative error {err:.2e}"
        except Exception as exc:  # noqa: BLE001  (the cell records what broke)
            c.detail = f"{type(exc).__name__}: {exc}"[:500]
        c.seconds = time.perf_counter() - t0
        cells.append(c)

    def unordered_timing() -> str:
        args = _decode_args(platform, g)  # written on the current stream; do_bench_cudagraph's side stream won't wait
        us = do_bench_cudagraph(lambda: platform.ops[DECODE](**args), rep=20) * 1000
        return f"do_bench_cudagraph with no synchronisation: {us:.1f} us"

    def lengths_outside(values: list[int]) -> Any:
        def run() -> str:
            args = _decode_args(platform, g)
            n = args["swa_lengths"].shape[0]
            bad = torch.tensor(values, device="cuda", dtype=torch.int32).repeat(n // len(values) + 1)[:n]
            args["swa_lengths"], args["extra_lengths"] = bad, bad.flip(0).contiguous()
            platform.ops[DECODE](**args)

            def step() -> None:
                with decode_step():
                    platform.ops[DECODE](**args)
                    platform.ops[DECODE](**args)
            step()
            graph, _ = capture(step)  # the plan's kernels captured too: each replay plans from the lengths again
            graph.replay()
            args["swa_lengths"].copy_(bad.flip(0))
            graph.replay()
            return f"unchecked lengths {values}: per call, in a step, in a captured step replayed"
        return run

    cell("race: decode timed by do_bench_cudagraph before its inputs are written", unordered_timing)
    cell("lengths outside [0, width]: negative and past the rows",
         lengths_outside([-1, -7, 129, 513, 100000]))
    cell("lengths outside [0, width]: int32 extremes", lengths_outside([2**31 - 1, -2**31]))
    cell("race again after the garbage", unordered_timing)
    return cells


def run_sequence(platform: Platform, seed: int = 0, rounds: int = 2, full: bool = False,
                 on_cell: Callable[[list[Cell]], None] | None = None) -> list[Cell]:
    """The garbage cells first, then every vendor-bound case in both modes, shuffled, `rounds` times with fresh
    seeds; on_cell(cells so far) after each cell (a report written as it goes survives a time limit)."""
    cases = vendor_cases(platform, full)
    cells: list[Cell] = []
    if platform.device_type == "cuda" and DECODE in {s.op for s, _ in cases}:
        for c in _garbage_cells(platform, seed):
            cells.append(c)
            if on_cell:
                on_cell(cells)
    modes = ("eager", "graph") if platform.device_type == "cuda" else ("eager",)  # graphs need a GPU
    for r in range(rounds):
        todo = [(s, b, m) for s, b in cases for m in modes
                if m in s.modes and m not in s.unreachable and m not in s.deferred]
        random.Random(seed + r).shuffle(todo)
        for spec, build, mode in todo:
            cells.append(run_cell(platform, spec, build, mode, seed + 1000 * r))
            if on_cell:
                on_cell(cells)
    return cells


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m dsv4hal.conformance.sequence", description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, required=True, help="where the report goes")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--full", action="store_true", help="the full-size model shapes too (minutes a round)")
    args = ap.parse_args(argv)
    platform = select_platform()
    t0 = time.perf_counter()
    args.json.parent.mkdir(parents=True, exist_ok=True)
    command = "python3 -m dsv4hal.conformance.sequence " + " ".join(sys.argv[1:] if argv is None else argv)

    def write(cells: list[Cell]) -> dict[str, int]:
        counts = {s: sum(c.status == s for c in cells) for s in sorted({c.status for c in cells})}
        report = {"command": command, "platform": platform.name, "info": platform.info.to_json(), "seed": args.seed,
                  "rounds": args.rounds, "full": args.full, "seconds": round(time.perf_counter() - t0, 1),
                  "summary": counts, "cells": [dataclasses.asdict(c) for c in cells]}
        args.json.write_text(json.dumps(report, indent=1, default=str) + "\n")
        return counts

    cells = run_sequence(platform, args.seed, args.rounds, args.full, on_cell=write)
    print(json.dumps({"summary": write(cells), "cells": len(cells)}))
    return 0 if all(c.status in ("pass", "blocked") for c in cells) else 1


if __name__ == "__main__":
    sys.exit(main())
