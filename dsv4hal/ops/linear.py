"""Op contracts: `fp8_linear` (spec 5.1: the FP8 block-scaled dense projections, wq_a, wq_b, wkv, wo_b, the
indexer's wq_b, the shared expert; DeepGEMM's `fp8_gemm_nt` with its SM90 recipe (1, 128, 128)) and
`fp8_grouped_linear` (spec 1.3: the grouped low-rank output projection wo_a; DeepGEMM's
`fp8_einsum("bhr,hdr->bhd")` with the same recipe).

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

fp8_grouped_linear(x, weight, weight_scale) -> bf16 [T, G, N]
    x: bf16 [T, G, K] (T >= 0, G >= 1), unit stride along K, other strides free (V4's attention output o [T, H, 512]
        viewed as [T, G, H/G*512], G = o_groups);
    weight: FP8 [G, N, K] (the flavours above), N >= 1, unit stride along K: the checkpoint's [G*N, K] wo_a viewed
        as [G, N, K];
    weight_scale: fp32 [G, ceil(N/128), K/128]; dsv4hal.quantize_fp8_block of a [G, N, K] tensor makes both.
    out[t, g, :] = fp8_linear(x[:, g, :], weight[g], weight_scale[g])[t]: each (token, group) row of x is quantized
    by fp8_linear's rule above (1x128 groups of that row, IEEE divisions), summed as fp8_linear sums, within the
    same conformance bound; a non-finite element of x makes its (token, group) output row NaN.
"""

from __future__ import annotations

import math

import torch

from dsv4hal.checks import check_alloc, check_finite, check_tensor, describe
from dsv4hal.errors import InvalidArgumentError
from dsv4hal.formats.fp8 import FP8_FLAVOR_OF
from dsv4hal.formats.fp8_block import BLOCK
from dsv4hal.ops.moe import token_class
from dsv4hal.ops.signatures import define

OP = "fp8_linear"
GROUPED_OP = "fp8_grouped_linear"
WEIGHT_DTYPES = tuple(FP8_FLAVOR_OF)


def _check_weight(op: str, weight: object, device: torch.device, rank: int) -> torch.Tensor:
    if isinstance(weight, torch.Tensor) and weight.dtype not in WEIGHT_DTYPES:
        remedy = ("view the checkpoint's bytes as FP8: weight.view(torch.float8_e4m3fn)"
                  if weight.dtype in (torch.uint8, torch.int8)
                  else "quantize the weight with dsv4hal.quantize_fp8_block(w) -> (weight, weight_scale)")
        raise InvalidArgumentError(op, "weight", "dtype " + " or ".join(map(str, WEIGHT_DTYPES)), describe(weight),
                                   remedy=remedy)
    return check_tensor(op, "weight", weight, shape=(None,) * rank, device=device, unit_stride=True)


