"""MoE benchmark, V4-Flash routed experts (E 256, H 4096, I 2048, top-6), every moe_experts kernel of the platform
side by side on the same routing, in one run:

  * MXFP4 weights: Marlin W4A16, the Triton fused MoE, and a bf16 baseline (weights dequantized to bf16 once, a
    per-expert loop of torch matmuls: the reference's algorithm, host-synchronising, timed eagerly);
  * FP8 128x128-block weights: DeepGEMM's grouped GEMM and the Triton fused MoE.

Decode (T <= 64) is judged by the expert-weight bytes streamed per second (each distinct routed expert read once)
against the copy bandwidth measured in the same run; prefill by TFLOP/s against the measured bf16 GEMM peak, and
the FP8 paths against DeepGEMM's grouped GEMM and against the dense FP8 GEMM timed in the same run. Every row has its
roofline too: the slower of its weight bytes at copy bandwidth and its FLOPs at the compute peak (FP8's for FP8
weights, bf16's for MXFP4, whose activations stay bf16); at T = 4096 the FP8 experts' 6.4 GB of weights bound the
time more than their FLOPs do on Hopper. Routing: k distinct uniformly random experts per token."""

from __future__ import annotations

from typing import Any

import torch

from dsv4hal.bench import linear as linear_shapes
from dsv4hal.bench.common import bound_op, candidates
from dsv4hal.bench.timing import eager_us, graph_us
from dsv4hal.conformance.cases_moe import _expert_weights, _experts_params
from dsv4hal.ops.moe import case_expert_weights
from dsv4hal.reference.moe import dequantize_expert, expert_nbytes, per_expert_sum, swiglu_mlp

SHAPE = "flash"
TOKENS = (1, 8, 16, 32, 64, 512, 4096)  # 16 and 32: where MXFP4 decode crosses from Marlin to triton_kernels
QUICK_TOKENS = (1, 8, 16, 32, 64, 4096)  # every decode size of TOKENS (the MXFP4 kernels change there), one prefill
EP_TOKENS = (64, 4096)  # expert-parallel inputs: these token counts again with a share of routes dropped
EP_DROPPED = (0.5, 0.9)
BASELINE = "torch_bf16_loop"
# (T, N, K) of the dense FP8 GEMM timed as the FP8 peak: V4-Flash's wo_b (bench linear's shape) at 4096 tokens
DENSE_FP8 = (4096, *next((n, k) for name, n, k in linear_shapes.SHAPES if name == "wo_b"))


