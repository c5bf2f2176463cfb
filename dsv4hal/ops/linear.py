"""Op contract: `fp8_linear` (spec 5.1: the FP8 block-scaled dense projections, wq_a, wq_b, wkv, wo_b, the
indexer's wq_b, the shared expert; DeepGEMM's `fp8_gemm_nt` with its SM90 recipe (1, 128, 128)).

fp8_linear(x, weight, weight_scale) -> bf16 [T, N]
    x: bf16 [T, K] (T >= 0), unit stride along K;
    weight: float8_e4m3fn [N, K] (float8_e4m3fnuz on gfx942, ROCm's flavour), N >= 1, unit stride along K: the
        checkpoint's [out_features, in_features] bytes, value = fp8 * scale;
    weight_scale: fp32 [ceil(N/128), K/128], one scale per 128x128 block (the last block row may be partial:
        N need not be a multiple of 128); dsv4hal.quantize_fp8_block(w) makes both;
    K a positive multiple of 128; all on one device.
The activations are quantized per token per 128 columns in the weight's FP8 flavour (DeepGEMM's 1x128 groups, the
rule of dsv4hal.formats.fp8_block.act_quant_1x128 and of the MoE's activation quantizer):
    amax[t, b] = max(max_{k in b} |x[t, k]|, 1e-4) in fp32; sx[t, b] = amax / FP8_MAX (one IEEE fp32 division;
    FP8_MAX 448 for e4m3fn, 240 for e4m3fnuz); xq[t, k] = fp8(clamp(x[t, k] / sx[t, b], +-FP8_MAX)) (IEEE fp32
    division, round to nearest even). Then, with wq the weight's values and sw its block scales,
    out[t, n] = bf16(sum over k-blocks b of (sum_{k in b} xq[t, k] * wq[n, k]) * sx[t, b] * sw[n // 128, b]).
The quantization is exact (every kernel makes the same codes and scales); kernels differ from the exact sums only
in how they add the products (fp32 sums in any order; Hopper's FP8 MMA keeps about 14 bits inside a 128-block).
The conformance bound (dsv4hal.conformance.cases_linear.TOLERANCE) is one bf16 rounding of the output, 2^-8
relative, plus 2^-10 of sum_k |term_k| for the sums.
A non-finite element of x makes its token's output row NaN. Checked mode refuses non-finite x and weight_scale
(a device sync); nothing is indexed by values, so unchecked mode reads nothing outside the arguments either way.
"""

from __future__ import annotations

import torch

from dsv4hal.checks import check_alloc, check_finite, check_tensor, describe
from dsv4hal.errors import InvalidArgumentError
from dsv4hal.formats.fp8 import FP8_FLAVOR_OF
from dsv4hal.formats.fp8_block import BLOCK
from dsv4hal.ops.moe import token_class
from dsv4hal.ops.signatures import define

OP = "fp8_linear"
WEIGHT_DTYPES = tuple(FP8_FLAVOR_OF)


def _check_weight(weight: object, device: torch.device) -> torch.Tensor:
    if isinstance(weight, torch.Tensor) and weight.dtype not in WEIGHT_DTYPES:
        remedy = ("view the checkpoint's bytes as FP8: weight.view(torch.float8_e4m3fn)"
                  if weight.dtype in (torch.uint8, torch.int8)
                  else "quantize the weight with dsv4hal.quantize_fp8_block(w) -> (weight, weight_scale)")
        raise InvalidArgumentError(OP, "weight", "dtype " + " or ".join(map(str, WEIGHT_DTYPES)), describe(weight),
                                   remedy=remedy)
    return check_tensor(OP, "weight", weight, shape=(None, None), device=device, unit_stride=True)


