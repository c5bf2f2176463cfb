"""Conformance catalog of `fp8_linear` and `fp8_grouped_linear` (contracts in dsv4hal.ops.linear).

The oracle follows the contract's formula in float64, independently of the library's quantizers: per token and
128-group, amax (floored at fp32(1e-4)), sx = amax / FP8_MAX rounded once to fp32 (a float64 quotient of two fp32
numbers rounded to fp32 is the correctly rounded fp32 quotient), xq = fp8(clamp(fp32(x / sx))); the weight's codes
and scales as stored; then the exact sum over blocks of (xq . wq) * sx * sw, and the sum of |terms| the tolerance
scales with. The grouped op's oracle is that oracle group by group, under the same bound; its NaN cases expect NaN
exactly on the (token, group) rows holding a NaN. The GPU-only cases are DeepSeek-V4-Flash's projections (hidden
4096, q_lora 1024, 64 heads of 512, 8 output groups of 1024) at decode and prefill batch sizes."""

from __future__ import annotations

from typing import Any

import torch

from dsv4hal.conformance.types import CaseSpec, Fixture, Tolerance, compare_close
from dsv4hal.formats.fp8 import FP8_MAX, fp8_dtype
from dsv4hal.formats.fp8_block import AMAX_FLOOR, BLOCK, quantize_fp8_block

OP = "fp8_linear"
GROUPED_OP = "fp8_grouped_linear"
# kernels differ from the contract's exact sums only by how they add the products (fp32 sums in any order; Hopper's
# FP8 tensor-core MMA accumulates a 128-block with ~14 bits, truncating): the output's one bf16 rounding is 2^-8
# relative at most, the sums' error is bounded by SUM_SLACK * sum |terms|. On an H100 DeepGEMM's fp8_gemm_nt and
# triton_fp8_linear give the same outputs, whose worst error (T 33, N 256, K 384, outlier activations) is 1.19
# times the bound with a 2^-12 slack: the slack is four times that. fp32 sums on a CPU stay far inside it.
TOLERANCE = Tolerance(0.0, 2.0**-8, "one bf16 rounding of the output (2^-8 relative) plus 2^-10 of sum_k |x_k w_k| "
                                    "for the sums (orders; Hopper's FP8 MMA keeps ~14 bits inside a 128-block)")
SUM_SLACK = 2.0**-10
KINDS = ("random", "zeros", "outliers", "tiny", "huge")


def _case(name: str, t: int, n: int, k: int, fp8: str = "e4m3fn", kind: str = "random", gpu_only: bool = False
          ) -> CaseSpec:
    return CaseSpec(op=OP, name=name, params={"t": t, "n": n, "k": k, "fp8": fp8, "kind": kind}, gpu_only=gpu_only)


CASES: list[CaseSpec] = [
    _case("t1_n256_k512", 1, 256, 512),
    _case("t0_n128_k256", 0, 128, 256),
    _case("t5_n384_k256", 5, 384, 256),
    _case("t7_n1000_k384_partial_block", 7, 1000, 384),
    _case("t16_n256_k256_zeros", 16, 256, 256, kind="zeros"),
    _case("t33_n256_k384_outliers", 33, 256, 384, kind="outliers"),
    _case("t70_n200_k256_prefill", 70, 200, 256),
    _case("t3_n130_k128_tiny", 3, 130, 128, kind="tiny"),
    _case("t4_n256_k256_huge", 4, 256, 256, kind="huge"),
    _case("e4m3fnuz_t5_n256_k256", 5, 256, 256, fp8="e4m3fnuz"),
    _case("e4m3fnuz_t9_n136_k256_outliers", 9, 136, 256, fp8="e4m3fnuz", kind="outliers"),
]
# V4-Flash: wq_a [1024, 4096], wkv [512, 4096], wq_b [32768, 1024], wo_b [4096, 8192], shared expert w13 [4096, 4096]
for _name, _n, _k in (("wq_a", 1024, 4096), ("wkv", 512, 4096), ("wq_b", 32768, 1024), ("wo_b", 4096, 8192)):
    for _t in (1, 64):
        CASES.append(_case(f"flash_{_name}_t{_t}", _t, _n, _k, gpu_only=True))
CASES += [_case("flash_shared_w13_t4096", 4096, 4096, 4096, gpu_only=True),
          _case("flash_wkv_t2048", 2048, 512, 4096, gpu_only=True)]

