"""Routed expert weights as an engine passes them in (ExpertWeights), their formats, and the conversions
from and to fp32 master weights. The byte layouts are those of formats/mxfp4.py and formats/fp8_block.py."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from dsv4hal.checks import check_choice, check_tensor
from dsv4hal.formats.fp8 import FP8_FLAVORS
from dsv4hal.formats.fp8_block import dequantize_fp8_block, quantize_fp8_block
from dsv4hal.formats.mxfp4 import dequantize_mxfp4, quantize_mxfp4

ExpertFormat = Literal["mxfp4", "fp8_block"]
EXPERT_FORMATS: tuple[ExpertFormat, ...] = ("mxfp4", "fp8_block")


@dataclass
class ExpertWeights:
    """Routed expert weights of one layer; w13 stacks the gate (w1) rows above the up (w3) rows.

    mxfp4:     w13 uint8 [E, 2I, H/2], w13_scale uint8 [E, 2I, H/32], w2 uint8 [E, H, I/2], w2_scale uint8 [E, H, I/32]
    fp8_block: w13 fp8 [E, 2I, H], w13_scale fp32 [E, ceil(2I/128), ceil(H/128)],
               w2 fp8 [E, H, I], w2_scale fp32 [E, ceil(H/128), ceil(I/128)]
    `fp8` names the FP8 flavour of fp8_block weights (ignored for mxfp4)."""

    format: ExpertFormat
    w13: torch.Tensor
    w13_scale: torch.Tensor
    w2: torch.Tensor
    w2_scale: torch.Tensor
    fp8: str = "e4m3fn"

    @property
    def num_experts(self) -> int:
        return self.w13.shape[0]

    @property
    def hidden(self) -> int:
        return self.w2.shape[1]

    @property
    def intermediate(self) -> int:
        return self.w13.shape[1] // 2


def quantize_experts(
    w13: torch.Tensor, w2: torch.Tensor, format: ExpertFormat, fp8: str = "e4m3fn", *, pow2_scales: bool = False
) -> ExpertWeights:
    """fp32 master weights w13 [E, 2I, H], w2 [E, H, I] -> ExpertWeights in `format`.

    pow2_scales (fp8_block only) rounds block scales up to powers of two, the UE8M0 checkpoint variant."""
    check_choice("quantize_experts", "format", format, EXPERT_FORMATS)
    check_choice("quantize_experts", "fp8", fp8, FP8_FLAVORS)
    for name, w in (("w13", w13), ("w2", w2)):
        check_tensor("quantize_experts", name, w, shape=(None, None, None))
    if format == "mxfp4":
        w13_q, w13_s = quantize_mxfp4(w13)
        w2_q, w2_s = quantize_mxfp4(w2)
    else:
        w13_q, w13_s = quantize_fp8_block(w13, fp8=fp8, pow2_scales=pow2_scales)
        w2_q, w2_s = quantize_fp8_block(w2, fp8=fp8, pow2_scales=pow2_scales)
    return ExpertWeights(format, w13_q, w13_s, w2_q, w2_s, fp8)


def _dequantize(fmt: str, q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    if fmt == "mxfp4":
        return dequantize_mxfp4(q, scale)
    check_choice("dequantize_experts", "format", fmt, EXPERT_FORMATS)
    return dequantize_fp8_block(q, scale)


def dequantize_experts(ew: ExpertWeights) -> tuple[torch.Tensor, torch.Tensor]:
    """All experts -> (w13 fp32 [E, 2I, H], w2 fp32 [E, H, I]). Full-size layers need tens of GB: prefer
    dequantize_expert inside a loop there."""
    return _dequantize(ew.format, ew.w13, ew.w13_scale), _dequantize(ew.format, ew.w2, ew.w2_scale)


def dequantize_expert(ew: ExpertWeights, e: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One expert -> (w13 fp32 [2I, H], w2 fp32 [H, I])."""
    return _dequantize(ew.format, ew.w13[e], ew.w13_scale[e]), _dequantize(ew.format, ew.w2[e], ew.w2_scale[e])


def expert_nbytes(fmt: str, hidden: int, intermediate: int) -> int:
    """Bytes of one expert's weights and scales as stored (w13 [2I, H] and w2 [H, I]): what a decode step
    streams per expert it hits."""
    h, i = hidden, intermediate
    n = 3 * h * i
    if fmt == "mxfp4":
        return n // 2 + n // 32
    return n + 4 * (-(-2 * i // 128) * (h // 128) + (h // 128) * (i // 128))
