"""The MXFP4 kernels' decode (`mxfp4_decode._mx_quarters`): every pair of e2m1 bytes (a 16-bit element), reordered as
prepare_weights lays them out, under the scale bytes at the ends of their range, each nibble's value at its k.
Under the interpreter the plain Triton decode is checked against a table; on a GPU both inline PTX decodes (narrow
scales: one multiply; any scale: two) and the plain one too, bit for bit, -0 and NaN included."""

from __future__ import annotations

import pytest
import torch
from conftest import TRITON_DEVICE

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")

from dsv4hal.kernels.triton.mxfp4_decode import (  # noqa: E402
    MX_BITS,
    MX_NARROW_SCALE_MAX,
    _mx_quarters,
    _mx_scale_operand,
    reorder_mxfp4,
)

_GPU = TRITON_DEVICE.type == "cuda"  # (else the interpreter on the CPU)
E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]
SCALES = [0, 1, 2, 100, 126, 127, 128, 129, 200, 253, 254, 255]


@triton.jit
def _decode_kernel(q_ptr, s_ptr, v_ptr, ASM: tl.constexpr, NARROW: tl.constexpr, R: tl.constexpr, C: tl.constexpr):
    """q int16 [R, C], s uint8 [R, C] (each element's scale) -> v fp32 [R, 4, C]: nibble j of element c at [:, j, c]."""
    r = tl.arange(0, R)[:, None]
    c = tl.arange(0, C)[None, :]
    q = tl.load(q_ptr + r * C + c)
    s = tl.load(s_ptr + r * C + c)
    DTYPE: tl.constexpr = tl.bfloat16 if ASM else tl.float32
    v0, v1, v2, v3 = _mx_quarters(q, _mx_scale_operand(s, ASM, NARROW), ASM, NARROW, DTYPE)
    out = v_ptr + r * 4 * C + c
    tl.store(out, v0.to(tl.float32))
    tl.store(out + C, v1.to(tl.float32))
    tl.store(out + 2 * C, v2.to(tl.float32))
    tl.store(out + 3 * C, v3.to(tl.float32))