# (token, group, column) of x set to NaN in the nan cases: two (token, group) rows, one token's other groups clean
NAN_AT = ((1, 3, 5), (4, 0, 200))


def _grouped_case(name: str, t: int, g: int, n: int, k: int, fp8: str = "e4m3fn", kind: str = "random",
                  nan: bool = False, gpu_only: bool = False) -> CaseSpec:
    params = {"t": t, "g": g, "n": n, "k": k, "fp8": fp8, "kind": kind, "nan_at": NAN_AT if nan else ()}
    return CaseSpec(op=GROUPED_OP, name=name, params=params, gpu_only=gpu_only)


CASES_GROUPED: list[CaseSpec] = [
    _grouped_case("g1_t5_n256_k512", 5, 1, 256, 512),
    _grouped_case("g8_t0_n128_k256", 0, 8, 128, 256),
    _grouped_case("g8_t1_n256_k256", 1, 8, 256, 256),
    _grouped_case("g8_t5_n200_k384_partial_block", 5, 8, 200, 384),
    _grouped_case("g8_t64_n128_k256_outliers", 64, 8, 128, 256, kind="outliers"),
    _grouped_case("g2_t5_n128_k4096", 5, 2, 128, 4096),
    _grouped_case("g8_t5_n128_k256_zeros", 5, 8, 128, 256, kind="zeros"),
    _grouped_case("g8_t5_n256_k256_nan", 5, 8, 256, 256, nan=True),
    _grouped_case("e4m3fnuz_g8_t5_n256_k256", 5, 8, 256, 256, fp8="e4m3fnuz"),
    _grouped_case("e4m3fnuz_g8_t9_n136_k256_outliers_nan", 9, 8, 136, 256, fp8="e4m3fnuz", kind="outliers",
                  nan=True),
]
# V4-Flash's wo_a: o [T, 64, 512] viewed as 8 groups of 4096, each projected to 1024
for _t in (1, 64, 4096):
    CASES_GROUPED.append(_grouped_case(f"flash_wo_a_t{_t}", _t, 8, 1024, 4096, gpu_only=True))


# ---------------------------------------------------------------- inputs

def _activations(t: int, k: int, kind: str, gen: torch.Generator) -> torch.Tensor:
    x = torch.randn(t, k, generator=gen) * torch.exp(torch.randn(t, 1, generator=gen))  # row magnitudes over ~e^+-2
    if kind == "zeros":  # whole zero rows and zero 128-groups: amax hits the 1e-4 floor, codes 0
        x[::3] = 0.0
        x[:, BLOCK:2 * BLOCK] = 0.0
    elif kind == "outliers":  # one element a row 300x the rest: its group's other values reach FP8 subnormals
        col = torch.randint(0, k, (t,), generator=gen)
        x[torch.arange(t), col] *= 300.0
    elif kind == "tiny":  # below the floor: codes are FP8 subnormals and zeros
        x = x * 1e-7
    elif kind == "huge":
        x = x * 3e4
    elif kind != "random":
        raise ValueError(f"unknown activation kind {kind!r}; one of {KINDS}")
    return x.to(torch.bfloat16)


