"""FP8 block-scaled linear benchmark (`dsv4hal bench linear`): every fp8_linear kernel at V4-Flash's projection
shapes, side by side with a bf16 torch.mm of the same shape (the projection without FP8 weights). Floor: the
weight, input and output bytes at copy bandwidth; at T = 4096 the TFLOP/s are what the card's FP8 tensor cores
reach in a dense GEMM (DeepGEMM's, where installed): the peak an FP8 MoE is set against."""

from __future__ import annotations

from typing import Any

import torch

from dsv4hal.bench.common import bound_op, candidates
from dsv4hal.bench.timing import graph_us

# (name, N, K): V4-Flash's FP8 projections (spec 5.1; hidden 4096, q_lora 1024, 64 heads of 512, 8 groups of 1024)
SHAPES = (("wq_a", 1024, 4096), ("wq_b", 32768, 1024), ("wkv", 512, 4096), ("wo_b", 4096, 8192),
          ("wq_idx", 8192, 1024))
TOKENS = (1, 64, 4096)
QUICK = (("wq_b", 32768, 1024), ("wo_b", 4096, 8192))


def run(platform: Any, ceilings: dict[str, float], quick: bool = False) -> list[dict[str, Any]]:
    import dsv4hal

    gen = torch.Generator(device="cuda").manual_seed(3)
    rows = []
    for name, n, k in QUICK if quick else SHAPES:
        w = torch.randn(n, k, device="cuda", generator=gen) * k ** -0.5
        weight, scale = dsv4hal.quantize_fp8_block(w, platform.info.fp8)
        w16 = w.bfloat16()
        for t in TOKENS:
            x = torch.randn(t, k, device="cuda", generator=gen).bfloat16()
            case = platform.ops.fp8_linear.case_of(x, weight, scale)
            row: dict[str, Any] = {"shape": name, "N": n, "K": k, "T": t, "us": {}}
            for impl in candidates(platform, "fp8_linear", case=case):
                op = bound_op(platform, "fp8_linear", impl, validate=False)
                row["us"][impl] = graph_us(lambda op=op, x=x, w=weight, s=scale: op(x, w, s))
            row["bf16_mm_us"] = graph_us(lambda x=x, w=w16: x @ w.T)
            nbytes = n * k + scale.numel() * 4 + 2 * t * (k + n)
            row["floor_us"] = nbytes / ceilings["copy_bytes_per_s"] * 1e6
            row["tflops"] = {i: 2 * t * n * k / (us * 1e-6) / 1e12 for i, us in row["us"].items()}
            rows.append(row)
            print(f"fp8_linear {name} T={t}: " + ", ".join(f"{i} {u:.1f}us" for i, u in row["us"].items())
                  + f"; bf16 mm {row['bf16_mm_us']:.1f}us; floor {row['floor_us']:.1f}us", flush=True)
    return rows