def _want(q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """[R, 4, C] float32: nibble j of each element times its scale (scale 255: NaN)."""
    lut = torch.tensor(E2M1, dtype=torch.float64)
    u = q.to(torch.int32) & 0xFFFF
    v = torch.stack([lut[((u >> (4 * j)) & 15).long()] for j in range(4)], 1)
    scale = torch.where(s == 255, torch.nan, torch.exp2(s.double() - 127))[:, None, :]
    return (v * scale).float()


def _run(asm: bool, dev: str, *, narrow: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Every byte value in both bytes of an element, each row under one scale byte of SCALES (narrow: those up to
    MX_NARROW_SCALE_MAX; padded to 16 rows of scale 127)."""
    rows, c = 16, 512
    b = torch.arange(256, dtype=torch.int32)
    pairs = torch.cat([b | (b.roll(1) << 8), b.flip(0) | (b << 8)])  # every byte at both places
    q = (pairs - ((pairs & 0x8000) << 1)).to(torch.int16).repeat(rows, 1)
    scales = [x for x in SCALES if x <= MX_NARROW_SCALE_MAX] if narrow else SCALES
    s = torch.full((rows, c), 127, dtype=torch.uint8)
    s[:len(scales)] = torch.tensor(scales, dtype=torch.uint8)[:, None]
    laid_out = reorder_mxfp4(q.view(torch.uint8)).view(torch.int16)
    v = torch.empty(rows, 4, c, device=dev)
    _decode_kernel[(1,)](laid_out.to(dev), s.to(dev), v, ASM=asm, NARROW=narrow, R=rows, C=c)
    return v.cpu(), _want(q, s)


def _check(got: torch.Tensor, want: torch.Tensor, *, flushed_rows: int = 0) -> None:
    """Equal bit for bit (sign of zero and NaN included); the first `flushed_rows` rows (the smallest scales) may
    read 0 of either sign where the value is 0 or an fp32 subnormal (a GPU that flushes them)."""
    same = (got == want) & (torch.signbit(got) == torch.signbit(want)) | (torch.isnan(got) & torch.isnan(want))
    subnormal = (want != 0) & (want.abs() < torch.finfo(torch.float32).tiny)
    if flushed_rows:
        rows = slice(0, flushed_rows)
        same[rows] |= (subnormal | (want == 0))[rows] & (got[rows] == 0)
    bad = (~same).nonzero().tolist()
    where = [f"scale {SCALES[r] if r < len(SCALES) else 127} element {c} nibble {j}: {float(got[r, j, c])!r} for "
             f"{float(want[r, j, c])!r}" for r, j, c in bad[:8]]
    assert not bad, f"{len(bad)} values differ: " + "; ".join(where)


def test_plain_decode_every_byte_and_scale() -> None:
    """The plain MXFP4 decode gives the right value for every byte and scale."""
    if _GPU:
        pytest.skip("the plain decode runs under the interpreter here; the GPU tests run both decodes")
    _check(*_run(False, "cpu"))


@pytest.mark.gpu
@pytest.mark.skipif(not _GPU, reason="inline PTX runs on an NVIDIA GPU only")
@pytest.mark.parametrize("narrow", [False, True])
def test_ptx_decode_every_byte_and_scale(narrow: bool) -> None:
    """The inline-PTX MXFP4 decode gives the right value for every byte and scale."""
    _check(*_run(True, "cuda", narrow=narrow))


def _integer_ops(bits: tuple[tuple[int, int], ...]) -> int:
    """Integer instructions to place every code of an element order as bf16 bits (magnitude at 6..8, sign at 15), as
    sm_90a runs them: a shift per distinct nonzero offset, a mask per code and one more where its two offsets
    differ (a LOP3 masks one part and ors the other in)."""
    shifts = {6 - m for m, _ in bits} | {15 - s for _, s in bits}
    return len(shifts - {0}) + sum(1 if 6 - m == 15 - s else 2 for m, s in bits)


def test_element_order_takes_the_fewest_integer_instructions() -> None:
    """MX_BITS is an order of the fewest integer instructions among all orders (each code's magnitude bits
    contiguous), the PTX built from it has that many plus an `or` for each code with two offsets (which ptxas
    fuses into a LOP3; on sm_90 the SASS has 6 LOP3 and 5 shifts a register), one
    multiply a code when the scales are narrow and two else, and the nibble order takes more."""
    import itertools

    from dsv4hal.kernels.triton.mxfp4_decode import _mx_decode_ptx

    best = min(_integer_ops(tuple(zip(starts, signs, strict=True)))
               for starts in itertools.combinations(range(14), 4)
               if len({b for p in starts for b in (p, p + 1, p + 2)}) == 12
               for signs in itertools.permutations(
                   [b for b in range(16) if b not in {q for p in starts for q in (p, p + 1, p + 2)}]))
    assert _integer_ops(MX_BITS) == best == 11
    assert _integer_ops(((0, 3), (4, 7), (8, 11), (12, 15))) == 15  # the packed bytes' nibble order
    for narrow, multiplies in ((True, 4), (False, 8)):
        ops = [ln.split()[0] for ln in _mx_decode_ptx(narrow).splitlines()]
        two_offsets = sum(6 - m != 15 - s for m, s in MX_BITS)
        assert sum(op.split(".")[0] in ("shl", "shr", "and", "or") for op in ops) == best + two_offsets
        assert sum(op.startswith("fma") for op in ops) == multiplies


def test_reorder_places_each_code_at_its_bits() -> None:
    """Code c at k = 4e + j reads back from MX_BITS[j] (magnitude bits, sign bit) of element e, for every c and j;
    the other bits stay 0."""
    for j, (magnitude, sign) in enumerate(MX_BITS):
        for code in range(16):
            raw = torch.tensor([[code << (4 * j)]], dtype=torch.int32).to(torch.uint16).view(torch.int16)
            got = int(reorder_mxfp4(raw.view(torch.uint8)).view(torch.int16)) & 0xFFFF
            assert got == ((code & 7) << magnitude) | ((code >> 3) << sign), (j, code, hex(got))
    bits = sorted(b for m, s in MX_BITS for b in (m, m + 1, m + 2, s))
    assert bits == list(range(16))


@pytest.mark.gpu
@pytest.mark.skipif(not _GPU, reason="the plain decode on a GPU: what a GPU without the PTX (ROCm) runs")
def test_plain_decode_on_the_gpu() -> None:
    """Triton's fp32 multiply flushes subnormals on NVIDIA GPUs: under scale byte 0 (2**-127) every value but 0 is
    one and reads 0 (the H200: 1920 of 2048), under scale byte 1 (2**-126) 0.5 is one. Every other value is exact,
    -0 included (e2m1 decodes its sign in integer bits: a float negation read +0 on the H200)."""
    assert SCALES[:2] == [0, 1]
    _check(*_run(False, "cuda"), flushed_rows=2)
