"""The Triton route alignment on the GPU: one program (both phases in one launch) against two launches over
several programs, for the route counts of decode (E = 256 experts, blocks of 8 routes: the swapped MXFP4 kernels'
alignment). Every result is first checked to be identical to the torch version; the time is a CUDA graph replay.

    python3 bench/sweep_moe_align.py --json out/sweep-moe-align.json

--prefill: prefill route counts (T = 512 to 4096 tokens, top-6, blocks of 128: DeepGEMM's FP8 alignment) over the
COUNT and PLACE launches' program counts (MAX_PROGRAMS), each checked against the torch version.

--old PATH: also time another version of dsv4hal/kernels/triton/moe_align.py (a file, e.g. from `git show`) at its
default settings in the same run, its result checked against the torch version too ("previous" in each row).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path
from types import ModuleType

import torch

from dsv4hal.bench.timing import graph_us
from dsv4hal.kernels.moe_align import align_routes
from dsv4hal.kernels.triton.moe_align import FUSED_MAX_ROUTES, align_routes_triton

ROUTES = (6, 48, 96, 192, 384, 512)
ONE_PROGRAM_UP_TO = (0, 64, 128, 256, FUSED_MAX_ROUTES)  # fused_max_routes: 0 = always two launches


def _settings(ids: torch.Tensor, e: int, block: int, keyword: str, values: tuple[int, ...]) -> dict:
    """{"us": {value: time}, "same": {value: identical to the torch version}} of align_routes_triton with each value
    of one keyword."""
    want = align_routes(ids, e, block, impl="torch")
    out: dict = {"us": {}, "same": {}}
    for v in values:
        got = align_routes_triton(ids, e, block, **{keyword: v})
        out["same"][v] = all(torch.equal(getattr(got, a), getattr(want, a)) for a in
                             ("sorted_routes", "block_expert", "num_padded", "row_of_route", "expert_end"))
        out["us"][v] = graph_us(lambda v=v: align_routes_triton(ids, e, block, **{keyword: v}))
    return out


def _load(path: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location("previous_moe_align", path)
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


def _previous(ids: torch.Tensor, e: int, block: int, old: ModuleType | None) -> dict:
    """{"previous_us", "previous_same", "now_us"}: the other version and this one at their defaults, timed in turns."""
    if old is None:
        return {}
    want = align_routes(ids, e, block, impl="torch")
    got = old.align_routes_triton(ids, e, block)
    same = all(torch.equal(getattr(got, a), getattr(want, a)) for a in
               ("sorted_routes", "block_expert", "num_padded", "row_of_route", "expert_end"))
    prev, now = [], []
    for _ in range(3):
        prev.append(graph_us(lambda: old.align_routes_triton(ids, e, block)))
        now.append(graph_us(lambda: align_routes_triton(ids, e, block)))
    return {"previous_us": prev, "previous_same": same, "now_us": now}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", required=True)
    ap.add_argument("--prefill", action="store_true", help="prefill route counts over MAX_PROGRAMS (see above)")
    ap.add_argument("--old", help="another moe_align.py to time beside this one (see above)")
    args = ap.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    old = _load(args.old) if args.old else None
    if args.prefill:
        return prefill(args.json, gen, old)
    e, k, block = 256, 6, 8
    out: dict = {"command": f"python3 bench/sweep_moe_align.py --json ...{' --old ...' if old else ''}",
                 "device": torch.cuda.get_device_name(), "experts": e, "block": block, "rows": []}
    for n in ROUTES:
        ids = torch.rand(n // k, e, device="cuda", generator=gen).argsort(1)[:, :k].to(torch.int32)
        row: dict = {"routes": n, **_settings(ids, e, block, "fused_max_routes", ONE_PROGRAM_UP_TO),
                     **_previous(ids, e, block, old)}
        out["rows"].append(row)
        print(f"routes {n}: " + ", ".join(f"one program up to {f}: {us:.1f} us{'' if row['same'][f] else ' DIFFERS'}"
                                          for f, us in row["us"].items()) + _ab_line(row), flush=True)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=1))


def _ab_line(row: dict) -> str:
    if "previous_us" not in row:
        return ""
    fmt = "/".join
    return (f"; previous {fmt(f'{u:.1f}' for u in row['previous_us'])} us"
            f"{'' if row['previous_same'] else ' DIFFERS'}, now {fmt(f'{u:.1f}' for u in row['now_us'])} us")


def prefill(path: str, gen: torch.Generator, old: ModuleType | None = None) -> None:
    e, k, block = 256, 6, 128
    out: dict = {"command": f"python3 bench/sweep_moe_align.py --prefill --json ...{' --old ...' if old else ''}",
                 "device": torch.cuda.get_device_name(), "experts": e, "block": block, "top_k": k, "rows": []}
    for t in (512, 1024, 4096):
        ids = torch.rand(t, e, device="cuda", generator=gen).argsort(1)[:, :k].to(torch.int32)
        row: dict = {"tokens": t, "routes": t * k, **_settings(ids, e, block, "max_programs", PROGRAMS),
                     **_previous(ids, e, block, old)}
        out["rows"].append(row)
        print(f"T {t}: " + ", ".join(f"{m} programs: {us:.1f} us{'' if row['same'][m] else ' DIFFERS'}"
                                     for m, us in row["us"].items()) + _ab_line(row), flush=True)
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(out, indent=1))


PROGRAMS = (8, 16, 32, 64, 128, 256)

if __name__ == "__main__":
    main()
