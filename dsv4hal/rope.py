"""Interleaved-pair RoPE on the last 64 dims, and the (optionally YaRN-corrected) cos/sin table: the model's math,
shared by the references (`dsv4hal.reference.rope`) and the engine-shaped model (`dsv4hal.engine_model`).

DSV4 rotates pairs (x[D-64+2i], x[D-64+2i+1]) as the complex number re + i*im by angle pos*freq_i
(GPT-J / complex layout, spec 1.3). The table is the model's business (base and YaRN differ per layer),
so ops that rotate take cos/sin tables [max_pos, 32] as inputs and index them by position.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

ROPE_DIM = 64
ROPE_PAIRS = ROPE_DIM // 2


@dataclass(frozen=True)
class YarnConfig:
    """YaRN frequency correction (HF `rope_scaling`); original_max_pos == 0 disables it."""

    factor: float
    beta_fast: float
    beta_slow: float
    original_max_pos: int


# DSV4 checkpoint values (spec 1.1): factor 16, beta_fast 32, beta_slow 1, original 65536.
DSV4_YARN = YarnConfig(factor=16.0, beta_fast=32.0, beta_slow=1.0, original_max_pos=65536)


def _correction_dim(num_rotations: float, base: float, original_max_pos: int) -> float:
    """The (fractional) frequency index whose wavelength fits `num_rotations` times into the original context."""
    return ROPE_DIM * math.log(original_max_pos / (num_rotations * 2 * math.pi)) / (2 * math.log(base))


def _yarn_smooth(base: float, yarn: YarnConfig) -> torch.Tensor:
    """Per-pair blend weight: 1 keeps the original frequency (fast dims), 0 takes freq/factor (slow dims)."""
    low = max(math.floor(_correction_dim(yarn.beta_fast, base, yarn.original_max_pos)), 0)
    high = min(math.ceil(_correction_dim(yarn.beta_slow, base, yarn.original_max_pos)), ROPE_DIM - 1)
    if low == high:  # avoid a zero-width ramp
        high += 0.001
    ramp = ((torch.arange(ROPE_PAIRS, dtype=torch.float64) - low) / (high - low)).clamp(0.0, 1.0)
    return 1.0 - ramp


def rope_frequencies(base: float, yarn: YarnConfig | None = None) -> torch.Tensor:
    """float64 [32] angular frequencies 1/base^(2i/64), YaRN-blended when yarn.original_max_pos > 0."""
    if base <= 0:
        raise ValueError(f"rope base must be positive, got {base}")
    freqs = 1.0 / base ** (torch.arange(0, ROPE_DIM, 2, dtype=torch.float64) / ROPE_DIM)
    if yarn is not None and yarn.original_max_pos > 0:
        smooth = _yarn_smooth(base, yarn)
        freqs = freqs / yarn.factor * (1 - smooth) + freqs * smooth
    return freqs


def make_rope_table(
    max_pos: int, base: float, yarn: YarnConfig | None = None, device: torch.device | str = "cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin), each float32 [max_pos, 32]. Angles are formed in float64 and rounded once, so the
    table is the correctly rounded value even at positions near 1M (an fp32 outer product is not)."""
    if max_pos < 0:
        raise ValueError(f"max_pos must be >= 0, got {max_pos}")
    angles = torch.outer(torch.arange(max_pos, dtype=torch.float64), rope_frequencies(base, yarn))
    return angles.cos().to(device, torch.float32), angles.sin().to(device, torch.float32)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, inverse: bool = False) -> torch.Tensor:
    """Rotate the last 64 dims of x [..., D] pairwise; cos/sin [..., 32] broadcast against x[..., :32].

    inverse=True rotates by the conjugate (undoes the forward rotation). Math in fp32; returns x's dtype."""
    d = x.shape[-1]
    if d < ROPE_DIM or cos.shape[-1] != ROPE_PAIRS or sin.shape[-1] != ROPE_PAIRS:
        raise ValueError(f"apply_rope needs x[..., >=64] and cos/sin[..., 32], got {x.shape}, {cos.shape}, {sin.shape}")
    pairs = x[..., d - ROPE_DIM :].float().unflatten(-1, (ROPE_PAIRS, 2))
    re, im = pairs[..., 0], pairs[..., 1]
    c, s = cos.float(), sin.float()
    if inverse:
        s = -s
    rotated = torch.stack((re * c - im * s, re * s + im * c), dim=-1).flatten(-2)
    nope = x[..., : d - ROPE_DIM].float().expand(*rotated.shape[:-1], d - ROPE_DIM)
    return torch.cat((nope, rotated), dim=-1).to(x.dtype)


def table_positions(positions: torch.Tensor, cos: torch.Tensor) -> torch.Tensor:
    """int64 positions clamped into the table's rows [0, max_pos): what unchecked mode does with a position outside
    the table (checked mode refuses it), so that no row outside the table is ever indexed."""
    return positions.long().clamp(0, max(cos.shape[0] - 1, 0))


def table_rows(cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin) rows [N, 32] at positions clamped into the table; an empty table rotates by nothing (cos 1,
    sin 0): a call with rows and an empty table passes only unchecked mode, and the kernels do the same."""
    if cos.shape[0] == 0:
        shape = (positions.shape[0], cos.shape[1])
        return (torch.ones(shape, dtype=cos.dtype, device=cos.device),
                torch.zeros(shape, dtype=sin.dtype, device=sin.device))
    rows = table_positions(positions, cos)
    return cos[rows], sin[rows]
