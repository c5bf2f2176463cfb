"""FP8 flavours and UE8M0 power-of-two scales.

e4m3fn (NVIDIA, gfx950) saturates at 448; e4m3fnuz (gfx942) has exponent bias 8, no negative
zero and saturates at 240. The same bit pattern means half the value in e4m3fnuz, except the
special codes: 0x80 is -0 in e4m3fn and NaN in e4m3fnuz; 0x7F/0xFF is NaN in e4m3fn, +-240 in e4m3fnuz.
"""

from __future__ import annotations

from typing import Literal

import torch

from dsv4hal.errors import InvalidArgumentError

FP8Flavor = Literal["e4m3fn", "e4m3fnuz"]
FP8_FLAVORS: tuple[FP8Flavor, ...] = ("e4m3fn", "e4m3fnuz")

FP8_DTYPE: dict[str, torch.dtype] = {"e4m3fn": torch.float8_e4m3fn, "e4m3fnuz": torch.float8_e4m3fnuz}
FP8_FLAVOR_OF: dict[torch.dtype, FP8Flavor] = {torch.float8_e4m3fn: "e4m3fn", torch.float8_e4m3fnuz: "e4m3fnuz"}
# Saturation bound used when quantizing (the spec's decision: torch.finfo max for both flavours).
FP8_MAX: dict[str, float] = {"e4m3fn": 448.0, "e4m3fnuz": 240.0}

UE8M0_BIAS = 127


def amax_scale(amax: torch.Tensor, flavor: str) -> torch.Tensor:
    """amax / FP8_MAX[flavor] as one IEEE fp32 division on every device. Divided by a tensor, not a Python float:
    CUDA turns division by a scalar into multiplication by its rounded reciprocal, which changes the last bit of
    some scales (and then the codes, and the power of two a scale rounds up to)."""
    amax = amax.float()
    return amax / torch.full_like(amax, FP8_MAX[flavor])


def fp8_dtype(flavor: str) -> torch.dtype:
    dtype = FP8_DTYPE.get(flavor) if isinstance(flavor, str) else None
    if dtype is None:
        raise InvalidArgumentError("fp8_dtype", "flavor", "one of " + ", ".join(map(repr, FP8_FLAVORS)), repr(flavor))
    return dtype


def ue8m0_decode(exp_byte: torch.Tensor) -> torch.Tensor:
    """UE8M0 byte e -> float32 scale 2**(e - 127)."""
    return torch.exp2(exp_byte.to(torch.float32) - UE8M0_BIAS)


def ue8m0_encode_exponent(exponent: torch.Tensor) -> torch.Tensor:
    """Integer power-of-two exponent -> UE8M0 byte (uint8)."""
    return (exponent.to(torch.int32) + UE8M0_BIAS).clamp(0, 255).to(torch.uint8)


def pow2_ceil_exponent(x: torch.Tensor) -> torch.Tensor:
    """Smallest integer e with 2**e >= x, for x > 0 (float32), computed exactly from the bit pattern."""
    x = x.to(torch.float32)
    mantissa, exponent = torch.frexp(x)  # x = mantissa * 2**exponent, mantissa in [0.5, 1)
    # x is an exact power of two iff mantissa == 0.5, then ceil(log2 x) = exponent - 1
    return torch.where(mantissa == 0.5, exponent - 1, exponent).to(torch.int32)


def fp8_to_float(raw: torch.Tensor, flavor: str) -> torch.Tensor:
    """Reinterpret uint8 bytes as FP8 of `flavor` and widen to float32."""
    return raw.view(fp8_dtype(flavor)).to(torch.float32)


def float_to_fp8_bytes(x: torch.Tensor, flavor: str) -> torch.Tensor:
    """Round-to-nearest-even cast to FP8 after clamping to +-FP8_MAX; returns uint8 bytes."""
    m = FP8_MAX[flavor]
    return x.to(torch.float32).clamp(-m, m).to(fp8_dtype(flavor)).view(torch.uint8)
