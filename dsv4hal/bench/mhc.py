"""mHC benchmark: mhc_pre, mhc_post, mhc_post_pre and mhc_head at V4-Flash (d 4096) for T = 1, 8, 64, 4096, every
eligible kernel and the PyTorch reference, in CUDA graphs, against the bandwidth floor (the bytes of every input
and output once, at the copy bandwidth measured in the same run). Issue 15's goals: mhc_pre and mhc_post each
<= 4x their floor at T = 64; mhc_post_pre <= 20 us at T <= 8."""

from __future__ import annotations

import math
from typing import Any

import torch

from dsv4hal.bench.common import bound_op, candidates
from dsv4hal.bench.timing import graph_us

HIDDEN = 4096
TOKENS = (1, 8, 64, 4096)
OPS = ("mhc_pre", "mhc_post", "mhc_post_pre", "mhc_head")
GOALS = {("mhc_pre", 64): ("floor_ratio", 4.0), ("mhc_post", 64): ("floor_ratio", 4.0),
         ("mhc_post_pre", 1): ("us", 20.0), ("mhc_post_pre", 8): ("us", 20.0)}


def _args(op: str, t: int, d: int, gen: torch.Generator) -> tuple[Any, ...]:
    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, device="cuda")

    x = randn(t, 4, d).bfloat16()
    rows, scales = (4, 1) if op == "mhc_head" else (24, 3)
    gates = (randn(rows, 4 * d) / math.sqrt(4 * d), 0.5 * randn(rows), 0.5 + 0.1 * randn(scales).abs())
    post, comb = 2 * torch.sigmoid(randn(t, 4)), torch.softmax(randn(t, 4, 4), dim=-1)
    f = randn(t, d).bfloat16()
    return {"mhc_pre": (x, *gates), "mhc_head": (x, *gates), "mhc_post": (f, x, post, comb),
            "mhc_post_pre": (f, x, post, comb, *gates)}[op]


def _nbytes(v: Any) -> int:
    if isinstance(v, torch.Tensor):
        return v.numel() * v.element_size()
    if isinstance(v, (tuple, list)):
        return sum(_nbytes(u) for u in v)
    return 0


def run(platform: Any, ceilings: dict[str, float], quick: bool = False) -> list[dict[str, Any]]:
    gen = torch.Generator(device="cuda").manual_seed(1)
    copy_bw = ceilings["copy_bytes_per_s"]
    rows = []
    for op in OPS:
        names = candidates(platform, op, with_reference=True)
        for t in (1, 64) if quick else TOKENS:
            args = _args(op, t, HIDDEN, gen)
            row: dict[str, Any] = {"op": op, "T": t, "hidden": HIDDEN, "us": {}, "floor_ratio": {}}
            for impl in names:
                fn = bound_op(platform, op, impl)
                row["us"][impl] = graph_us(lambda fn=fn, a=args: fn(*a))
            out = bound_op(platform, op, names[0])(*args)
            row["bytes"] = _nbytes(args) + _nbytes(out)
            row["floor_us"] = row["bytes"] / copy_bw * 1e6
            row["floor_ratio"] = {i: us / row["floor_us"] for i, us in row["us"].items()}
            best = min((i for i in row["us"] if not i.startswith("torch_reference")), key=row["us"].get,
                       default=None)
            if best is not None and "torch_reference" in row["us"]:
                row["speedup_vs_reference"] = row["us"]["torch_reference"] / row["us"][best]
            goal = GOALS.get((op, t))
            if goal and best is not None:
                kind, limit = goal
                value = row["floor_ratio"][best] if kind == "floor_ratio" else row["us"][best]
                row["goal"] = {"kernel": best, kind: value, "limit": limit, "met": value <= limit}
            rows.append(row)
            line = ", ".join(f"{i} {u:.1f}us ({row['floor_ratio'][i]:.1f}x floor)" for i, u in row["us"].items())
            if "goal" in row:
                kind, limit = goal
                line += f"; goal {kind} <= {limit}: {'met' if row['goal']['met'] else 'MISSED'}"
            print(f"{op} T={t}: floor {row['floor_us']:.2f}us; {line}", flush=True)
    _unfused(rows)
    return rows


def _unfused(rows: list[dict[str, Any]]) -> None:
    """mhc_post_pre rows get the best mhc_post + best mhc_pre time at the same T (the boundary unfused)."""
    def best(op: str, t: int) -> float | None:
        row = next((r for r in rows if r["op"] == op and r["T"] == t), None)
        times = [u for i, u in (row or {}).get("us", {}).items() if not i.startswith("torch_reference")]
        return min(times) if times else None

    for r in rows:
        if r["op"] == "mhc_post_pre":
            parts = (best("mhc_post", r["T"]), best("mhc_pre", r["T"]))
            if None not in parts:
                r["unfused_post_plus_pre_us"] = parts[0] + parts[1]
                print(f"mhc_post_pre T={r['T']}: unfused mhc_post + mhc_pre {r['unfused_post_plus_pre_us']:.1f}us",
                      flush=True)
