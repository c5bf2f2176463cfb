"""The Triton route alignment on the GPU: one program (both phases in one launch) against two launches over
several programs, for the route counts of decode (E = 256 experts, blocks of 8 routes: the swapped MXFP4 kernels'
alignment). Every result is first checked to be identical to the torch version; the time is a CUDA graph replay.

    python3 bench/sweep_moe_align.py --json out/sweep-moe-align.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from dsv4hal.bench.timing import graph_us
from dsv4hal.kernels.moe_align import align_routes
from dsv4hal.kernels.triton.moe_align import FUSED_MAX_ROUTES, align_routes_triton

ROUTES = (6, 48, 96, 192, 384, 512)
ONE_PROGRAM_UP_TO = (0, 64, 128, 256, FUSED_MAX_ROUTES)  # fused_max_routes: 0 = always two launches


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", required=True)
    args = ap.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    e, k, block = 256, 6, 8
    out: dict = {"command": "python3 bench/sweep_moe_align.py --json ...", "device": torch.cuda.get_device_name(),
                 "experts": e, "block": block, "rows": []}
    for n in ROUTES:
        ids = torch.rand(n // k, e, device="cuda", generator=gen).argsort(1)[:, :k].to(torch.int32)
        want = align_routes(ids, e, block, impl="torch")
        row: dict = {"routes": n, "us": {}, "same": {}}
        for f in ONE_PROGRAM_UP_TO:
            got = align_routes_triton(ids, e, block, fused_max_routes=f)
            row["same"][f] = all(torch.equal(getattr(got, a), getattr(want, a)) for a in
                                 ("sorted_routes", "block_expert", "num_padded", "row_of_route", "expert_end"))
            row["us"][f] = graph_us(lambda f=f, ids=ids: align_routes_triton(ids, e, block, fused_max_routes=f))
        out["rows"].append(row)
        print(f"routes {n}: " + ", ".join(f"one program up to {f}: {us:.1f} us{'' if row['same'][f] else ' DIFFERS'}"
                                          for f, us in row["us"].items()), flush=True)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
