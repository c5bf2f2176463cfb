"""The MXFP4 element layout of layout triton-moe-v2 and its in-register decode, shared by the fused MoE's row and
swapped kernels: packed e2m1 bytes are read as 16-bit elements (element e of a row holds k = 4e .. 4e + 3: byte 2e
k = 4e in its low nibble and 4e + 1 in its high one, byte 2e + 1 k = 4e + 2 and 4e + 3; reorder_mxfp4 moves the
bits into the MX_BITS order), decoded into four bf16 operands, one per k mod 4, each dotted with the
activations' matching quarter (_dot_quarters). On NVIDIA GPUs inline PTX decodes two elements a register
(_mx_decode_ptx); elsewhere (ROCm, the interpreter) plain Triton gives the same values. Each output depends on its own
element and scale only, so the decode holds in whatever register layout the compiler chooses."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# The MXFP4 element layout: a 16-bit element holds the e2m1 codes of k = 4e + j (j = 0..3), code j's magnitude
# bits (e1 e0 m) at MX_BITS[j][0] .. + 2 and its sign at MX_BITS[j][1]. The decode places them at bf16 bits 6..8 and
# 15 with one shift when the two offsets agree (j = 0: none, j = 1: 3), two shifts else: 11 integer instructions for
# four bf16x2 registers on sm_90a (5 shifts, 6 LOP3), the fewest of any such order (the byte order, nibble j at bits
# 4j, needs 15; tests/test_triton_mx_decode.py searches them all).
MX_BITS = ((6, 15), (3, 12), (0, 13), (9, 14))
# Scale bytes up to this value let the PTX multiply once, by 2**(s - 1) (a normal bf16); larger bytes (scales above
# 2, and NaN) take a second multiply. prepare_weights records which.
MX_NARROW_SCALE_MAX = 128


def reorder_mxfp4(packed: torch.Tensor) -> torch.Tensor:
    """Packed e2m1 bytes [..., K/2] (two codes a byte, low nibble first) -> the same shape with each 16-bit element's
    bits in the MX_BITS order, a new tensor. One expert at a time, so the int32 scratch stays small."""
    out = torch.empty_like(packed)
    src = packed.view(torch.int16)
    src = src.reshape(-1, *src.shape[-2:])  # [experts, rows, elements]
    dst = out.view(torch.int16).reshape(src.shape)
    for i in range(src.shape[0]):
        u = src[i].to(torch.int32) & 0xFFFF
        v = torch.zeros_like(u)
        for j, (magnitude, sign) in enumerate(MX_BITS):
            code = u >> (4 * j)
            v |= ((code & 7) << magnitude) | (((code >> 3) & 1) << sign)
        dst[i] = (v - ((v & 0x8000) << 1)).to(torch.int16)
    return out


@triton.jit
def _e2m1(c):
    """4-bit e2m1 codes (int32) -> fp32: magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6; bit 3 is the sign. In integer
    bits, so that -0 stays -0 (a float negation compiles to 0 - v on NVIDIA, which gives +0)."""
    m = c & 7
    ex = m >> 1
    mant = m & 1
    magnitude = tl.where(ex == 0, mant * 0x3F000000, ((ex + 126) << 23) | (mant << 22))  # 0x3F000000: 0.5
    return (magnitude | ((c & 8) << 28)).to(tl.float32, bitcast=True)


@triton.jit
def _ue8m0(s):
    """UE8M0 bytes (int32) -> 2**(s - 127) from the exponent bits, exactly (0 is the subnormal 2**-127, which a GPU
    that flushes fp32 subnormals multiplies as 0); 0xFF is NaN (OCP MX)."""
    bits = tl.where(s == 0, 0x400000, tl.where(s == 255, 0x7FC00000, s << 23))
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _dot_quarters(acc, a, b):
    """acc + the sum over j of a[j] @ b[j]: the four operands of k mod 4 (tuples of four tiles)."""
    acc = tl.dot(a[0], b[0], acc)
    acc = tl.dot(a[1], b[1], acc)
    acc = tl.dot(a[2], b[2], acc)
    return tl.dot(a[3], b[3], acc)


def _mx_decode_ptx(narrow: bool) -> str:
    """Inline PTX for _mx_quarters, built from MX_BITS: $4 holds two 16-bit elements, one per bf16 lane; output j
    (a bf16x2 register) is code j of each, placed as bf16 bits (sign 15, e1 e0 m 8..6) by shifting the whole
    register (no lane's bits cross into the other's kept bits) and masking. Those bits read as the bf16 2**-126
    times the e2m1 value (e > 0: 2**(e - 127) * (1 + m / 2); e = 0: the subnormal m * 2**-127). Narrow multiplies
    once, by $5 = 2**(s - 1) (each lane's, a normal bf16 for scale bytes s <= 128); else by 2**126, then by $5 = the
    scale 2**(s - 127). Every product is exact (subnormals kept); fma with -0 added keeps the sign of a zero
    (fma.bf16x2 needs sm_80, mul.bf16x2 sm_90)."""
    lines = ["{", ".reg .b32 t, u, f, nz;", "mov.b32 nz, 0x80008000;", "mov.b32 f, 0x7E807E80;"]  # f: 2**126

    def shifted(dst: str, shift: int) -> str:  # dst = $4 moved left by shift (right if negative)
        if shift == 0:
            return f"mov.b32 {dst}, $4;"
        return f"shl.b32 {dst}, $4, {shift};" if shift > 0 else f"shr.b32 {dst}, $4, {-shift};"

    for j, (magnitude, sign) in enumerate(MX_BITS):
        body, sgn = 6 - magnitude, 15 - sign
        if body == sgn:
            lines += [shifted("t", body), "and.b32 t, t, 0x81C081C0;"]
        else:
            lines += [shifted("t", body), "and.b32 t, t, 0x01C001C0;", shifted("u", sgn),
                      "and.b32 u, u, 0x80008000;", "or.b32 t, t, u;"]
        if narrow:
            lines.append(f"fma.rn.bf16x2 ${j}, t, $5, nz;")
        else:
            lines += ["fma.rn.bf16x2 t, t, f, nz;", f"fma.rn.bf16x2 ${j}, t, $5, nz;"]
    return "\n".join(lines + ["}"])


_MX_PTX_NARROW = tl.constexpr(_mx_decode_ptx(True))
_MX_PTX_WIDE = tl.constexpr(_mx_decode_ptx(False))
_MX_MAG0, _MX_SIGN0 = tl.constexpr(MX_BITS[0][0]), tl.constexpr(MX_BITS[0][1])
_MX_MAG1, _MX_SIGN1 = tl.constexpr(MX_BITS[1][0]), tl.constexpr(MX_BITS[1][1])
_MX_MAG2, _MX_SIGN2 = tl.constexpr(MX_BITS[2][0]), tl.constexpr(MX_BITS[2][1])
_MX_MAG3, _MX_SIGN3 = tl.constexpr(MX_BITS[3][0]), tl.constexpr(MX_BITS[3][1])


@triton.jit
def _mx_scale_bf16(s):
    """UE8M0 bytes -> 2**(s - 127) as bf16 (exact: 0 is the subnormal 2**-127, 255 NaN)."""
    s = s.to(tl.int32)
    bits = tl.where(s == 0, 0x40, tl.where(s == 255, 0x7FC0, s << 7))
    return bits.to(tl.int16).to(tl.bfloat16, bitcast=True)


@triton.jit
def _mx_scale_operand(s, ASM: tl.constexpr, NARROW: tl.constexpr):
    """UE8M0 bytes -> the scale operand _mx_quarters takes: bf16 2**(s - 1) (narrow PTX: s <= 128, its exponent
    field s + 126), bf16 2**(s - 127) (wide PTX) or the fp32 2**(s - 127) (plain)."""
    if ASM:
        if NARROW:
            m = ((s.to(tl.int32) + 126) << 7).to(tl.int16).to(tl.bfloat16, bitcast=True)
        else:
            m = _mx_scale_bf16(s)
    else:
        m = _ue8m0(s.to(tl.int32))
    return m


@triton.jit
def _mx_code(b, MAG: tl.constexpr, SIGN: tl.constexpr):
    """The e2m1 code (sign at bit 3) stored at magnitude bits MAG .. MAG + 2 and sign bit SIGN of elements b."""
    return ((b >> MAG) & 7) | (((b >> SIGN) & 1) << 3)


@triton.jit
def _mx_quarters(q, m, ASM: tl.constexpr, NARROW: tl.constexpr, DTYPE: tl.constexpr):
    """16-bit elements q (four e2m1 codes each, MX_BITS order) and their scale operands m (_mx_scale_operand), any
    shape and layout -> the four codes' values times the scale, exact in bf16 (DTYPE: bf16, or fp32 for the
    interpreter's dot)."""
    if ASM:
        v0, v1, v2, v3 = tl.inline_asm_elementwise(
            _MX_PTX_NARROW if NARROW else _MX_PTX_WIDE, "=r,=r,=r,=r,r,r", [q, m],
            dtype=(tl.bfloat16, tl.bfloat16, tl.bfloat16, tl.bfloat16), is_pure=True, pack=2)
    else:  # the same values in plain Triton (the interpreter, ROCm)
        b = q.to(tl.int32) & 0xFFFF
        v0 = (_e2m1(_mx_code(b, _MX_MAG0, _MX_SIGN0)) * m).to(DTYPE)
        v1 = (_e2m1(_mx_code(b, _MX_MAG1, _MX_SIGN1)) * m).to(DTYPE)
        v2 = (_e2m1(_mx_code(b, _MX_MAG2, _MX_SIGN2)) * m).to(DTYPE)
        v3 = (_e2m1(_mx_code(b, _MX_MAG3, _MX_SIGN3)) * m).to(DTYPE)
    return v0, v1, v2, v3
