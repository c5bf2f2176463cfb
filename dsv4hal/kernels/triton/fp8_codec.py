"""FP8 e4m3 encode/decode and powers of two in integer arithmetic, shared by the Triton kernels: the GPU,
ROCm and the interpreter then give the same bits for e4m3fn and e4m3fnuz (the interpreter's fp8 cast does
not round to nearest even, and e4m3fnuz has no NVIDIA conversion).

The integer encoder costs ~25 instructions a value, which bounds pack_store on the H200 (its sm_90 compile:
~954 warp instructions a token, about the 30 us measured at 32K tokens). NVIDIA GPUs from SM89 on convert fp32
to e4m3fn in hardware (cvt.rn.satfinite: round to nearest even, saturating, the rule the encoder implements for
the in-range values the kernels pass it), so there `fp8_bits(..., HW=True)` uses the conversion; e4m3fnuz, ROCm
and the interpreter keep the encoder."""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

HARDWARE_FP8_CAST = True  # off: the integer encoder everywhere (the bytes are the same; only the speed differs)
# read once, as Triton does when kernels are defined: hardware_fp8 runs on every pack_store call
_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


@functools.cache
def _hardware_cast_on(device_type: str, index: int | None) -> bool:
    if device_type != "cuda" or torch.version.hip is not None:
        return False
    return torch.cuda.get_device_capability(index) >= (8, 9)


def hardware_fp8(device: torch.device) -> bool:
    """The HW argument of fp8_bits for a kernel running on `device` (e4m3fn only; fnuz ignores it)."""
    if not HARDWARE_FP8_CAST or _INTERPRET:
        return False
    return _hardware_cast_on(device.type, device.index)


@triton.jit
def _pow2(e):
    """2**e as fp32 for integer tensors e in [-126, 127], built from the exponent bits (exact)."""
    return ((e + 127) << 23).to(tl.float32, bitcast=True)


@triton.jit
def _encode_fp8(y, FNUZ: tl.constexpr):
    """fp32 within +-FP8_MAX -> uint8 e4m3 bits, round to nearest even, in integer arithmetic so that
    the GPU, ROCm and the interpreter give the same bytes. e4m3fn: bias 7; e4m3fnuz: bias 8, no -0."""
    BIAS: tl.constexpr = 8 if FNUZ else 7
    bits = y.to(tl.int32, bitcast=True)
    a = tl.abs(y)
    e = tl.maximum(((a.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127, 1 - BIAS)  # binade, subnormals share
    v = a * _pow2(3 - e)  # in [0, 16): mantissa units of this binade, exact
    q = ((v + 8388608.0) - 8388608.0).to(tl.int32)  # round half to even through the fp32 adder
    carry = q >= 16
    e = tl.where(carry, e + 1, e)
    q = tl.where(carry, 8, q)
    normal = q >= 8
    field = tl.where(normal, ((e + BIAS) << 3) | (q - 8), q)
    neg = bits < 0
    if FNUZ:
        neg = neg & (field != 0)
    return (field | tl.where(neg, 0x80, 0)).to(tl.uint8)


@triton.jit
def _decode_fp8(b, FNUZ: tl.constexpr):
    BIAS: tl.constexpr = 8 if FNUZ else 7
    x = b.to(tl.int32)
    ex = (x >> 3) & 0xF
    man = x & 7
    mag = tl.where(ex == 0, man.to(tl.float32) * _pow2(ex * 0 - BIAS - 2),
                   (man + 8).to(tl.float32) * _pow2(ex - BIAS - 3))
    # the sign as a bit, not a negation: the sm_90 compile of `-mag` is 0 - mag, which turns byte 0x80 (-0) into +0
    # (measured on the H200: dequant_gather then differed from the reference's bits for tiny negative keys)
    return (mag.to(tl.int32, bitcast=True) | ((x & 0x80) << 24)).to(tl.float32, bitcast=True)


@triton.jit
def fp8_bits(y, FNUZ: tl.constexpr, HW: tl.constexpr):
    """fp32 within +-FP8_MAX, or NaN -> uint8 e4m3 bits (round to nearest even; NaN to the format's NaN): the
    hardware conversion where HW (see hardware_fp8), else the integer encoder."""
    if HW and not FNUZ:
        return y.to(tl.float8e4nv).to(tl.uint8, bitcast=True)
    else:  # a NaN gets the format's NaN, as the hardware cast gives it (e4m3fn 0x7F; e4m3fnuz has 0x80 only)
        return tl.where(y != y, 0x80 if FNUZ else 0x7F, _encode_fp8(y, FNUZ)).to(tl.uint8)
