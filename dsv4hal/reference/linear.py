"""Pure-PyTorch `fp8_linear` and `fp8_grouped_linear` (contracts in dsv4hal.ops.linear): x quantized 1x128 in the
weight's FP8 flavour by dsv4hal.formats.fp8_block.act_quant_1x128 (the contract's rule, torch's IEEE fp32 divisions
and round-to-nearest-even casts), both operands dequantized, the products summed in float64 (exact to far below the
output's rounding on every device: an fp32 matmul on a GPU may run on TF32 tensor cores), one rounding to bf16; the
grouped op is fp8_linear group by group. Also runs on CUDA tensors."""

from __future__ import annotations

import torch

from dsv4hal.formats.fp8 import FP8_FLAVOR_OF
from dsv4hal.formats.fp8_block import act_dequant_1x128, act_quant_1x128, dequantize_fp8_block


def fp8_linear(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor) -> torch.Tensor:
    """bf16 [T, N] = dequant(quant_1x128(x)) @ dequant(weight, weight_scale)^T, float64 accumulation."""
    xq, sx = act_quant_1x128(x, FP8_FLAVOR_OF[weight.dtype])
    a = act_dequant_1x128(xq, sx).double()
    return (a @ dequantize_fp8_block(weight, weight_scale).double().T).to(torch.bfloat16)


def fp8_grouped_linear(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor) -> torch.Tensor:
    """bf16 [T, G, N]: fp8_linear of each group, out[:, g] = fp8_linear(x[:, g], weight[g], weight_scale[g])."""
    return torch.stack([fp8_linear(x[:, g], weight[g], weight_scale[g]) for g in range(weight.shape[0])], dim=1)
