"""MXFP4 decode MoE on the GPU: the portable fused MoE's swapped kernels (weight rows as the dot's M, e2m1
decoded by inline PTX, or by plain Triton as a GPU without the PTX runs it) in several tile settings, beside its
row kernels, Marlin and triton_kernels, on the same V4-Flash experts and routing, in one run. Every output is
checked against the float64 oracle first (relative L2); the time is a CUDA graph replay of the whole moe_experts
call (route alignment where it runs, both GEMMs, the combine), quoted as the share of copy bandwidth the distinct routed
experts' bytes would take (the decode goals: >= 0.50 at T = 1, 0.75 at 8 and 64).

    python3 bench/sweep_mx_moe_decode.py --json out/sweep-mx-moe-decode.json [--grid NAME (GRIDS)]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

import dsv4hal
from dsv4hal.bench.common import bound_op, candidates
from dsv4hal.bench.timing import copy_bandwidth, graph_us
from dsv4hal.conformance.cases_moe import _expert_weights, _experts_params, oracle_moe_experts
from dsv4hal.kernels.triton import fused_moe as tmoe
from dsv4hal.ops.moe import case_expert_weights
from dsv4hal.reference.moe import expert_nbytes

TOKENS = (1, 8, 16, 32, 64)
GRIDS = {  # (block_n, block_k, warps, stages[, PTX decode[, block_m[, more config]]]): "final" is the default and its
    # neighbours
    "final": [(64, 256, 4, 3), (64, 256, 4, 3, False), (64, 256, 4, 3, True, 8), (64, 128, 4, 3, True, 8),
              (64, 512, 4, 3), (64, 128, 4, 3), (128, 256, 4, 3)],
    "default": [(64, 256, 4, 3, True, 8)],
    "m8": [(bn, bk, w, s, True, 8) for bn, bk, w, s in ((64, 256, 4, 3), (64, 512, 4, 3), (128, 256, 4, 3),
                                                        (128, 256, 8, 3), (64, 256, 4, 4), (32, 256, 4, 3),
                                                        (64, 256, 4, 2), (64, 256, 8, 3))],
    "narrow": [(bn, bk, w, s) for bn in (32, 64, 128) for bk in (128, 256, 512) for w, s in ((4, 3), (4, 4), (8, 3))],
}
# the layout triton-moe-v2 (reordered element bits, one multiply): m8's settings and the plain decode
GRIDS["v2"] = GRIDS["m8"] + [(64, 256, 4, 3, False, 8)]
# gate and up rows paired in one tile (twice the gate-up programs) or apart (sweep-mx-moe-decode-v3.json ran at commit
# ca224bf with a down kernel whose K could be split too, since removed: slower at every T)
GRIDS["v3"] = [(64, 256, 4, 3, True, 8, {"pair": pair}) for pair in (False, True)]
# one token without the route alignment and the down kernel's last program casting, each undone ("direct": False,
# "fuse_cast": False); sweep-mx-moe-decode-v4.json ran at the tree of commit 0ff4e91 with the elements' codes 8 k
# apart (layout v3 as first written, replaced: slower from T = 2, see the module), fuse_cast then on by default
GRIDS["v4"] = [(64, 256, 4, 3, True, 8, more) for more in ({}, {"direct": False}, {"fuse_cast": False},
                                                          {"direct": False, "fuse_cast": False})]
# the down kernel's own tiles (block_n, block_k, warps, stages), the gate-up kernel's the default (v5 ran at the same
# tree as v4)
GRIDS["v5"] = [(64, 256, 4, 3, True, 8, {"down": dict(zip(("block_n", "block_k", "num_warps", "num_stages"), d))})
               for d in ((64, 256, 4, 3), (32, 256, 4, 3), (32, 512, 4, 3), (64, 512, 4, 3), (128, 256, 4, 3),
                         (64, 256, 4, 4), (64, 128, 4, 4), (32, 256, 4, 4), (128, 512, 8, 3), (64, 1024, 4, 2))]
# one token: the gate-up kernel reading x as it is ("split_x": None) and prefetching the down weights into L2
# ("prefetch"), each and both, and the down and gate-up tiles around both; h100/sweep-mx-moe-decode-l2.json ran at
# commit 3d56e11 with the prefetch, since removed (slower: 42.0 against 40.7 us)
GRIDS["l2"] = [(64, 256, 4, 3, True, 8, more) for more in ({}, {"split_x": None}, {"split_x": False})]
# (sweep-mx-moe-decode-v2b.json ran at commit e90747d with a grid "v2b" that also tried x split in the kernel's
# registers, since removed: 1.07-1.19x slower than the split copy)


def _short(val: object) -> str:
    """A setting's value in a name: a dict of tiles as its values joined by x (down n32-k256-w4-s3: 32x256x4x3)."""
    return "x".join(map(str, val.values())) if isinstance(val, dict) else str(val)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", required=True)
    ap.add_argument("--grid", choices=sorted(GRIDS), default="narrow")
    ap.add_argument("--tokens", default=",".join(map(str, TOKENS)))
    args = ap.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    copy = copy_bandwidth()
    params = _experts_params("flash", 1, "mxfp4")
    w = _expert_weights(params, torch.device("cuda"), gen)
    e, h, i, k = params["E"], params["H"], params["I"], params["top_k"]
    platform = dsv4hal.select_platform()
    vendors = {}
    for name in candidates(platform, "moe_experts", case=case_expert_weights(w)):
        if name == "triton_fused_moe":
            continue
        op = bound_op(platform, "moe_experts", name)
        try:
            vendors[name] = (op, op.prepare_weights(w))
        except Exception as exc:  # recorded; the others still run
            print(f"{name} skipped: {type(exc).__name__}: {str(exc).splitlines()[0]}", flush=True)
    ours = tmoe.prepare_weights(w)
    settings = {"rows (former default)": dict(swap=False, block_m=16, block_k=64)}
    for bn, bk, nw, ns, *rest in GRIDS[args.grid]:
        ptx = rest[0] if rest else True
        bm = rest[1] if len(rest) > 1 else 16
        more = rest[2] if len(rest) > 2 else {}
        name = (f"swap-n{bn}-k{bk}-w{nw}-s{ns}{'' if ptx else '-plain'}{'' if bm == 16 else f'-m{bm}'}"
                + "".join(f"-{key}{'' if val is True else _short(val)}" for key, val in more.items()))
        settings[name] = dict(swap=True, block_m=bm, block_n=bn, block_k=bk, num_warps=nw, num_stages=ns, ptx=ptx,
                              **more)
    out: dict = {"command": f"python3 bench/sweep_mx_moe_decode.py --grid {args.grid} --json ...",
                 "device": torch.cuda.get_device_name(), "copy_bytes_per_s": copy, "rows": []}
    for t in map(int, args.tokens.split(",")):
        x = torch.randn(t, h, device="cuda", generator=gen).bfloat16()
        ids = torch.rand(t, e, device="cuda", generator=gen).argsort(1)[:, :k].to(torch.int32)
        tw = torch.rand(t, k, device="cuda", generator=gen) + 0.5
        want = oracle_moe_experts(x, ids, tw, w, 10.0)
        nbytes = int(torch.unique(ids).numel()) * expert_nbytes("mxfp4", h, i)
        row: dict = {"T": t, "weight_bytes": nbytes, "us": {}, "rel_l2": {}, "errors": {}}
        a = (x, ids, tw)
        calls = {n: (lambda op=op, p=p, a=a: op(*a, p)) for n, (op, p) in vendors.items()}
        calls.update({n: (lambda c=c, a=a: tmoe.fused_moe(*a, ours, 10.0, config=c)) for n, c in settings.items()})
        for name, fn in calls.items():
            try:
                got = fn().double()
                row["rel_l2"][name] = float((got - want).norm() / want.norm())
                row["us"][name] = graph_us(fn, inner=5, reps=10)
            except Exception as exc:  # a setting that does not compile (shared memory, registers) is recorded
                row["errors"][name] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
        row["x_copy_bw"] = {n: nbytes / (u * 1e-6) / copy for n, u in row["us"].items()}
        best = min((n for n in row["us"] if n.startswith("swap")), key=row["us"].get, default=None)
        row["best_swap"] = best
        out["rows"].append(row)
        top = sorted(row["us"].items(), key=lambda kv: kv[1])[:6]
        print(f"T={t}: " + ", ".join(f"{n} {u:.1f}us ({row['x_copy_bw'][n]:.2f}, {row['rel_l2'][n]:.1e})"
                                     for n, u in top)
              + " | " + ", ".join(f"{n} {row['us'][n]:.1f}" for n in calls if n in row["us"] and
                                  not n.startswith("swap")) + f" | {len(row['errors'])} errors", flush=True)
        for n, msg in list(row["errors"].items())[:3]:
            print(f"  {n}: {msg}", flush=True)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
