"""mHC's gated ops in one launch (grid barriers between the phases; bench/proto_mhc_one_launch.py, a rejected
design) against the same kernel's phases as three launches, the library's two-launch Triton path and DeepGEMM's
GEMM + the Triton apply: times in CUDA graphs, the
bandwidth floor, and the checks that matter for a barrier (one launch equal to three bit for bit; two streams at
once; every output against the PyTorch reference).

    python3 bench/bench_mhc_one_launch.py --json out/bench-mhc-one-launch.json
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import torch
from proto_mhc_one_launch import _one_launch, one_launch_config

from dsv4hal.bench.mhc import _args, _nbytes
from dsv4hal.bench.timing import copy_bandwidth, graph_us
from dsv4hal.kernels import deepgemm_mhc
from dsv4hal.kernels.triton import mhc as tm
from dsv4hal.reference import mhc as ref

OPS = ("mhc_pre", "mhc_head", "mhc_post_pre")
TOKENS = (1, 8, 64, 128, 256)
HIDDEN = (4096, 7168)


def _call(op: str, args: tuple, split: bool | None) -> tuple[torch.Tensor, ...]:
    """split None: the library's Triton op (two launches); True/False: the one-launch kernel's phases as three
    launches / one."""
    if split is None:
        out = getattr(tm, op)(*args)
        return out if isinstance(out, tuple) else (out,)
    if op == "mhc_post_pre":
        f, x, post, comb, fn, base, scale = args
        return _one_launch(x, fn, base, scale, 1e-6, 1e-6, 20, False, (f, post, comb), split)
    x, fn, base, scale = args
    stream, y, post, comb = _one_launch(x, fn, base, scale, 1e-6, 1e-6, 20 if op == "mhc_pre" else 1,
                                        op == "mhc_head", None, split)
    return (y,) if op == "mhc_head" else (y, post, comb)


def _max_diff(a: tuple[torch.Tensor, ...], b: tuple[torch.Tensor, ...]) -> list[float]:
    return [float((u.float() - v.float()).abs().max()) if u.numel() else 0.0 for u, v in zip(a, b, strict=True)]


def _reference(op: str, args: tuple) -> tuple[torch.Tensor, ...]:
    out = getattr(ref, op)(*args)
    return out if isinstance(out, tuple) else (out,)


def _two_streams(op: str, args: tuple, expect: tuple[torch.Tensor, ...]) -> bool:
    """The one-launch kernel on two streams at once, 20 times each: every output equal to the single call's."""
    streams = [torch.cuda.Stream() for _ in range(2)]
    outs: list[tuple[torch.Tensor, ...]] = []
    torch.cuda.synchronize()
    for _ in range(20):
        for s in streams:
            with torch.cuda.stream(s):
                outs.append(_call(op, args, False))
    torch.cuda.synchronize()
    return all(max(_max_diff(o, expect)) == 0.0 for o in outs)


def run() -> dict[str, Any]:
    gen = torch.Generator(device="cuda").manual_seed(3)
    copy_bw = copy_bandwidth()
    rows = []
    for d in HIDDEN:
        for op in OPS:
            for t in TOKENS:
                args = _args(op, t, d, gen)
                one = _call(op, args, False)
                three = _call(op, args, True)
                two = _call(op, args, None)
                r = _reference(op, args)
                row: dict[str, Any] = {
                    "op": op, "T": t, "hidden": d, "config": one_launch_config(t, d, args[0].device),
                    "one_equals_three_launches": max(_max_diff(one, three)) == 0.0,
                    "max_diff_one_vs_reference": _max_diff(one, r),
                    "max_diff_two_launch_vs_reference": _max_diff(two, r),
                    "finite": all(bool(torch.isfinite(v).all()) for v in one),
                    "two_streams_equal": _two_streams(op, args, one) if t in (1, 64) else None,
                    "us": {}}
                row["us"]["one_launch"] = graph_us(lambda a=args, o=op: _call(o, a, False))
                row["us"]["three_launches"] = graph_us(lambda a=args, o=op: _call(o, a, True))
                row["us"]["two_launch_triton"] = graph_us(lambda a=args, o=op: _call(o, a, None))
                if op != "mhc_head":
                    dg = getattr(deepgemm_mhc, op)
                    row["us"]["deepgemm_gemm_triton_apply"] = graph_us(lambda a=args, dg=dg: dg(*a))
                row["bytes"] = _nbytes(args) + _nbytes(one)
                row["floor_us"] = row["bytes"] / copy_bw * 1e6
                row["floor_ratio"] = {k: v / row["floor_us"] for k, v in row["us"].items()}
                rows.append(row)
                print(op, d, t, {k: round(v, 2) for k, v in row["us"].items()},
                      "floor", round(row["floor_us"], 2), "one=three", row["one_equals_three_launches"],
                      "2 streams", row["two_streams_equal"], "ref diff", [f"{v:.2e}" for v in
                                                                         row["max_diff_one_vs_reference"]],
                      flush=True)
    return {"command": "python3 bench/bench_mhc_one_launch.py", "device": torch.cuda.get_device_name(),
            "copy_bytes_per_s": copy_bw, "timing": "CUDA graphs of 10 calls, median of 25 replays", "rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", required=True)
    a = ap.parse_args()
    out = run()
    with open(a.json, "w") as fh:
        json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()
