"""Tune the portable Triton fused MoE on the GPU: time tile configurations side by side (CUDA graphs, median) on
V4-Flash experts for decode and prefill token counts, each checked first against the float64 oracle on the same
inputs (relative L2 error), and write JSON.

    python3 bench/tune_moe.py --json out/tune-moe.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from dsv4hal.bench.timing import graph_us
from dsv4hal.conformance.cases_moe import _expert_weights, _experts_params, oracle_moe_experts
from dsv4hal.kernels.triton import fused_moe as tmoe

# the row kernels' decode tiles ("swap": False); MXFP4 decode's default, the swapped kernels, is swept by
# bench/sweep_mx_moe_decode.py
DECODE = [dict(block_m=16, block_n=bn, block_k=bk, num_warps=w, num_stages=s, swap=False)
          for bn, bk, w, s in ((64, 128, 4, 3), (32, 128, 4, 3), (128, 128, 4, 3), (64, 64, 4, 3), (64, 128, 8, 3),
                               (128, 128, 8, 3), (64, 128, 4, 4), (32, 64, 4, 4), (128, 64, 4, 4))]
PREFILL = [dict(block_m=bm, block_n=bn, block_k=bk, num_warps=w, num_stages=s)
           for bm, bn, bk, w, s in ((64, 64, 64, 4, 3), (64, 128, 64, 4, 3), (128, 64, 64, 4, 3),
                                    (128, 128, 64, 8, 3), (64, 128, 128, 8, 3), (128, 128, 128, 8, 3),
                                    (64, 64, 128, 4, 3), (128, 64, 128, 8, 3), (64, 128, 64, 8, 4))]
CASES = [("mxfp4", 64), ("mxfp4", 4096), ("fp8_block", 64), ("fp8_block", 4096)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", required=True)
    args = ap.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    out: dict = {"device": torch.cuda.get_device_name(), "command": "python3 bench/tune_moe.py --json ...",
                 "defaults": {" ".join(k): v for k, v in tmoe.CONFIGS.items()}, "rows": []}
    weights = {}
    for fmt, t in CASES:
        if fmt not in weights:
            weights.clear()
            torch.cuda.empty_cache()
            weights[fmt] = _expert_weights(_experts_params("flash", t, fmt), torch.device("cuda"), gen)
        w = weights[fmt]
        prepared = tmoe.prepare_weights(w)
        e, h, k = w.num_experts, w.hidden, 6
        x = torch.randn(t, h, device="cuda", generator=gen).bfloat16()
        ids = torch.rand(t, e, device="cuda", generator=gen).argsort(1)[:, :k].to(torch.int32)
        tw = torch.rand(t, k, device="cuda", generator=gen) + 0.5
        want = oracle_moe_experts(x, ids, tw, w, 10.0)
        row = {"format": fmt, "T": t, "us": {}, "rel_l2": {}}
        for cfg in DECODE if t <= 64 else PREFILL:
            name = "m{block_m}-n{block_n}-k{block_k}-w{num_warps}-s{num_stages}".format(**cfg)
            try:
                got = tmoe.fused_moe(x, ids, tw, prepared, 10.0, config=cfg).double()
                row["rel_l2"][name] = float((got - want).norm() / want.norm())
                row["us"][name] = graph_us(lambda c=cfg, a=(x, ids, tw, prepared): tmoe.fused_moe(*a, 10.0, config=c),
                                           inner=2, reps=5)
            except Exception as exc:  # a configuration that does not compile (shared memory) is recorded
                row.setdefault("errors", {})[name] = f"{type(exc).__name__}: {str(exc)[:200]}"
        out["rows"].append(row)
        best = min(row["us"], key=row["us"].get) if row["us"] else None
        print(f"{fmt} T={t}: " + ", ".join(f"{n} {u:.0f}us ({row['rel_l2'][n]:.1e})" for n, u in row["us"].items())
              + f"; best {best}", flush=True)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
