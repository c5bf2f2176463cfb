"""FP8 block-scaled linear benchmark (`dsv4hal bench linear`): every fp8_linear kernel at V4-Flash's projection
shapes, side by side with a bf16 torch.mm of the same shape (the projection without FP8 weights), and every
fp8_grouped_linear kernel at V4-Flash's wo_a, side by side with DeepGEMM's fp8_einsum called directly on x quantized
beforehand (the GEMM alone, where DeepGEMM runs it: SM90) and with the bf16 torch.einsum of x and the dequantized
weight (what a model without the FP8 wo_a runs). Floor: the weight, input and output bytes at copy bandwidth; at
T = 4096 the TFLOP/s are what the card's FP8 tensor cores reach in a dense GEMM (DeepGEMM's, where installed): the
peak an FP8 MoE is set against."""

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
# (name, G, N, K): V4-Flash's grouped wo_a (spec 1.3: o [T, 64, 512] viewed as 8 groups of 4096, each to 1024);
# timed in the quick run too
GROUPED_SHAPES = (("wo_a", 8, 1024, 4096),)
EINSUM = "bhr,hdr->bhd"  # DeepGEMM's name of x [T, G, K] . weight [G, N, K] -> [T, G, N]
DIRECT = "deepgemm_fp8_einsum_direct"


def time_impls(platform: Any, op: str, args: tuple[torch.Tensor, ...]) -> dict[str, float]:
    """GPU microseconds of each kernel the platform offers for this call (the reference left out)."""
    case = platform.ops[op].case_of(*args)
    out = {}
    for impl in candidates(platform, op, case=case):
        bound = bound_op(platform, op, impl, validate=False)
        out[impl] = graph_us(lambda bound=bound: bound(*args))
    return out


def _direct_einsum(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor) -> tuple[float | None, str]:
    """(microseconds of deep_gemm.fp8_einsum alone, ''), or (None, why it was not timed). x is quantized before the
    timing (quantize_grouped_tokens: the scale layout DeepGEMM's SM90 path takes without a transform)."""
    try:
        import deep_gemm
    except Exception as exc:  # its import also sets up the JIT (CUDA home): any failure means no DeepGEMM
        return None, f"deep_gemm not importable: {type(exc).__name__}: {exc}"
    entry = getattr(deep_gemm, "fp8_einsum", None)
    if entry is None:
        return None, f"deep_gemm {getattr(deep_gemm, '__version__', '?')} has no fp8_einsum"
    if torch.cuda.get_device_capability()[0] != 9 or weight.dtype != torch.float8_e4m3fn:
        return None, "timed on SM90 with e4m3fn weights only (the (1, 128, 128) fp32-scale recipe)"
    from dsv4hal.kernels.triton.moe_quant import quantize_grouped_tokens

    codes, sfa = quantize_grouped_tokens(x)
    a = (codes.view(torch.float8_e4m3fn), sfa)
    b = (weight, scale.contiguous())
    out = torch.empty(*x.shape[:2], weight.shape[1], dtype=torch.bfloat16, device=x.device)
    return graph_us(lambda: entry(EINSUM, a, b, out)), ""


def _floor_us(weight_bytes: int, t: int, rows: int, k: int, n: int, ceilings: dict[str, float]) -> float:
    """The weight's bytes, x's ([t, rows, k] bf16) and the output's ([t, rows, n] bf16) at copy bandwidth."""
    return (weight_bytes + 2 * t * rows * (k + n)) / ceilings["copy_bytes_per_s"] * 1e6


def _linear_rows(platform: Any, ceilings: dict[str, float], quick: bool, gen: torch.Generator
                 ) -> list[dict[str, Any]]:
    import dsv4hal

    rows = []
    for name, n, k in QUICK if quick else SHAPES:
        w = torch.randn(n, k, device="cuda", generator=gen) * k ** -0.5
        weight, scale = dsv4hal.quantize_fp8_block(w, platform.info.fp8)
        w16 = w.bfloat16()
        for t in TOKENS:
            x = torch.randn(t, k, device="cuda", generator=gen).bfloat16()
            row: dict[str, Any] = {"op": "fp8_linear", "shape": name, "N": n, "K": k, "T": t,
                                   "us": time_impls(platform, "fp8_linear", (x, weight, scale))}
            row["bf16_mm_us"] = graph_us(lambda x=x, w=w16: x @ w.T)
            row["floor_us"] = _floor_us(n * k + scale.numel() * 4, t, 1, k, n, ceilings)
            row["tflops"] = {i: 2 * t * n * k / (us * 1e-6) / 1e12 for i, us in row["us"].items()}
            rows.append(row)
            print(f"fp8_linear {name} T={t}: " + ", ".join(f"{i} {u:.1f}us" for i, u in row["us"].items())
                  + f"; bf16 mm {row['bf16_mm_us']:.1f}us; floor {row['floor_us']:.1f}us", flush=True)
    return rows


def _grouped_rows(platform: Any, ceilings: dict[str, float], gen: torch.Generator) -> list[dict[str, Any]]:
    import dsv4hal
    from dsv4hal.formats.fp8_block import dequantize_fp8_block

    rows = []
    for name, g, n, k in GROUPED_SHAPES:
        w = torch.randn(g, n, k, device="cuda", generator=gen) * k ** -0.5
        weight, scale = dsv4hal.quantize_fp8_block(w, platform.info.fp8)
        w16 = dequantize_fp8_block(weight, scale).bfloat16()  # the bf16 weight a model without the FP8 wo_a holds
        for t in TOKENS:
            x = torch.randn(t, g, k, device="cuda", generator=gen).bfloat16()
            row: dict[str, Any] = {"op": "fp8_grouped_linear", "shape": name, "G": g, "N": n, "K": k, "T": t,
                                   "us": time_impls(platform, "fp8_grouped_linear", (x, weight, scale))}
            direct, why = _direct_einsum(x, weight, scale)
            if direct is not None:
                row["us"][DIRECT] = direct
            else:
                row["direct_skipped"] = why
            row["bf16_einsum_us"] = graph_us(lambda x=x, w=w16: torch.einsum("tgk,gnk->tgn", x, w))
            row["floor_us"] = _floor_us(g * n * k + scale.numel() * 4, t, g, k, n, ceilings)
            row["tflops"] = {i: 2 * t * g * n * k / (us * 1e-6) / 1e12 for i, us in row["us"].items()}
            rows.append(row)
            print(f"fp8_grouped_linear {name} G={g} T={t}: "
                  + ", ".join(f"{i} {u:.1f}us" for i, u in row["us"].items())
                  + f"; bf16 einsum {row['bf16_einsum_us']:.1f}us; floor {row['floor_us']:.1f}us", flush=True)
    return rows


def run(platform: Any, ceilings: dict[str, float], quick: bool = False) -> list[dict[str, Any]]:
    gen = torch.Generator(device="cuda").manual_seed(3)
    return _linear_rows(platform, ceilings, quick, gen) + _grouped_rows(platform, ceilings, gen)
