"""FP8 e4m3 with block scales (spec 5.1): 128x128 weight blocks and the 1x128 per-token activation recipe.

A weight [..., N, K] holds one fp32 scale per 128x128 tile: scale [..., ceil(N/128), ceil(K/128)] and
value = fp8 * scale. Scale = max(amax, 1e-4) / FP8_MAX, so the tile's largest magnitude maps onto FP8_MAX;
pow2_scales rounds it up to a power of two (the checkpoints' `scale_fmt: ue8m0` variant, also what SM100
DeepGEMM wants). Edge tiles are partial; their amax covers only the real elements.

Activations use DeepGEMM's SM90 recipe: one fp32 scale per token per 128 consecutive K (a 1x128 block).
"""

from __future__ import annotations

import torch

from dsv4hal.checks import check_choice, describe
from dsv4hal.errors import InvalidArgumentError
from dsv4hal.formats.fp8 import FP8_FLAVORS, FP8_MAX, amax_scale, fp8_dtype, pow2_ceil_exponent

BLOCK = 128
AMAX_FLOOR = 1e-4
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e4m3fnuz, torch.float8_e5m2, torch.float8_e5m2fnuz)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _pad_to_blocks(w: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """Zero-pad the last two dims up to multiples of (rows, cols); zeros never raise a tile's amax."""
    n, k = w.shape[-2:]
    pad_n, pad_k = _ceil_div(n, rows) * rows - n, _ceil_div(k, cols) * cols - k
    if pad_n or pad_k:
        w = torch.nn.functional.pad(w, (0, pad_k, 0, pad_n))
    return w


def _expand_scales(scale: torch.Tensor, rows: int, cols: int, n: int, k: int) -> torch.Tensor:
    """[..., nb, kb] tile scales -> [..., n, k] per-element scales."""
    full = scale.repeat_interleave(rows, dim=-2).repeat_interleave(cols, dim=-1)
    return full[..., :n, :k]


def _block_scales(w: torch.Tensor, rows: int, cols: int, fp8: str, pow2_scales: bool) -> torch.Tensor:
    """Per-tile scale = max(amax, floor) / FP8_MAX (optionally rounded up to 2**e). NaN in a tile stays NaN."""
    padded = _pad_to_blocks(w, rows, cols)
    *lead, n_pad, k_pad = padded.shape
    tiles = padded.reshape(*lead, n_pad // rows, rows, k_pad // cols, cols)
    amax = tiles.abs().amax(dim=(-3, -1))
    scale = amax_scale(torch.clamp(amax, min=AMAX_FLOOR), fp8)  # clamp propagates NaN
    if pow2_scales:
        pow2 = torch.exp2(pow2_ceil_exponent(scale).to(torch.float32))
        scale = torch.where(torch.isnan(scale), scale, pow2)
    return scale


def _quantize(w: torch.Tensor, rows: int, cols: int, fp8: str, pow2_scales: bool, op: str, name: str
              ) -> tuple[torch.Tensor, torch.Tensor]:
    if not isinstance(w, torch.Tensor) or not w.is_floating_point() or w.dtype in FP8_DTYPES:
        raise InvalidArgumentError(op, name, "a float32, bfloat16 or float16 tensor", describe(w),
                                   remedy="pass the unquantized values (an FP8 tensor is quantized already)")
    if w.dim() < 2:
        raise InvalidArgumentError(op, name, "a tensor of rank >= 2", f"shape {tuple(w.shape)}")
    check_choice(op, "fp8", fp8, FP8_FLAVORS)
    w = w.to(torch.float32)
    scale = _block_scales(w, rows, cols, fp8, pow2_scales)
    n, k = w.shape[-2:]
    limit = FP8_MAX[fp8]
    q = (w / _expand_scales(scale, rows, cols, n, k)).clamp(-limit, limit).to(fp8_dtype(fp8))
    return q, scale


def _dequantize(q: torch.Tensor, scale: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    n, k = q.shape[-2:]
    want = (*q.shape[:-2], _ceil_div(n, rows), _ceil_div(k, cols))
    if tuple(scale.shape) != want:
        raise InvalidArgumentError("dequantize_fp8_block", "scale", f"scale shape {want} (values {tuple(q.shape)} in "
                                   f"{rows}x{cols} blocks)", f"{tuple(scale.shape)}")
    return q.to(torch.float32) * _expand_scales(scale.to(torch.float32), rows, cols, n, k)


def quantize_fp8_block(
    w: torch.Tensor, fp8: str = "e4m3fn", block: int = BLOCK, pow2_scales: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """w float [..., N, K] -> (fp8 [..., N, K] in torch's fp8 dtype, fp32 scale [..., ceil(N/block), ceil(K/block)]).

    The weights of fp8_linear (and of FP8 experts): value = fp8 * scale, scale = max(tile amax, 1e-4) / FP8_MAX per
    block x block tile (448 for e4m3fn, 240 for e4m3fnuz), rounded up to a power of two with pow2_scales."""
    if not isinstance(block, int) or isinstance(block, bool) or block < 1:
        raise InvalidArgumentError("quantize_fp8_block", "block", "a positive int", repr(block))
    return _quantize(w, block, block, fp8, pow2_scales, "quantize_fp8_block", "w")


def dequantize_fp8_block(w_fp8: torch.Tensor, scale: torch.Tensor, block: int = BLOCK) -> torch.Tensor:
    """Inverse of quantize_fp8_block: fp8 [..., N, K] with scale [..., ceil(N/block), ceil(K/block)] -> fp32."""
    return _dequantize(w_fp8, scale, block, block)


def act_quant_1x128(
    x: torch.Tensor, fp8: str = "e4m3fn", pow2_scales: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token activation quantization: x [T, K] -> (fp8 [T, K], fp32 scales [T, ceil(K/128)])."""
    return act_quant_groups(x, BLOCK, fp8, pow2_scales, op="act_quant_1x128")


def act_quant_groups(x: torch.Tensor, group: int, fp8: str = "e4m3fn", pow2_scales: bool = False, *,
                     op: str = "act_quant_groups") -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token activation quantization in groups of `group` columns: x [T, K] -> (fp8 [T, K], fp32 scales
    [T, ceil(K/group)]), each scale max(group amax, 1e-4) / FP8_MAX (rounded up to a power of two with
    pow2_scales)."""
    if x.dim() != 2:
        raise InvalidArgumentError(op, "x", "shape [T, K]", f"{tuple(x.shape)}")
    return _quantize(x, 1, group, fp8, pow2_scales, op, "x")


def act_dequant_1x128(x_fp8: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Inverse of act_quant_1x128: fp8 [T, K] with scales [T, ceil(K/128)] -> fp32 [T, K]."""
    return _dequantize(x_fp8, scale, 1, BLOCK)
