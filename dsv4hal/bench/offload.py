"""Offload benchmark (`dsv4hal bench offload`): `offload_fetch` moving n C4 pages from pinned host memory into the
working set, side by side with a plain pinned host-to-device `copy_` of the same bytes (one contiguous block, the
copy engine's best case). Every fetch misses: consecutive calls select disjoint page sets of a pool twice the
working set, so each call evicts the previous call's pages and loads n new ones. The fetch is timed in a CUDA graph
(plan and copies); the copy eagerly with events. `fetch_over_copy` is the fetch's bandwidth as a fraction of the
copy's (the goal is 0.8 or more). Without a GPU it runs a tiny pool on the CPU (the reference, wall clock)."""

from __future__ import annotations

import time
from typing import Any

import torch

from dsv4hal.bench.common import bound_op, candidates
from dsv4hal.formats.v4_cache import PAGE_SIZE_BY_RATIO, V4PagedCache, page_bytes
from dsv4hal.offload.pool import OffloadedPool

PAGE = PAGE_SIZE_BY_RATIO[4]
FETCH_PAGES = (64, 512, 4096, 16384)  # 2.4 MB to 613 MB a call
QUICK_PAGES = (64, 512)


def _pool(op: Any, n: int, dev: str) -> tuple[OffloadedPool, list[torch.Tensor]]:
    """A pool of 2n pages, a working set of n, and two index sets of n pages each (one slot a page)."""
    host = V4PagedCache(torch.randint(0, 256, (2 * n, page_bytes(PAGE)), dtype=torch.uint8), PAGE)
    pool = OffloadedPool(_Ops(op), 0, n, host=host, device=dev)
    sets = [(torch.arange(n) + s * n).mul(PAGE).add(5).int().to(dev) for s in range(2)]
    return pool, sets


class _Ops:
    """A stand-in platform whose ops.offload_fetch is one forced bound op."""

    def __init__(self, op: Any) -> None:
        self.ops, self.device_type = self, "cuda" if torch.cuda.is_available() else "cpu"
        self.offload_fetch = op


def _alternating(pool: OffloadedPool, sets: list[torch.Tensor]) -> Any:
    state = {"i": 0}

    def call() -> Any:
        state["i"] += 1
        return pool.fetch(sets[state["i"] % 2])

    return call


def _gpu_row(platform: Any, impl: str, n: int) -> dict[str, Any]:
    from dsv4hal.bench.timing import eager_us, graph_us

    nbytes = n * page_bytes(PAGE)
    pool, sets = _pool(bound_op(platform, "offload_fetch", impl, validate=False), n, "cuda")
    fetch = _alternating(pool, sets)
    us = eager_us(fetch) if impl == "torch_reference" else graph_us(fetch, inner=4, reps=15)
    src = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
    dst = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    copy_us = eager_us(lambda: dst.copy_(src, non_blocking=True), reps=15)
    stats = pool.stats()
    return {"impl": impl, "pages": n, "bytes": nbytes, "fetch_us": us, "copy_us": copy_us,
            "fetch_bytes_per_s": nbytes / (us * 1e-6), "copy_bytes_per_s": nbytes / (copy_us * 1e-6),
            "fetch_over_copy": copy_us / us, "all_misses": stats["hits"] == 0}


SWEEP_PAGES = 4096  # the copy kernel alone, at 153 MB a call
SWEEP_BLOCKS = (512, 1024, 2048, 4096, 8192)  # int32 words a program moves
SWEEP_WARPS = (4, 8, 16)


def _copy_kernel_sweep(n: int = SWEEP_PAGES) -> list[dict[str, Any]]:
    """The fetch's page-copy kernel alone (every rank loads, no write-back: the plan's torch ops left out) over its
    launch shapes, against a pinned copy_ of the same bytes: what the copy itself reaches over the host link."""
    from dsv4hal.bench.timing import eager_us, graph_us
    from dsv4hal.kernels.triton.offload_fetch import copy_pages

    nbytes = n * page_bytes(PAGE)
    host = torch.randint(0, 256, (n, page_bytes(PAGE)), dtype=torch.uint8).pin_memory()
    work = torch.empty(n, page_bytes(PAGE), dtype=torch.uint8, device="cuda")
    ranks = torch.arange(n, device="cuda")
    load, none = torch.ones(n, dtype=torch.bool, device="cuda"), torch.zeros(n, dtype=torch.bool, device="cuda")
    src = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
    dst = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    copy_us = eager_us(lambda: dst.copy_(src, non_blocking=True), reps=15)
    rows = []
    for block in SWEEP_BLOCKS:
        for warps in SWEEP_WARPS:
            us = graph_us(lambda b=block, w=warps: copy_pages(host, work, load, ranks, ranks, ranks, none, n, block=b,
                                                               num_warps=w), inner=2, reps=10)
            ok = torch.equal(work[:8].cpu(), host[:8])
            rows.append({"block_words": block, "num_warps": warps, "pages": n, "bytes": nbytes, "kernel_us": us,
                         "copy_us": copy_us, "kernel_over_copy": copy_us / us, "bytes_match": ok})
    return rows


def _cpu_row(platform: Any, n: int) -> dict[str, Any]:
    pool, sets = _pool(platform.ops.offload_fetch, n, "cpu")
    fetch = _alternating(pool, sets)
    fetch()
    t0 = time.perf_counter()
    for _ in range(4):
        fetch()
    us = (time.perf_counter() - t0) * 1e6 / 4
    src = pool.host.data[:n].clone()
    dst = torch.empty_like(src)
    t0 = time.perf_counter()
    for _ in range(4):
        dst.copy_(src)
    copy_us = (time.perf_counter() - t0) * 1e6 / 4
    return {"impl": "torch_reference", "pages": n, "bytes": src.numel(), "fetch_us": us, "copy_us": copy_us,
            "fetch_over_copy": copy_us / us, "all_misses": pool.stats()["hits"] == 0}


def run(platform: Any, ceilings: dict[str, float], quick: bool = False) -> dict[str, Any]:
    rows = []
    if not torch.cuda.is_available():
        rows.append(_cpu_row(platform, 4))
    else:
        impls = candidates(platform, "offload_fetch", case={"host": "pinned", "page_size": PAGE})
        for n in QUICK_PAGES if quick else FETCH_PAGES:
            for impl in [*impls, "torch_reference"]:
                rows.append(_gpu_row(platform, impl, n))
    for r in rows:
        print(f"offload_fetch {r['impl']} {r['pages']} pages ({r['bytes'] / 1e6:.1f} MB): {r['fetch_us']:.1f} us, "
              f"pinned copy_ {r['copy_us']:.1f} us: fetch/copy bandwidth {r['fetch_over_copy']:.2f}", flush=True)
    sweep = _copy_kernel_sweep() if torch.cuda.is_available() else []
    for r in sweep:
        wrong = "" if r["bytes_match"] else " WRONG BYTES"
        print(f"copy kernel alone, block {r['block_words']} words, {r['num_warps']} warps: {r['kernel_us']:.1f} us, "
              f"copy_ {r['copy_us']:.1f} us: {r['kernel_over_copy']:.2f}{wrong}", flush=True)
    return {"rows": rows, "copy_kernel_sweep": sweep}
