"""mHC's gated ops with comb computed as 16 scalars or as one [4, 4] tile (`dsv4hal.kernels.triton.mhc.COMB_TILE`),
every implementation of mhc_pre and mhc_post_pre on this platform, V4-Flash width, timed in CUDA graphs; each tile
result compared with the scalar one on the same inputs. Prints one JSON row a shape.

    python3 bench/sweep_mhc_apply.py --json out.json"""

from __future__ import annotations

import argparse
import json

import torch

import dsv4hal
from dsv4hal.bench.common import bound_op, candidates
from dsv4hal.bench.timing import graph_us
from dsv4hal.kernels.triton import mhc

D = 4096
TOKENS = (1, 8, 64, 512)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", required=True)
    a = ap.parse_args()
    platform = dsv4hal.select_platform()
    gen = torch.Generator(device="cuda").manual_seed(0)
    dev = "cuda"
    fn = torch.randn(24, 4 * D, device=dev, generator=gen) * 0.01
    base, scale = torch.randn(24, device=dev, generator=gen) * 0.1, torch.tensor([1.0, 0.5, 0.8], device=dev)
    rows = []
    for t in TOKENS:
        x = torch.randn(t, 4, D, device=dev, generator=gen).bfloat16()
        f = torch.randn(t, D, device=dev, generator=gen).bfloat16()
        post = torch.rand(t, 4, device=dev, generator=gen) * 2
        comb = torch.softmax(torch.randn(t, 4, 4, device=dev, generator=gen), -1)
        calls = {"mhc_pre": (x, fn, base, scale), "mhc_post_pre": (f, x, post, comb, fn, base, scale)}
        row: dict = {"T": t, "us": {}, "max_abs_tile_vs_scalar": {}}
        for op_name, args in calls.items():
            for impl in candidates(platform, op_name):
                op = bound_op(platform, op_name, impl)
                got = {}
                for tile in (False, True):
                    mhc.COMB_TILE = tile
                    got[tile] = [o.float().clone() for o in op(*args)]
                    name = f"{op_name}[{impl}] {'tile' if tile else 'scalar'}"
                    row["us"][name] = graph_us(lambda o=op, a=args: o(*a))
                row["max_abs_tile_vs_scalar"][f"{op_name}[{impl}]"] = max(
                    float((u - v).abs().max()) for u, v in zip(got[False], got[True]))
        mhc.COMB_TILE = False
        print(json.dumps(row), flush=True)
        rows.append(row)
    with open(a.json, "w") as fh:
        json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
