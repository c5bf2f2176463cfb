"""Pure-PyTorch `fp8_linear` (contract in dsv4hal.ops.linear): x quantized 1x128 in the weight's FP8 flavour by
dsv4hal.formats.fp8_block.act_quant_1x128 (the contract's rule, torch's IEEE fp32 divisions and round-to-nearest-even
casts), both operands dequantized to fp32, one fp32 matmul, bf16 out. Also runs on CUDA tensors."""

from __future__ import annotations

import torch

from dsv4hal.formats.fp8 import FP8_FLAVOR_OF
from dsv4hal.formats.fp8_block import act_dequant_1x128, act_quant_1x128, dequantize_fp8_block


def fp8_linear(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor) -> torch.Tensor:
    """bf16 [T, N] = dequant(quant_1x128(x)) @ dequant(weight, weight_scale)^T, fp32 accumulation."""
    xq, sx = act_quant_1x128(x, FP8_FLAVOR_OF[weight.dtype])
    return (act_dequant_1x128(xq, sx) @ dequantize_fp8_block(weight, weight_scale).T).to(torch.bfloat16)
