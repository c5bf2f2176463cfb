"""MXFP4: the routed-expert weight format of the DSV4 Instruct checkpoints (spec 5.1).

Layout along the reduction dim K of a weight [..., K]:
  * values are e2m1 codes packed two a byte, the low nibble holding the even element, the high nibble the odd one;
    a code is sign bit 0x8 | magnitude index into E2M1_VALUES (0, .5, 1, 1.5, 2, 3, 4, 6);
  * one UE8M0 scale byte per 32 consecutive K elements (value = code * 2**(byte - 127)).

Quantization follows the DSV4 writers (spec 2.3): per-32 exponent = ceil(log2(max(amax, 1e-4) / 6)), so the group's
largest magnitude lands in [3, 6] and never saturates; codes go to the nearest value with ties rounding down
(thresholds {0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0}, strict >); a value that rounds to 0 is +0 (no -0 code).

e2m1 has no NaN, so a group holding NaN or infinity gets scale byte 0xFF, which the OCP MX spec defines as NaN
for E8M0; dequantize_mxfp4 turns such groups into NaN rather than silently into numbers.
"""

from __future__ import annotations

import torch

from dsv4hal.errors import InvalidArgumentError
from dsv4hal.formats.fp8 import pow2_ceil_exponent, ue8m0_decode, ue8m0_encode_exponent

GROUP = 32  # K elements sharing one scale byte
E2M1_MAX = 6.0
AMAX_FLOOR = 1e-4
SIGN_BIT = 0x8
NAN_SCALE_BYTE = 0xFF  # E8M0 NaN (OCP MX); never produced for finite input (max exponent byte is 253)

# Magnitudes indexed by the 3 low bits of a code.
E2M1_VALUES: tuple[float, ...] = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
# Midpoints between neighbouring magnitudes; magnitude index = number of thresholds strictly below |v|.
E2M1_THRESHOLDS: tuple[float, ...] = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)


def _check_k(k: int, what: str) -> None:
    if k % GROUP != 0:
        raise InvalidArgumentError("mxfp4", what, f"a last dim that is a multiple of {GROUP} (one scale a 32-group)",
                                   f"{k}", remedy=f"pad K to a multiple of {GROUP} first")


def e2m1_codes(v: torch.Tensor) -> torch.Tensor:
    """Scaled values (|v| <= 6 expected, larger saturates to 6) -> 4-bit codes as uint8, nearest with ties down."""
    thresholds = torch.tensor(E2M1_THRESHOLDS, dtype=torch.float32, device=v.device)
    # bucketize (right=False) counts the thresholds strictly below |v|: exactly the tie-down rule.
    mag = torch.bucketize(v.abs(), thresholds).to(torch.uint8)
    negative = (v < 0) & (mag != 0)  # zero magnitude always encodes +0
    return mag | (negative.to(torch.uint8) * SIGN_BIT)


def _signed_table(device: torch.device) -> torch.Tensor:
    """Value of each of the 16 codes: magnitudes, then their negatives (code 0x8 decodes to 0, never -0)."""
    mag = torch.tensor(E2M1_VALUES, dtype=torch.float32, device=device)
    return torch.cat((mag, -mag)) + 0.0  # + 0.0 turns -0 into +0


def e2m1_decode(codes: torch.Tensor) -> torch.Tensor:
    """4-bit codes (uint8, high bits ignored) -> float32 values."""
    return _signed_table(codes.device)[(codes & 0xF).long()]


def _byte_table(device: torch.device) -> torch.Tensor:
    """[256, 2]: the (even, odd) element values of every packed byte, so decoding is a single gather."""
    table = _signed_table(device)
    byte = torch.arange(256, device=device)
    return torch.stack((table[byte & 0xF], table[byte >> 4]), dim=-1)


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """[..., K] codes -> [..., K/2] bytes, even element in the low nibble."""
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """[..., K/2] bytes -> [..., K] codes (inverse of pack_nibbles)."""
    return torch.stack((packed & 0xF, packed >> 4), dim=-1).flatten(-2)


def quantize_mxfp4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w float [..., K] -> (packed uint8 [..., K/2], scale_exp uint8 [..., K/32])."""
    k = w.shape[-1]
    _check_k(k, "w")
    groups = w.to(torch.float32).reshape(*w.shape[:-1], k // GROUP, GROUP)
    amax = groups.abs().amax(dim=-1)
    finite = torch.isfinite(amax)  # amax propagates NaN and is inf iff the group holds one
    safe_amax = torch.where(finite, amax, torch.ones_like(amax)).clamp_min(AMAX_FLOOR)
    exponent = pow2_ceil_exponent(safe_amax / E2M1_MAX)
    # Dividing by a power of two is exact, so the thresholds act on the true scaled value.
    scaled = groups * torch.exp2(-exponent.to(torch.float32)).unsqueeze(-1)
    codes = e2m1_codes(scaled).reshape(w.shape)
    scale = ue8m0_encode_exponent(exponent)
    scale = torch.where(finite, scale, torch.full_like(scale, NAN_SCALE_BYTE))
    return pack_nibbles(codes), scale


def dequantize_mxfp4(packed: torch.Tensor, scale_exp: torch.Tensor) -> torch.Tensor:
    """(packed uint8 [..., K/2], scale_exp uint8 [..., K/32]) -> float32 [..., K]."""
    if packed.dtype != torch.uint8 or scale_exp.dtype != torch.uint8:
        raise InvalidArgumentError("dequantize_mxfp4", "packed, scale_exp", "uint8 bytes and scales",
                                   f"{packed.dtype} and {scale_exp.dtype}")
    k = packed.shape[-1] * 2
    _check_k(k, "the unpacked weight")
    if tuple(scale_exp.shape) != (*packed.shape[:-1], k // GROUP):
        raise InvalidArgumentError("dequantize_mxfp4", "scale_exp", f"scale shape {(*packed.shape[:-1], k // GROUP)} "
                                   f"(packed shape {tuple(packed.shape)})", f"{tuple(scale_exp.shape)}")
    values = _byte_table(packed.device)[packed.long()].reshape(*packed.shape[:-1], k // GROUP, GROUP)
    scale = ue8m0_decode(scale_exp)
    scale = torch.where(scale_exp == NAN_SCALE_BYTE, torch.full_like(scale, float("nan")), scale)
    return (values * scale.unsqueeze(-1)).reshape(*packed.shape[:-1], k)
