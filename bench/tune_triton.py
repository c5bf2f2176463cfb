"""Tune the portable Triton kernels on the GPU: time each launch configuration side by side (CUDA graphs,
median) on the benchmark shapes, after checking its output against the reference, and write JSON.

    python3 bench/tune_triton.py --json out/tune-triton.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

import dsv4hal
from dsv4hal.bench import attention as attn_bench
from dsv4hal.bench.pools import random_pool
from dsv4hal.bench.timing import graph_us
from dsv4hal.kernels.triton import sparse_attention as tattn
from dsv4hal.kernels.triton import topk as ttopk
from dsv4hal.reference.indexer_topk import indexer_topk as ref_topk
from dsv4hal.reference.sparse_attention import sparse_attention_decode as ref_decode

ATTN_CONFIGS = [dict(block_h=bh, bk=bk, num_warps=w, num_stages=st)
                for bh, bk, w, st in ((32, 32, 4, 2), (64, 32, 4, 2), (64, 64, 4, 2), (64, 32, 8, 2), (64, 64, 8, 2),
                                      (32, 64, 4, 2), (64, 32, 4, 3), (16, 32, 4, 2), (64, 16, 4, 2))]
TOPK_CONFIGS = [dict(chunk=c, block=b, num_warps=w)
                for c, b, w in ((4096, 1024, 4), (2048, 1024, 4), (16384, 1024, 4), (4096, 2048, 8), (8192, 2048, 8),
                                (4096, 512, 4))]
ATTN_SHAPES = [(attn_bench.CONFIGS[0], 64), (attn_bench.CONFIGS[0], 256), (attn_bench.CONFIGS[0], 1024),
               (attn_bench.CONFIGS[2], 256), (attn_bench.CONFIGS[4], 256)]
TOPK_SHAPES = [(64, 262144, 512), (8, 262144, 512), (1, 262144, 512), (64, 65536, 1024)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", required=True)
    args = ap.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    pools = {0: random_pool(1 << 22, 256), 4: random_pool(1 << 22, 64), 128: random_pool(1 << 22, 2)}
    out: dict = {"device": torch.cuda.get_device_name(), "attention": [], "topk": []}
    platform = dsv4hal.select_platform()
    for cfg, t in ATTN_SHAPES:
        a = attn_bench._inputs(cfg, t, pools, gen)
        row = {"config": cfg.name, "T": t, "us": {}, "ok": {}}
        if platform.info.has("flash_mla"):
            row["us"]["flashmla"] = graph_us(attn_bench._direct_flashmla(a))
        rows = ("q", "swa_indices", "swa_lengths", "extra_indices", "extra_lengths")
        small = {k: (v[:8] if k in rows else v) for k, v in a.items()}
        want = ref_decode(**small)[0].float()
        for c in ATTN_CONFIGS:
            name = "bh{block_h}-bk{bk}-w{num_warps}-s{num_stages}".format(**c)
            try:
                got = tattn._launch(small["q"], small["sink"], small["softmax_scale"], small["swa_cache"],
                                    small["swa_indices"], small["swa_lengths"], small.get("extra_cache"),
                                    small.get("extra_indices"), small.get("extra_lengths"), fp8_source=True,
                                    config=c)[0].float()
                row["ok"][name] = bool(((got - want).abs() <= 2e-2 + 2e-2 * want.abs()).all())
                row["us"][name] = graph_us(lambda c=c, a=a: tattn._launch(
                    a["q"], a["sink"], a["softmax_scale"], a["swa_cache"], a["swa_indices"], a["swa_lengths"],
                    a.get("extra_cache"), a.get("extra_indices"), a.get("extra_lengths"), fp8_source=True, config=c))
            except Exception as exc:  # a config that does not compile or fit is recorded, not fatal
                row["ok"][name] = f"{type(exc).__name__}: {str(exc)[:200]}"
        out["attention"].append(row)
        print(json.dumps(row), flush=True)
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")  # partial results survive a time-out
    for b, n, k in TOPK_SHAPES:
        scores = torch.randn(b, n, device="cuda")
        lengths = torch.full((b,), n, device="cuda", dtype=torch.int32)
        table = torch.randint(0, 1 << 16, (b, n // 64), device="cuda", dtype=torch.int32)
        row = {"B": b, "N": n, "k": k, "us": {"torch.topk": graph_us(lambda s=scores, k=k: torch.topk(s, k, dim=1))},
               "ok": {}}
        ref = ref_topk(scores, lengths, k, table)[0]
        for c in TOPK_CONFIGS:
            name = "chunk{chunk}-block{block}-w{num_warps}".format(**c)
            try:
                raw = ttopk.indexer_topk(scores, lengths, k, table, config=c)[0]
                row["ok"][name] = bool(torch.equal(raw.sort(1).values, ref.sort(1).values))
                row["us"][name] = graph_us(lambda c=c, s=scores, ln=lengths, k=k, t=table:
                                           ttopk.indexer_topk(s, ln, k, t, config=c))
            except Exception as exc:
                row["ok"][name] = f"{type(exc).__name__}: {str(exc)[:200]}"
        out["topk"].append(row)
        print(json.dumps(row), flush=True)
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    Path(args.json).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
