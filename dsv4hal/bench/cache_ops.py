"""Pack-store benchmark: the bound pack_store (and the PyTorch reference) in GB/s against the
device-to-device copy bandwidth measured in the same run. A token moves 1024 B in (bf16 K) and
584 B out."""

from __future__ import annotations

from typing import Any

import torch

from dsv4hal.bench.common import bound_op, candidates
from dsv4hal.bench.pools import random_pool
from dsv4hal.bench.timing import graph_us

TOKENS = (1, 64, 4096, 32768)
BYTES_PER_TOKEN = 1024 + 584


def run(platform: Any, ceilings: dict[str, float], quick: bool = False) -> list[dict[str, Any]]:
    pool = random_pool(1 << 22, 256)
    gen = torch.Generator(device="cuda").manual_seed(1)
    names = candidates(platform, "pack_store", with_reference=True)
    rows = []
    for n in TOKENS:
        k = torch.randn(n, 512, device="cuda", dtype=torch.bfloat16)
        loc = torch.randperm(pool.num_slots, device="cuda", generator=gen)[:n].to(torch.int64)
        row: dict[str, Any] = {"tokens": n, "us": {}, "GBps": {}}
        for impl in names:
            op = bound_op(platform, "pack_store", impl)
            us = graph_us(lambda op=op, k=k, loc=loc: op(k, loc, pool))
            row["us"][impl] = us
            row["GBps"][impl] = n * BYTES_PER_TOKEN / (us * 1e-6) / 1e9
        row["copy_GBps"] = ceilings["copy_bytes_per_s"] / 1e9
        row["fraction_of_copy"] = {i: g / row["copy_GBps"] for i, g in row["GBps"].items()}
        rows.append(row)
        print(f"pack_store N={n}: " + ", ".join(f"{i} {u:.1f}us {row['GBps'][i]:.0f}GB/s"
                                                for i, u in row["us"].items()), flush=True)
    return rows
