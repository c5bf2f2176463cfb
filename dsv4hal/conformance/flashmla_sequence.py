"""The call sequence that fired FlashMLA's scheduler assertion, as a GPU regression check.

Cause (H200; `dsv4hal run flashmla-sequence` checks it): not FlashMLA and not the binding, but
stream order in the timing harness. `triton.testing.do_bench_cudagraph` runs its first, eager call of the
function on a fresh side stream that does not wait for the current stream, so the decode call can read
`topk_length`, `extra_topk_length` and the indices before the kernels that write them (queued on the default
stream just before) have run. FlashMLA's scheduler then plans with garbage lengths and its device assertion
fires (or, with garbage indices, the decode reads outside the cache). It shows only when those tensors reuse
freed allocator blocks holding old data, which is why an earlier eager call (whose temporaries were freed) was
enough to trigger it and why it passed with CUDA_LAUNCH_BLOCKING=1.

`python3 -m dsv4hal.conformance.flashmla_sequence` runs the sequence with ordered streams and checks every result:
  1. eager `sparse_attention_decode` of assorted shapes (T 1..257, h_q 64/128, C4 widths 512/1024, C128 widths
     64..8192, random SWA lengths 1..128, -1 holes) against the reference;
  2. the Triton top-k and pack store timed in CUDA graphs (dsv4hal.bench.timing.graph_us: the side stream waits
     for the current one);
  3. the decode at V4-Flash C4 (SWA 128 + top-512, h_q 64, T 1024) timed the same way and then with
     `do_bench_cudagraph` after a `torch.cuda.synchronize()`, and checked again.
`--unordered` reproduces the race instead (step 3 through do_bench_cudagraph with no synchronisation); it may
kill the CUDA context, so run it in a process of its own. Prints one JSON line; exit code 0 when all passed."""

from __future__ import annotations

import json
import sys

import torch

import dsv4hal
from dsv4hal.bench.timing import graph_us
from dsv4hal.override import Overrides
from dsv4hal.reference.sparse_attention import sparse_attention_decode as reference_decode

SCALE = 512 ** -0.5
TOLERANCE = 2e-2  # bf16 output of FP8 keys, fp32 accumulation in another order (as the conformance cells)


def cache(plat: dsv4hal.Platform, pages: int, page_size: int, g: torch.Generator) -> dsv4hal.V4PagedCache:
    c = dsv4hal.V4PagedCache.empty(pages, page_size, "e4m3fn", device="cuda")
    n = pages * page_size
    keys = torch.randn(n, 512, generator=g, device="cuda") * torch.rand(n, 1, generator=g, device="cuda") * 4
    plat.ops.pack_store(keys.bfloat16(), torch.arange(n, device="cuda"), c)
    return c


def decode_inputs(t: int, h: int, swa: dsv4hal.V4PagedCache, extra: dsv4hal.V4PagedCache | None, width: int,
                  g: torch.Generator) -> tuple[tuple, dict]:
    dev = "cuda"
    q = (torch.randn(t, h, 512, generator=g, device=dev) * 0.5).bfloat16()
    si = torch.randint(0, swa.num_slots, (t, 128), generator=g, device=dev, dtype=torch.int32)
    si[torch.rand(t, 128, generator=g, device=dev) < 0.05] = -1  # holes
    sl = torch.randint(1, 129, (t,), generator=g, device=dev, dtype=torch.int32)
    sink = torch.randn(h, generator=g, device=dev)
    kw: dict = {}
    if extra is not None:
        xi = torch.randint(0, extra.num_slots, (t, width), generator=g, device=dev, dtype=torch.int32)
        xi[torch.rand(t, width, generator=g, device=dev) < 0.05] = -1
        xl = torch.randint(0, width + 1, (t,), generator=g, device=dev, dtype=torch.int32)
        kw = dict(extra_cache=extra, extra_indices=xi, extra_lengths=xl)
    return (q, swa, si, sl, sink, SCALE), kw


