"""FP8 e4m3 encode/decode and powers of two in integer arithmetic, shared by the Triton kernels: the GPU,
ROCm and the interpreter then give the same bits for e4m3fn and e4m3fnuz (the interpreter's fp8 cast does
not round to nearest even, and e4m3fnuz has no NVIDIA conversion)."""

from __future__ import annotations

import triton
import triton.language as tl


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
    return tl.where((x & 0x80) != 0, -mag, mag)
