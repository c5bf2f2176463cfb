"""Tune the portable Triton kernels on the GPU: time each launch configuration side by side (CUDA graphs,
median) on the benchmark shapes, after checking its output against the reference, and write JSON.

    python3 bench/tune_triton.py --json out/tune-triton.json
    python3 bench/tune_triton.py --json out/tune-cache.json --ops cache   # pack_store / dequant_gather only
    python3 bench/tune_triton.py --json out/tune-topk.json --ops topk     # the sampled top-k, pass by pass
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

import torch
import triton

import dsv4hal
from dsv4hal.bench import attention as attn_bench
from dsv4hal.bench.cache_ops import BYTES_PER_TOKEN
from dsv4hal.bench.pools import random_pool
from dsv4hal.bench.timing import copy_bandwidth, graph_us
from dsv4hal.formats.v4_cache import V4PagedCache
from dsv4hal.kernels.triton import sparse_attention as tattn
from dsv4hal.kernels.triton import topk_chunked, topk_row, topk_sampled
from dsv4hal.kernels.triton import v4_cache_kernels as tcache
from dsv4hal.kernels.triton.topk import topk_outputs
from dsv4hal.reference.indexer_topk import indexer_topk as ref_topk
from dsv4hal.reference.pack_store import dequant_gather as ref_gather
from dsv4hal.reference.pack_store import pack_store as ref_store
from dsv4hal.reference.sparse_attention import sparse_attention_decode as ref_decode

ATTN_CONFIGS = [dict(block_h=bh, bk=bk, num_warps=w, num_stages=st, programs=p, dv_split=dv)
                for bh, bk, w, st, p, dv in ((64, 32, 8, 2, 264, 1), (64, 32, 8, 2, 132, 1), (64, 32, 8, 2, 64, 1),
                                             (64, 32, 8, 2, 264, 2), (64, 32, 8, 2, 132, 2), (64, 32, 8, 2, 528, 2),
                                             (64, 32, 4, 2, 264, 2), (64, 64, 8, 2, 264, 2), (64, 16, 8, 2, 264, 2),
                                             (64, 32, 8, 3, 264, 2), (32, 32, 4, 2, 264, 2), (32, 32, 8, 2, 264, 2),
                                             (32, 32, 4, 2, 528, 1), (16, 32, 4, 2, 264, 1), (16, 32, 4, 2, 528, 1),
                                             (16, 64, 4, 2, 264, 1), (16, 32, 4, 2, 264, 2), (64, 32, 8, 1, 132, 2))]
# the sampled top-k (the static kernel for rows wider than 16384): samples, the bisections from the keys' common high
# bits, the sample threshold's resolution, the filter's chunk a program, each also timed pass by pass (cumulative).
# H200 results, one entry each in bench/results/h200/tune-triton-topk.json: the launch shape ("launch_shape"; the
# first config is the default below 8 rows, the first per-key one from 8 rows), per-key filter slots from 8 rows,
# chunk 1024 in one block, 4 warps ("filter_per_key": 64 x 256K 56.2 us at 4096 samples), the lean filter from
# topk_sampled.LEAN_MIN_ROWS rows ("filter_lean": 64 x 256K 56.5 -> 52.5 us, 1-8 rows ~1 us slower), sample
# positions by a shift ("filter_divide": 51.3 -> 48.4 us), the half tile ("half_tile"), the fallback inside the
# select launch ("fallback_in_select"), and, slower at every shape and so not options any more: sampling fused into
# the filter ("filter_fused_not_kept"), a radix select ("radix_select_not_kept"), blocks that skip their atomics
# ("filter_skip_not_kept"), the sample and select passes on 1 or 2 warps ("select_warps").
TOPK_VARIANTS: dict[str, dict] = {"default": {}, "half": {"half_tile": True},
                                  "chunk2048-st2": {"chunk": 2048, "filter_stages": 2},
                                  "chunk4096-st3": {"chunk": 4096, "filter_stages": 3}}
# the row kernel (static for rows up to 16384: the demo's 64 x 8192): warps
ROW_CONFIGS = [dict(num_warps=w) for w in (4, 8, 16)]
# 8256: the demo's 129 pages x 64 at 32K context (a 64-key tail); 9216, 10240, 12288: tails of 1/8, 1/4, 1/2 of 8192
ROW_SHAPES = [(64, 8192, 512), (1, 8192, 512), (64, 16384, 512), (64, 8256, 512), (1, 8256, 512), (64, 9216, 512),
              (64, 10240, 512), (64, 12288, 512)]
# the decode step's three layers at batch 64 (SWA alone; C4; C128 at 8K), then C4 at batch 256
ATTN_SHAPES = [(attn_bench.AttnConfig("flash-swa (SWA 128)", 64, 0, 0), 64), (attn_bench.CONFIGS[0], 64),
               (attn_bench.CONFIGS[1], 64), (attn_bench.CONFIGS[0], 256)]
TOPK_SHAPES = [(1, 262144, 512), (8, 262144, 512), (16, 262144, 512), (64, 262144, 512), (64, 65536, 1024)]
# the exact fallback inside the select launch, every row forced onto it (cap = k and a margin past
# the samples: threshold 0, so count = n > cap), at the select launch's default warps and at 4, against the fallback
# as two launches of its own after the passes (triton_chunked_topk on every row: "former-fallback-launches-alone")
FALLBACK_SHAPES = [(1, 262144, 512), (64, 262144, 512)]
FALLBACK_WARPS = (None, 4)
# pack_store / dequant_gather: tokens per program (BLOCK_T) x warps; (16, 1) is left out, it spills on sm_90
# (255 registers and a 1.6 KB stack under Triton 3.6). t1-w2 is the default (v4_cache_kernels.DEFAULT_*).
CACHE_CONFIGS = [dict(block_t=t, num_warps=w) for t in (1, 2, 4, 8, 16) for w in (1, 2, 4, 8) if (t, w) != (16, 1)]
# tokens, slot layout: random slots of a 4M-slot pool of 256-token pages (as dsv4hal bench pack_store), or
# consecutive slots from a page boundary (a prefill)
CACHE_SHAPES = [(4096, "random"), (4096, "contiguous"), (32768, "random"), (32768, "contiguous")]
OPS = ("attention", "topk", "cache")


def _cache_rows(gen: torch.Generator) -> list[dict]:
    """pack_store and dequant_gather per shape and config: bytes equal to the reference's, then timed. A token
    moves 1024 B of bf16 keys and 584 B of cache record either way."""
    pool = random_pool(1 << 22, 256)
    copy_gbps = copy_bandwidth() / 1e9
    default = f"t{tcache.DEFAULT_TOKENS_PER_PROGRAM}-w{tcache.DEFAULT_NUM_WARPS}"
    rows = []
    for n, layout in CACHE_SHAPES:
        k = torch.randn(n, 512, device="cuda", generator=gen).bfloat16()
        if layout == "random":
            loc = torch.randperm(pool.num_slots, device="cuda", generator=gen)[:n]
        else:
            loc = torch.arange(n, device="cuda") + 1000 * pool.page_size
        want = V4PagedCache(pool.data.clone(), pool.page_size, pool.fp8)
        ref_store(k, loc, want)
        keys = ref_gather(want, loc).view(torch.int16)
        for op in ("pack_store", "dequant_gather"):
            row = {"op": op, "N": n, "loc": layout, "page_size": pool.page_size, "default": default,
                   "copy_GBps": copy_gbps, "us": {}, "GBps": {}, "fraction_of_copy": {}, "ok": {}}
            for c in CACHE_CONFIGS:
                name = "t{block_t}-w{num_warps}".format(**c)
                try:
                    if op == "pack_store":
                        got = V4PagedCache(pool.data.clone(), pool.page_size, pool.fp8)
                        tcache.pack_store(k, loc, got, config=c)
                        row["ok"][name] = bool(torch.equal(got.data, want.data))
                        del got
                        us = graph_us(lambda c=c, k=k, loc=loc: tcache.pack_store(k, loc, pool, config=c))
                    else:
                        got = tcache.dequant_gather(want, loc, config=c)
                        row["ok"][name] = bool(torch.equal(got.view(torch.int16), keys))
                        us = graph_us(lambda c=c, w=want, loc=loc: tcache.dequant_gather(w, loc, config=c))
                    row["us"][name] = us
                    row["GBps"][name] = n * BYTES_PER_TOKEN / (us * 1e-6) / 1e9
                    row["fraction_of_copy"][name] = row["GBps"][name] / copy_gbps
                except Exception as exc:  # a config that does not compile or fit is recorded, not fatal
                    row["ok"][name] = f"{type(exc).__name__}: {str(exc)[:200]}"
            timed = [x for x in row["us"] if row["ok"][x] is True]
            row["best"] = min(timed, key=row["us"].__getitem__) if timed else None
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def _topk_inputs(b: int, n: int, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, dict]:
    """Random scores of b full rows of n, a page table, the reference's indices and a result row with torch.topk
    timed."""
    scores = torch.randn(b, n, device="cuda")
    lengths = torch.full((b,), n, device="cuda", dtype=torch.int32)
    table = torch.randint(0, 1 << 16, (b, n // 64), device="cuda", dtype=torch.int32)
    row = {"B": b, "N": n, "k": k, "us": {"torch.topk": graph_us(lambda s=scores, k=k: torch.topk(s, k, dim=1))},
           "ok": {}}
    return scores, lengths, table, ref_topk(scores, lengths, k, table)[0], row


def _row_layouts(n: int) -> dict[str, dict[str, int]]:
    """The row kernel's tilings of a row of n: one power-of-two tile (padded), and where n is no power of two, the
    power of two below it and a power-of-two tail (whatever launch_config would choose)."""
    layouts = {"padded": {"block": max(triton.next_power_of_2(n), topk_row.MIN_BLOCK), "tail": 0}}
    split = topk_row.split_tiles(n)
    if split is not None:
        layouts["tail"] = {"block": split[0], "tail": split[1]}
    return layouts


def _time_topk(row: dict, name: str, ref: torch.Tensor, run: Callable[[], tuple]) -> bool:
    """Check one config's indices against the reference's, then time it (graph); a config that fails to compile
    or run is recorded, not fatal. Whether it ran."""
    try:
        row["ok"][name] = bool(torch.equal(run()[0].sort(1).values, ref.sort(1).values))
        row["us"][name] = graph_us(run)
        return True
    except Exception as exc:
        row["ok"][name] = f"{type(exc).__name__}: {str(exc)[:200]}"
        return False


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", required=True)
    ap.add_argument("--ops", default=",".join(OPS), help=f"comma-separated subset of {', '.join(OPS)}")
    ap.add_argument("--attn-shapes", default=",".join(map(str, range(len(ATTN_SHAPES)))),
                    help="comma-separated indices into ATTN_SHAPES")
    args = ap.parse_args()
    ops = args.ops.split(",")
    if not set(ops) <= set(OPS):
        ap.error(f"--ops: choose from {', '.join(OPS)}")
    gen = torch.Generator(device="cuda").manual_seed(0)
    out: dict = {"device": torch.cuda.get_device_name(), "attention": [], "topk": [], "cache": []}
    if "cache" in ops:  # first: the shortest section, and its pool is freed before the attention pools
        out["cache"] = _cache_rows(gen)
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    pools = ({0: random_pool(1 << 22, 256), 4: random_pool(1 << 22, 64), 128: random_pool(1 << 22, 2)}
             if "attention" in ops else {})
    platform = dsv4hal.select_platform()
    shapes = [ATTN_SHAPES[int(i)] for i in args.attn_shapes.split(",")]
    for cfg, t in shapes if "attention" in ops else ():
        a = attn_bench._inputs(cfg, t, pools, gen)
        row = {"config": cfg.name, "T": t, "us": {}, "ok": {}}
        if platform.info.has("flash_mla"):
            row["us"]["flashmla"] = graph_us(attn_bench._direct_flashmla(a))
        rows = ("q", "swa_indices", "swa_lengths", "extra_indices", "extra_lengths")
        small = {k: (v[:8] if k in rows else v) for k, v in a.items()}
        want = ref_decode(**small)[0].float()
        for c in ATTN_CONFIGS:
            name = "bh{block_h}-bk{bk}-w{num_warps}-s{num_stages}-p{programs}-dv{dv_split}".format(**c)
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
    for b, n, k in TOPK_SHAPES if "topk" in ops else ():
        scores, lengths, table, ref, row = _topk_inputs(b, n, k)
        for ns in (2048, 4096):  # the sample estimate's candidate count c a row (exact search, no slack): k <= c <= CAP
            r = -(-2 * k * ns // n) + topk_sampled.MARGIN  # or the row falls back
            t = scores[:, torch.arange(ns, device="cuda") * n // ns].topk(r, dim=1).values[:, -1:]
            c = (scores >= t).sum(1)
            row.setdefault("estimate", {})[f"ns{ns}"] = {"c_min": int(c.min()), "c_max": int(c.max()), "misses": int(
                ((c < k) | (c > topk_sampled.CAP)).sum())}
        for name, variant in TOPK_VARIANTS.items():
            c = {**topk_sampled.default_config(b, n, k), **variant}
            if _time_topk(row, name, ref, lambda c=c, s=scores, ln=lengths, k=k, t=table:
                          topk_sampled.indexer_topk(s, ln, k, t, config=c)):
                row.setdefault("us_passes", {})[name] = [  # cumulative: sample, +filter, +select (the fallback inside)
                    graph_us(lambda c=c, p=p, s=scores, ln=lengths, k=k, t=table:
                             topk_sampled.indexer_topk(s, ln, k, t, config={**c, "passes": p})) for p in (1, 2, 3)]
        if (b, n, k) in FALLBACK_SHAPES:
            for w in FALLBACK_WARPS:
                c = {"cap": k, "margin": 1 << 30, **({} if w is None else {"select_warps": w})}
                _time_topk(row, f"fallback-forced-selw{w or 'default'}", ref,
                           lambda c=c, s=scores, ln=lengths, k=k, t=table: topk_sampled.indexer_topk(s, ln, k, t,
                                                                                                     config=c))

            def former(s: torch.Tensor = scores, ln: torch.Tensor = lengths, k: int = k, t: torch.Tensor = table
                       ) -> tuple:
                raw, pages = topk_outputs(s.shape[0], k, True, s.device)
                topk_chunked.launch(s, ln, k, raw, pages, t, 64)
                return raw, pages

            _time_topk(row, "former-fallback-launches-alone", ref, former)
        out["topk"].append(row)
        print(json.dumps(row), flush=True)
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    for b, n, k in ROW_SHAPES if "topk" in ops else ():
        scores, lengths, table, ref, row = _topk_inputs(b, n, k)
        row = {"kernel": "triton_row_topk", **row, "default": topk_row.launch_config(n)}
        for layout, tiles in _row_layouts(n).items():
            for c in ROW_CONFIGS:
                c = {**tiles, **c}
                _time_topk(row, f"{layout}-w{c['num_warps']}", ref, lambda c=c, s=scores, ln=lengths, k=k, t=table:
                           topk_row.indexer_topk(s, ln, k, t, config=c))
        out["topk"].append(row)
        print(json.dumps(row), flush=True)
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    Path(args.json).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