def rel_error(plat: dsv4hal.Platform, args: tuple, kw: dict) -> float:
    out, _ = plat.ops.sparse_attention_decode(*args, **kw)
    want, _ = reference_decode(*args, **kw)
    if not bool(torch.isfinite(out).all()):
        return float("inf")
    return float((out.float() - want.float()).norm() / want.float().norm().clamp_min(1e-30))


def main(argv: list[str]) -> int:
    unordered = "--unordered" in argv
    # FlashMLA forced: the sequence is FlashMLA's (one query row would go to the Triton kernel by default on SM90)
    candidates = dsv4hal.select_platform().ops.sparse_attention_decode.decide().candidates
    flashmla = next((c.name for c in candidates if c.name.startswith("flashmla") and c.status != "rejected"), None)
    if flashmla is None:
        raise SystemExit("no FlashMLA decode kernel can run here: " + "; ".join(
            f"{c.name}: {', '.join(c.reasons)}" for c in candidates if c.name.startswith("flashmla")))
    plat = dsv4hal.select_platform(overrides=Overrides(kernels={"sparse_attention_decode": flashmla},
                                                       sources={"kernels.sparse_attention_decode": "api"}))
    g = torch.Generator("cuda").manual_seed(1234)
    swa = cache(plat, 16, 256, g)
    c4 = cache(plat, 512, 64, g)
    c128 = cache(plat, 2048, 2, g)
    res: dict = {"platform": plat.name, "decode_kernel": plat.ops.sparse_attention_decode.decide().chosen.name,
                 "eager": []}
    # 1. eager calls of assorted shapes
    for t, h, extra, width in [(1, 64, c4, 512), (1, 64, None, 0), (2, 128, c4, 1024), (7, 64, c128, 64),
                               (64, 128, c128, 512), (257, 64, c4, 512), (33, 64, c128, 8192), (1, 128, c4, 512)]:
        args, kw = decode_inputs(t, h, swa, extra, width, g)
        res["eager"].append({"T": t, "h_q": h, "extra_width": width, "rel_error": rel_error(plat, args, kw)})
    torch.cuda.synchronize()
    # 2. the Triton top-k and pack store timed in graphs
    scores = torch.randn(64, 65536, generator=g, device="cuda")
    lengths = torch.full((64,), 65536, device="cuda", dtype=torch.int32)
    table = torch.randint(0, 1 << 16, (64, 1024), generator=g, device="cuda", dtype=torch.int32)
    res["topk_us"] = graph_us(lambda: plat.ops.indexer_topk(scores, lengths, 512, table))
    kv = torch.randn(4096, 512, generator=g, device="cuda").bfloat16()
    loc = torch.randperm(swa.num_slots, device="cuda")[:4096]
    res["pack_store_us"] = graph_us(lambda: plat.ops.pack_store(kv, loc, swa))
    # 3. the decode at V4-Flash C4, T = 1024, timed in graphs
    big_swa = cache(plat, 64, 256, g)
    big_c4 = cache(plat, 2048, 64, g)
    args, kw = decode_inputs(1024, 64, big_swa, big_c4, 512, g)

    def call() -> object:
        return plat.ops.sparse_attention_decode(*args, **kw)

    if unordered:
        from triton.testing import do_bench_cudagraph

        res["unordered_us"] = do_bench_cudagraph(call, rep=50) * 1000
    else:
        res["graph_us"] = graph_us(call)
        from triton.testing import do_bench_cudagraph

        torch.cuda.synchronize()  # what do_bench_cudagraph's side stream needs: the inputs written first
        res["do_bench_cudagraph_us"] = do_bench_cudagraph(call, rep=50) * 1000
    torch.cuda.synchronize()
    res["T1024_rel_error"] = rel_error(plat, args, kw)
    errors = [e["rel_error"] for e in res["eager"]] + [res["T1024_rel_error"]]
    res["ok"] = all(e <= TOLERANCE for e in errors)
    print(json.dumps(res))
    return 0 if res["ok"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