def _weight(n: int, k: int, fp8: str, gen: torch.Generator, lead: tuple[int, ...] = ()
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """Gaussian rows over sqrt(K), each 128x128 block at its own magnitude (scales that differ block to block);
    [*lead, N, K] (a grouped weight: lead = (G,)), quantized with its scales [*lead, ceil(N/128), K/128]."""
    nb, kb = -(-n // BLOCK), k // BLOCK
    gain = torch.exp(0.5 * torch.randn(*lead, nb, kb, generator=gen)).repeat_interleave(BLOCK, -2)[..., :n, :]
    w = torch.randn(*lead, n, k, generator=gen) / k ** 0.5 * gain.repeat_interleave(BLOCK, -1)
    return quantize_fp8_block(w, fp8)


# ---------------------------------------------------------------- oracle

def contract_codes(x: torch.Tensor, fp8: str) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, K] -> (the contract's code values float64 [T, K/128, 128], scales float64 [T, K/128]), in float64."""
    t, k = x.shape
    g = x.to(torch.float64).reshape(t, k // BLOCK, BLOCK)
    floor = float(torch.tensor(AMAX_FLOOR, dtype=torch.float32))
    sx = (g.abs().amax(-1).clamp_min(floor) / FP8_MAX[fp8]).to(torch.float32).to(torch.float64)
    q = (g / sx[..., None]).to(torch.float32).clamp(-FP8_MAX[fp8], FP8_MAX[fp8]).to(fp8_dtype(fp8))
    return q.to(torch.float64), sx


def oracle(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, fp8: str
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """(the contract's exact output float64 [T, N], sum_k |term_k| float64 [T, N]), block by block on x's device."""
    (t, k), n = x.shape, weight.shape[0]
    q, sx = contract_codes(x, fp8)
    w = weight.to(torch.float64).reshape(n, k // BLOCK, BLOCK)
    sw = weight_scale.to(torch.float64).repeat_interleave(BLOCK, 0)[:n]  # [N, K/128]
    out = torch.zeros(t, n, dtype=torch.float64, device=x.device)
    mag = torch.zeros_like(out)
    for b in range(k // BLOCK):
        scale = sx[:, b, None] * sw[None, :, b]
        out += (q[:, b] @ w[:, b].T) * scale
        mag += (q[:, b].abs() @ w[:, b].abs().T) * scale
    return out, mag


def grouped_oracle(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, fp8: str
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """oracle group by group: (float64 [T, G, N], sum_k |term_k| float64 [T, G, N])."""
    pairs = [oracle(x[:, g], weight[g], weight_scale[g], fp8) for g in range(weight.shape[0])]
    return torch.stack([p[0] for p in pairs], 1), torch.stack([p[1] for p in pairs], 1)


def within_bound(got: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, fp8: str
                 ) -> str:
    """'' when got (bf16, either op's shape) is within the conformance bound of the contract's exact result, else
    why."""
    want, mag = (oracle if x.dim() == 2 else grouped_oracle)(x, weight, weight_scale, fp8)
    if got.dtype != torch.bfloat16:
        return f"dtype {got.dtype}, not torch.bfloat16"
    _, ok, detail = compare_close(got, want, TOLERANCE, slack=SUM_SLACK * mag)
    return "" if ok else detail


def compare_nan_rows(got: Any, expected: torch.Tensor, slack: torch.Tensor) -> tuple[float, bool, str]:
    """NaN exactly on the oracle's NaN rows (a (token, group) row of x holding a NaN), the bound elsewhere."""
    want_nan, got_nan = expected.isnan().cpu(), got.detach().isnan().cpu()
    if not torch.equal(want_nan, got_nan):
        return float("nan"), False, (f"{int(got_nan.sum())} NaNs at rows {got_nan.any(-1).nonzero().tolist()}, "
                                     f"expected every element of rows {want_nan.any(-1).nonzero().tolist()} and "
                                     "nothing else")
    keep = ~want_nan
    return compare_close(got[keep.to(got.device)], expected[keep.to(expected.device)], TOLERANCE,
                         slack=slack[keep.to(slack.device)])


def _build_grouped(p: dict[str, Any], device: torch.device, gen: torch.Generator) -> Fixture:
    t, g, n, k = p["t"], p["g"], p["n"], p["k"]
    x = _activations(t * g, k, p["kind"], gen).view(t, g, k).to(device)
    for tok, grp, col in p["nan_at"]:
        x[tok, grp, col] = float("nan")
    weight, scale = (a.to(device) for a in _weight(n, k, p["fp8"], gen, lead=(g,)))
    expected, mag = grouped_oracle(x, weight, scale, p["fp8"])
    slack = SUM_SLACK * mag
    return Fixture(args={"x": x, "weight": weight, "weight_scale": scale}, expected=expected,
                   compare=lambda got, want: compare_nan_rows(got, want, slack), tolerance=TOLERANCE)


def build(spec: CaseSpec, device: torch.device, gen: torch.Generator) -> Fixture:
    p = spec.params
    if spec.op == GROUPED_OP:
        return _build_grouped(dict(p), device, gen)
    x = _activations(p["t"], p["k"], p["kind"], gen).to(device)
    weight, scale = (a.to(device) for a in _weight(p["n"], p["k"], p["fp8"], gen))
    expected, mag = oracle(x, weight, scale, p["fp8"])
    slack = SUM_SLACK * mag
    return Fixture(args={"x": x, "weight": weight, "weight_scale": scale}, expected=expected,
                   compare=lambda got, want: compare_close(got, want, TOLERANCE, slack=slack), tolerance=TOLERANCE)
