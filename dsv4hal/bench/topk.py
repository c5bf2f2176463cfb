"""Top-k benchmark: the bound indexer_topk (page transform on) against torch.topk on the same scores and
against the bandwidth floor (B*N*4 + B*k*4 bytes at the copy bandwidth measured in the same run)."""

from __future__ import annotations

from typing import Any

import torch

from dsv4hal.bench.common import bound_op, candidates
from dsv4hal.bench.timing import graph_us

SHAPES = [(b, n, k) for k in (512, 1024) for n in (8192, 65536, 262144) for b in (1, 8, 64)]


def run(platform: Any, ceilings: dict[str, float], quick: bool = False) -> list[dict[str, Any]]:
    rows = []
    for b, n, k in SHAPES if not quick else [s for s in SHAPES if s[0] == 64]:
        scores = torch.randn(b, n, device="cuda")
        lengths = torch.full((b,), n, device="cuda", dtype=torch.int32)
        table = torch.randint(0, 1 << 16, (b, n // 64), device="cuda", dtype=torch.int32)
        row: dict[str, Any] = {"B": b, "N": n, "k": k, "us": {}}
        row["us"]["torch.topk"] = graph_us(lambda s=scores, k=k: torch.topk(s, k, dim=1, sorted=False))
        # each shape's own eligible kernels: the row and chunked top-k split the cases by row width
        case = platform.ops["indexer_topk"].case_of(scores, lengths, k, table)
        for impl in candidates(platform, "indexer_topk", case=case):
            op = bound_op(platform, "indexer_topk", impl)
            row["us"][impl] = graph_us(lambda op=op, s=scores, ln=lengths, k=k, t=table: op(s, ln, k, t))
        row["floor_us"] = (b * n * 4 + b * k * 4) / ceilings["copy_bytes_per_s"] * 1e6
        row["speedup_vs_torch"] = {i: row["us"]["torch.topk"] / u for i, u in row["us"].items()}
        row["x_floor"] = {i: u / row["floor_us"] for i, u in row["us"].items()}
        rows.append(row)
        print(f"topk B={b} N={n} k={k}: " + ", ".join(f"{i} {u:.1f}us" for i, u in row["us"].items())
              + f" floor {row['floor_us']:.1f}us", flush=True)
    return rows
