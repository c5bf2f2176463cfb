"""A/B in one run: the portable fused MoE's MXFP4 decode as this tree has it against the module file of an earlier
commit (its own prepare_weights and kernels), with Marlin as a fixed anchor, on the same V4-Flash experts and
routing. Settings are timed in turns (every variant once a round, each keeping its fastest round: CUDA-graph
replays, bench.timing.graph_us) so that a machine's drift hits them alike; every output is checked against the
float64 oracle first. Separate runs on separate machines moved the ratio to Marlin by 3-4%, so a change is judged
here.

    git show COMMIT:dsv4hal/kernels/triton/fused_moe.py > .kernels/ab/fused_moe_old.py   # (git-ignored: it travels)
    python3 bench/ab_mx_moe_decode.py --old old=.kernels/ab/fused_moe_old.py [--old NAME=PATH ...] --json out/ab.json
        [--tokens 1,8,64]   # ratios to the first --old
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

import torch

import dsv4hal
from dsv4hal.bench.common import bound_op
from dsv4hal.bench.timing import copy_bandwidth, graph_us
from dsv4hal.conformance.cases_moe import _expert_weights, _experts_params, oracle_moe_experts
from dsv4hal.kernels.triton import fused_moe as tmoe
from dsv4hal.reference.moe import expert_nbytes

ANCHOR = "marlin_mxfp4_sm90"
# this tree's variants (name -> config); the old module runs its own default. Where a variant equals the default
# (new-unfused from T = 2, new-down-n64 at T = 1 and above 16), the pair says how far two equal settings differ.
NEW = {"new": {}, "new-fused": {"fuse_cast": True}, "new-unfused": {"fuse_cast": False}, "new-down-n64": {"down": {}}}


def _load(path: str):  # noqa: ANN202
    spec = importlib.util.spec_from_file_location("fused_moe_old", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (dataclasses look their module up there)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--old", required=True, action="append", help="NAME=PATH of an earlier fused_moe.py")
    ap.add_argument("--json", required=True)
    ap.add_argument("--tokens", default="1,2,4,8,16,64")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    olds = {name: _load(path) for name, path in (o.split("=", 1) for o in args.old)}
    first = next(iter(olds))
    gen = torch.Generator(device="cuda").manual_seed(0)
    params = _experts_params("flash", 1, "mxfp4")
    w = _expert_weights(params, torch.device("cuda"), gen)
    e, h, i, k = params["E"], params["H"], params["I"], params["top_k"]
    platform = dsv4hal.select_platform()
    anchor = bound_op(platform, "moe_experts", ANCHOR)
    anchor_w = anchor.prepare_weights(w)
    ours, theirs = tmoe.prepare_weights(w), {name: m.prepare_weights(w) for name, m in olds.items()}
    copy = copy_bandwidth()
    out: dict = {"command": "python3 bench/ab_mx_moe_decode.py " + " ".join(f"--old {o}" for o in args.old)
                 + f" --tokens {args.tokens} --json ...",
                 "old_layouts": {n: m.LAYOUT for n, m in olds.items()}, "new_layout": tmoe.LAYOUT,
                 "device": torch.cuda.get_device_name(),
                 "copy_bytes_per_s": copy, "rows": []}
    for t in map(int, args.tokens.split(",")):
        x = torch.randn(t, h, device="cuda", generator=gen).bfloat16()
        ids = torch.rand(t, e, device="cuda", generator=gen).argsort(1)[:, :k].to(torch.int32)
        tw = torch.rand(t, k, device="cuda", generator=gen) + 0.5
        want = oracle_moe_experts(x, ids, tw, w, 10.0)
        a = (x, ids, tw)
        calls = {n: (lambda a=a, m=m, p=theirs[n]: m.fused_moe(*a, p, 10.0)) for n, m in olds.items()}
        calls[ANCHOR] = lambda a=a: anchor(*a, anchor_w)
        calls.update({n: (lambda c=c, a=a: tmoe.fused_moe(*a, ours, 10.0, config=c)) for n, c in NEW.items()})
        rel = {n: float((fn().double() - want).norm() / want.norm()) for n, fn in calls.items()}
        best: dict[str, float] = {}
        for _ in range(args.rounds):
            for n, fn in calls.items():
                best[n] = min(best.get(n, float("inf")), graph_us(fn, inner=5, reps=10))
        nbytes = int(torch.unique(ids).numel()) * expert_nbytes("mxfp4", h, i)
        row = {"T": t, "weight_bytes": nbytes, "us": best, "rel_l2": rel,
               "x_copy_bw": {n: nbytes / (u * 1e-6) / copy for n, u in best.items()},
               "ratio_to_first_old": {n: best[n] / best[first] for n in best}}
        out["rows"].append(row)
        print(f"T={t}: " + ", ".join(f"{n} {u:.1f}us ({row['x_copy_bw'][n]:.3f}, x{row['ratio_to_first_old'][n]:.3f}, "
                                     f"{rel[n]:.1e})" for n, u in best.items()), flush=True)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