def _validate(op: str, x: object, weight: object, weight_scale: object, checked: bool, grouped: bool) -> None:
    """Both contracts: x [T, (G,) K], weight [(G,) N, K], weight_scale [(G,) ceil(N/128), K/128]."""
    rank = 3 if grouped else 2
    x = check_tensor(op, "x", x, dtype=torch.bfloat16, shape=(None,) * rank, unit_stride=True)
    t, k = x.shape[0], x.shape[-1]
    groups = tuple(x.shape[1:-1])  # (G,) or ()
    if k == 0 or k % BLOCK:
        raise InvalidArgumentError(op, "x", f"K = x.shape[-1] a positive multiple of {BLOCK} (1x{BLOCK} activation "
                                   f"groups, {BLOCK}x{BLOCK} weight blocks)", f"K = {k}",
                                   remedy=f"pad x and the weight with zero columns up to a multiple of {BLOCK} "
                                          "(zero columns add nothing)")
    if groups == (0,):
        raise InvalidArgumentError(op, "x", "G = x.shape[1] >= 1 groups", describe(x),
                                   remedy="view the attention output as [T, G, K] with G = o_groups")
    weight = _check_weight(op, weight, x.device, rank)
    n = weight.shape[-2]
    if tuple(weight.shape[:-2]) != groups or weight.shape[-1] != k or n == 0:
        want = ", ".join([*map(str, groups), "N >= 1", str(k)])
        remedy = ("pass the projection's [out_features, in_features] weight, not its transpose" if not grouped else
                  f"pass the weight as [G, N, K]: the checkpoint's [G*N, K] wo_a viewed as w.view({groups[0]}, -1, "
                  f"{k}) (G = x.shape[1], K = x.shape[2])")
        raise InvalidArgumentError(op, "weight", f"shape [{want}] (K = x.shape[-1])", describe(weight), remedy=remedy)
    blocks = (*groups, -(-n // BLOCK), k // BLOCK)
    scale = check_tensor(op, "weight_scale", weight_scale, dtype=torch.float32, device=x.device)
    if tuple(scale.shape) != blocks:
        raise InvalidArgumentError(op, "weight_scale", f"shape [{', '.join(map(str, blocks))}] (one scale per "
                                   f"{BLOCK}x{BLOCK} block of the {list(weight.shape)} weight)", describe(scale),
                                   remedy="dsv4hal.quantize_fp8_block(w) returns the weight with its block scales"
                                          + (" (of a [G, N, K] w: per group)" if grouped else ""))
    check_alloc(op, "x (output size)", t * math.prod(groups) * n * 2, x.device)
    if checked:
        check_finite(op, "x", x)
        check_finite(op, "weight_scale", scale)


def validate(x: object, weight: object, weight_scale: object, *, checked: bool = False) -> None:
    """Raise InvalidArgumentError unless the arguments meet the fp8_linear contract (module docstring)."""
    _validate(OP, x, weight, weight_scale, checked, grouped=False)


def validate_grouped(x: object, weight: object, weight_scale: object, *, checked: bool = False) -> None:
    """Raise InvalidArgumentError unless the arguments meet the fp8_grouped_linear contract (module docstring)."""
    _validate(GROUPED_OP, x, weight, weight_scale, checked, grouped=True)


def key(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor) -> tuple:
    """Everything the case reads, as one flat tuple (the case is computed from it); both ops."""
    return weight.dtype, token_class(x.shape[0]), weight.shape[-2] % BLOCK != 0


def case(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor) -> dict[str, object]:
    """Hashable features for kernel selection (both ops): the FP8 flavour, the token class (few <= 8 < decode <= 64
    < prefill, of T) and whether the last 128-row block of the weight is partial (N not a multiple of 128)."""
    dtype, tokens, partial = key(x, weight, weight_scale)
    return {"fp8": FP8_FLAVOR_OF.get(dtype, str(dtype)), "tokens": tokens, "partial_block": partial}


def fake(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[-2]), dtype=torch.bfloat16)


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


@define(validate=validate_grouped, case=case, key=key, fake=fake)
def fp8_grouped_linear(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor) -> torch.Tensor:
    """einsum("tgk,gnk->tgn") with FP8 128x128-block weights per group and FP8 1x128 activations: fp8_linear of
    each group (DeepGEMM's fp8_einsum("bhr,hdr->bhd")), bf16 out. V4's wo_a: x = o.view(T, G, H/G*512).

    Arguments:
        x: (T, G, K), torch.bfloat16, unit stride along K (other strides free); K a positive multiple of 128;
            T may be 0, G >= 1.
        weight: (G, N, K), torch.float8_e4m3fn (or torch.float8_e4m3fnuz), on x's device, unit stride along K:
            group g's [out_features, in_features] values (the checkpoint's [G*N, K] wo_a viewed as [G, N, K]).
        weight_scale: (G, ceil(N/128), K/128), torch.float32, on x's device: one scale per 128x128 block of each
            group (value = fp8 * scale); dsv4hal.quantize_fp8_block(w) of a [G, N, K] w returns both.

    Returns:
        (T, G, N) torch.bfloat16: out[:, g] = fp8_linear(x[:, g], weight[g], weight_scale[g]), fp8_linear's
        quantization, sums and conformance bound.

    Rejected (InvalidArgumentError): what fp8_linear rejects, per group, and G = 0 or a weight or weight_scale
    whose G differs from x's. Checked mode also refuses non-finite x or weight_scale.
    """