def _bf16_experts(weights: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [tuple(w.to(torch.bfloat16) for w in dequantize_expert(weights, e)) for e in range(weights.num_experts)]


def _bf16_loop(x: torch.Tensor, ids: torch.Tensor, tw: torch.Tensor, experts: list) -> torch.Tensor:
    """The reference's per-expert loop on weights dequantized to bf16 once, bf16 matmuls."""
    return per_expert_sum(x, ids, tw, lambda e, rows: swiglu_mlp(rows, *experts[e], 10.0))


def _fp8_dense_tflops(platform: Any, gen: torch.Generator) -> tuple[float | None, str | None]:
    """(TFLOP/s, kernel) of the fastest fp8_linear kernel in a dense GEMM of V4-Flash's wo_b at T = 4096
    (DeepGEMM's where installed): the card's FP8 peak an FP8 MoE is set against, measured in this run; (None, None)
    where the platform runs no fp8_linear kernel (the rows then take the bf16 peak)."""
    import dsv4hal

    t, n, k = DENSE_FP8
    weight, scale = dsv4hal.quantize_fp8_block(torch.randn(n, k, device="cuda", generator=gen) * k ** -0.5,
                                               platform.info.fp8)
    x = torch.randn(t, k, device="cuda", generator=gen).bfloat16()
    us = linear_shapes.time_impls(platform, "fp8_linear", (x, weight, scale))
    if not us:
        return None, None
    best = min(us, key=us.__getitem__)
    return 2 * t * n * k / us[best] / 1e6, best


def _rooflines(row: dict[str, Any], copy_bytes_per_s: float, compute_tflops: float | None) -> None:
    """The row's roofline: the slower of streaming its experts' weights at copy bandwidth and its FLOPs at the
    compute peak (the weights alone where that peak was not measured), and each kernel's share of it (1.0: at the
    roofline)."""
    compute_us = 0.0 if compute_tflops is None else row["flop"] / compute_tflops / 1e6
    row["roofline_us"] = max(row["weight_bytes"] / copy_bytes_per_s * 1e6, compute_us)
    row["x_roofline"] = {n: row["roofline_us"] / u for n, u in row["us"].items() if n != BASELINE}


def run(platform: Any, ceilings: dict[str, float], quick: bool = False) -> list[dict[str, Any]]:
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows: list[dict[str, Any]] = []
    for fmt in ("mxfp4", "fp8_block"):
        dense = dense_kernel = None
        if fmt == "fp8_block":
            dense, dense_kernel = _fp8_dense_tflops(platform, gen)
            if dense is not None:
                print(f"moe fp8_block: dense FP8 GEMM {dense:.1f} TFLOP/s ({dense_kernel}, wo_b T=4096)", flush=True)
        p = _experts_params(SHAPE, 1, fmt)
        e, h, i, k = p["E"], p["H"], p["I"], p["top_k"]
        weights = _expert_weights(p, torch.device("cuda"), gen)
        impls = {}
        for name in candidates(platform, "moe_experts", case=case_expert_weights(weights)):  # decode-class case
            op = bound_op(platform, "moe_experts", name)
            try:
                impls[name] = (op, op.prepare_weights(weights))
            except Exception as exc:  # recorded, the other kernels still run
                print(f"moe {fmt}: {name} skipped: {type(exc).__name__}: {str(exc).splitlines()[0]}", flush=True)
        baseline = _bf16_experts(weights) if fmt == "mxfp4" else None
        cases = [(t, 0.0) for t in (QUICK_TOKENS if quick else TOKENS)]
        cases += [(t, d) for t in ((4096,) if quick else EP_TOKENS) for d in EP_DROPPED]
        for t, dropped in cases:
            x = torch.randn(t, h, device="cuda", generator=gen).to(torch.bfloat16)
            ids = torch.rand(t, e, device="cuda", generator=gen).argsort(1)[:, :k].to(torch.int32)
            if dropped:  # expert parallelism: routes to experts of other ranks arrive as id -1
                ids = torch.where(torch.rand(t, k, device="cuda", generator=gen) < dropped, -1, ids)
            tw = torch.rand(t, k, device="cuda", generator=gen) + 0.5
            row: dict[str, Any] = {"format": fmt, "T": t, "E": e, "H": h, "I": i, "top_k": k, "dropped": dropped,
                                   "kept_routes": int((ids >= 0).sum()), "us": {}}
            for name, (op, prepared) in impls.items():
                try:
                    row["us"][name] = graph_us(lambda op=op, w=prepared, a=(x, ids, tw): op(*a, w), inner=5, reps=15)
                except Exception as exc:
                    row.setdefault("errors", {})[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
            if baseline is not None and not dropped:
                row["us"][BASELINE] = eager_us(lambda a=(x, ids, tw), b=baseline: _bf16_loop(*a, b), reps=3)
            active = int(torch.unique(ids[ids >= 0]).numel())
            row["active_experts"] = active
            row["weight_bytes"] = active * expert_nbytes(fmt, h, i)
            row["flop"] = 2 * row["kept_routes"] * 3 * h * i
            row["weight_GBps"] = {n: row["weight_bytes"] / u / 1e3 for n, u in row["us"].items() if n != BASELINE}
            row["x_copy_bw"] = {n: g * 1e9 / ceilings["copy_bytes_per_s"] for n, g in row["weight_GBps"].items()}
            row["tflops"] = {n: row["flop"] / u / 1e6 for n, u in row["us"].items()}
            row["x_bf16_peak"] = {n: tf / ceilings["bf16_tflops"] for n, tf in row["tflops"].items()}
            if dense is not None:  # FP8 weights and activations: the FP8 tensor cores' peak, measured above
                row.update(fp8_dense_tflops=dense, fp8_dense_kernel=dense_kernel,
                           x_fp8_dense={n: tf / dense for n, tf in row["tflops"].items()})
            # MXFP4 activations stay bf16: the bf16 peak; FP8 the dense FP8 GEMM's (none where it was not timed)
            _rooflines(row, ceilings["copy_bytes_per_s"], dense if fmt == "fp8_block" else ceilings["bf16_tflops"])
            if "deepgemm_fp8_sm90" in row["us"]:
                dg = row["us"]["deepgemm_fp8_sm90"]
                row["x_deepgemm"] = {n: dg / u for n, u in row["us"].items()}
            rows.append(row)
            if dropped:  # the goal: dropped routes cost nothing beyond reading their ids
                full = next(r for r in rows if r["format"] == fmt and r["T"] == t and not r["dropped"])
                row["x_time_of_undropped"] = {n: u / full["us"][n] for n, u in row["us"].items() if n in full["us"]}
            print(f"moe {fmt} T={t}{f' dropped {dropped:.0%}' if dropped else ''} ({active} experts): " + ", ".join(
                f"{n} {u:.1f}us ({row['x_copy_bw'].get(n, 0):.2f} copy, {row['x_bf16_peak'][n]:.2f} peak)"
                for n, u in row["us"].items()), flush=True)
        del impls, weights
        baseline = None
        torch.cuda.empty_cache()
    return rows