def validate(x: object, weight: object, weight_scale: object, *, checked: bool = False) -> None:
    """Raise InvalidArgumentError unless the arguments meet the fp8_linear contract (module docstring)."""
    x = check_tensor(OP, "x", x, dtype=torch.bfloat16, shape=(None, None), unit_stride=True)
    t, k = x.shape
    if k == 0 or k % BLOCK:
        raise InvalidArgumentError(OP, "x", f"K = x.shape[1] a positive multiple of {BLOCK} (1x{BLOCK} activation "
                                   f"groups, {BLOCK}x{BLOCK} weight blocks)", f"K = {k}",
                                   remedy=f"pad x and the weight with zero columns up to a multiple of {BLOCK} "
                                          "(zero columns add nothing)")
    weight = _check_weight(weight, x.device)
    n = weight.shape[0]
    if weight.shape[1] != k or n == 0:
        raise InvalidArgumentError(OP, "weight", f"shape [N >= 1, {k}] (K = x.shape[1])", describe(weight),
                                   remedy="pass the projection's [out_features, in_features] weight, not its "
                                          "transpose")
    blocks = (-(-n // BLOCK), k // BLOCK)
    scale = check_tensor(OP, "weight_scale", weight_scale, dtype=torch.float32, device=x.device)
    if tuple(scale.shape) != blocks:
        raise InvalidArgumentError(OP, "weight_scale", f"shape [{blocks[0]}, {blocks[1]}] (one scale per "
                                   f"{BLOCK}x{BLOCK} block of the [{n}, {k}] weight)", describe(scale),
                                   remedy="dsv4hal.quantize_fp8_block(w) returns the weight with its block scales")
    check_alloc(OP, "x (output size)", t * n * 2, x.device)
    if checked:
        check_finite(OP, "x", x)
        check_finite(OP, "weight_scale", scale)


def key(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor) -> tuple:
    """Everything the case reads, as one flat tuple (the case is computed from it)."""
    return weight.dtype, token_class(x.shape[0]), weight.shape[0] % BLOCK != 0


def case(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor) -> dict[str, object]:
    """Hashable features for kernel selection: the FP8 flavour, the token class (few <= 8 < decode <= 64 <
    prefill) and whether the last 128-row block of the weight is partial (N not a multiple of 128)."""
    dtype, tokens, partial = key(x, weight, weight_scale)
    return {"fp8": FP8_FLAVOR_OF.get(dtype, str(dtype)), "tokens": tokens, "partial_block": partial}


def fake(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor) -> torch.Tensor:
    return x.new_empty((x.shape[0], weight.shape[0]), dtype=torch.bfloat16)


@define(validate=validate, case=case, key=key, fake=fake)
def fp8_linear(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor) -> torch.Tensor:
    """x @ weight^T with FP8 128x128-block weights and FP8 1x128 activations (DeepGEMM's fp8_gemm_nt), bf16 out.

    Arguments:
        x: (T, K), torch.bfloat16, unit stride along K; K a positive multiple of 128; T may be 0.
        weight: (N, K), torch.float8_e4m3fn (or torch.float8_e4m3fnuz), on x's device, unit stride along K: the
            projection's [out_features, in_features] values.
        weight_scale: (ceil(N/128), K/128), torch.float32, on x's device: one scale per 128x128 block
            (value = fp8 * scale); dsv4hal.quantize_fp8_block(w) returns (weight, weight_scale).

    Returns:
        (T, N) torch.bfloat16: sum over 128-blocks b of (xq[t, b] . wq[n, b]) * sx[t, b] * sw[n // 128, b], fp32
        sums, where xq, sx are x quantized per token per 128 columns in the weight's FP8 flavour (scale
        max(amax, 1e-4) / FP8_MAX, IEEE divisions, round to nearest even).

    Rejected (InvalidArgumentError): other dtypes, ranks or devices, K not a positive multiple of 128, a weight
    whose K differs from x's or with no rows, a weight_scale of another shape, x's non-unit stride along K, an
    output too large for the device. Checked mode also refuses non-finite x or weight_scale.
    """
