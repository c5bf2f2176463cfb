"""MXFP4 (e2m1 + UE8M0 per 32) and FP8 128x128 block / 1x128 activation formats."""

from __future__ import annotations

import pytest
import torch

from dsv4hal.formats.fp8 import FP8_MAX
from dsv4hal.formats.fp8_block import (
    act_dequant_1x128,
    act_quant_1x128,
    dequantize_fp8_block,
    quantize_fp8_block,
)
from dsv4hal.formats.mxfp4 import (
    E2M1_VALUES,
    dequantize_mxfp4,
    e2m1_decode,
    pack_nibbles,
    quantize_mxfp4,
    unpack_nibbles,
)


def _group(*head: float, amax: float = 6.0) -> torch.Tensor:
    """One 32-group starting with `head`, with `amax` in the last slot (fixes the scale)."""
    g = torch.zeros(32)
    g[: len(head)] = torch.tensor(head)
    g[-1] = amax
    return g


# ----- MXFP4 --------------------------------------------------------------------------------------------


def test_e2m1_table_and_codes():
    """The E2M1 value table and its 16 codes decode to the spec's values, sign in the top bit."""
    assert E2M1_VALUES == (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
    decoded = e2m1_decode(torch.arange(16, dtype=torch.uint8))
    assert decoded[:8].tolist() == list(E2M1_VALUES)
    assert decoded[8:].tolist() == [-v for v in E2M1_VALUES]


def test_hand_packed_byte():
    """quantize_mxfp4 packs a hand-computed group to the expected bytes and scale."""
    # Scale exponent 0 (amax 6): 1.0 -> code 0x2, -0.5 -> 0x8 | 0x1 = 0x9; even element in the low nibble.
    packed, scale = quantize_mxfp4(_group(1.0, -0.5))
    assert packed[0].item() == 0x92
    assert packed[-1].item() == 0x70  # element 30 = 0 (low), element 31 = 6.0 -> code 7 (high)
    assert scale.tolist() == [127]


def test_nibble_order():
    """MXFP4 packs the even element in the low nibble; pack and unpack invert each other."""
    packed, _ = quantize_mxfp4(_group(0.0, 3.0))  # only the odd element of byte 0 is set
    assert packed[0].item() == 0x50
    codes = torch.randint(0, 16, (3, 64), dtype=torch.uint8)
    assert torch.equal(unpack_nibbles(pack_nibbles(codes)), codes)
    assert torch.equal(pack_nibbles(codes)[:, 0], codes[:, 0] | (codes[:, 1] << 4))


@pytest.mark.parametrize(
    ("amax", "byte"),
    [(6.0, 127), (6.0001, 128), (3.0, 126), (3.0001, 127), (12.0, 128), (0.0, 112), (1e-6, 112)],
)
def test_scale_exponent(amax: float, byte: int):
    """The MXFP4 scale byte is ceil(log2(max(amax, 1e-4) / 6)) + 127."""
    # ceil(log2(max(amax, 1e-4) / 6)) + 127; the floor gives ceil(log2(1.67e-5)) = -15.
    _, scale = quantize_mxfp4(_group(amax=amax))
    assert scale.item() == byte


def test_ties_round_down_and_strict_thresholds():
    """MXFP4 rounding sends exact midpoints down and anything above up."""
    mids = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]
    below = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0]
    packed, scale = quantize_mxfp4(_group(*mids, *[m + 1e-3 for m in mids], *[-m for m in mids]))
    out = dequantize_mxfp4(packed, scale)
    assert out[:7].tolist() == below
    assert out[7:14].tolist() == list(E2M1_VALUES[1:])
    assert out[14:21].tolist() == [-b for b in below]


def test_round_trip_error_bound():
    """The MXFP4 round trip stays within half a step of each group's scale."""
    gen = torch.Generator().manual_seed(1)
    w = torch.randn(4, 5, 256, generator=gen) * torch.logspace(-3, 3, 5).view(1, 5, 1)
    packed, scale = quantize_mxfp4(w)
    assert packed.shape == (4, 5, 128) and scale.shape == (4, 5, 8)
    out = dequantize_mxfp4(packed, scale)
    step = torch.exp2(scale.float() - 127).repeat_interleave(32, dim=-1)
    mag = w.abs() / step
    # Half the gap between neighbouring e2m1 magnitudes around |w|/scale: 0.25 below 2, 0.5 below 4, then 1.
    half_gap = torch.where(mag <= 2, 0.25, torch.where(mag <= 4, 0.5, 1.0))
    assert mag.max() <= 6.0
    assert ((out - w).abs() <= half_gap * step).all()
    # Each group's largest magnitude lands in [3, 6] (the scale wastes less than one binade).
    assert (mag.reshape(4, 5, 8, 32).amax(-1) > 3.0).all()


def test_no_negative_zero():
    """MXFP4 never encodes negative zero for values that round to zero."""
    gen = torch.Generator().manual_seed(2)
    w = -torch.rand(8, 64, generator=gen) * 0.2  # all tiny negatives ...
    w[:, 0] = 6.0  # ... next to a large value, so most round to zero
    packed, scale = quantize_mxfp4(w)
    codes = unpack_nibbles(packed)
    assert (codes == 0).any(), "test data should contain values rounding to zero"
    assert not (codes == 0x8).any()
    assert not torch.signbit(dequantize_mxfp4(packed, scale)).logical_and(codes == 0).any()


def test_non_finite_group_becomes_nan():
    """A group holding NaN or inf gets the NaN scale byte and dequantizes to NaN."""
    w = torch.ones(2, 64)
    w[0, 40] = float("nan")
    w[1, 3] = float("inf")
    packed, scale = quantize_mxfp4(w)
    assert scale.tolist() == [[127 - 2, 0xFF], [0xFF, 127 - 2]]
    out = dequantize_mxfp4(packed, scale)
    assert torch.isnan(out[0, 32:]).all() and torch.isnan(out[1, :32]).all()
    assert torch.equal(out[0, :32], torch.ones(32)) and torch.equal(out[1, 32:], torch.ones(32))


def test_mxfp4_shape_errors():
    """MXFP4 quantize and dequantize refuse bad widths, scale shapes and dtypes."""
    with pytest.raises(ValueError, match="multiple of 32"):
        quantize_mxfp4(torch.zeros(4, 48))
    packed, scale = quantize_mxfp4(torch.zeros(4, 64))
    with pytest.raises(ValueError, match="scale shape"):
        dequantize_mxfp4(packed, scale[:, :1])
    with pytest.raises(ValueError, match="uint8"):
        dequantize_mxfp4(packed.to(torch.int8), scale)


# ----- FP8 blocks ---------------------------------------------------------------------------------------


def _fp8_error_bound(w: torch.Tensor, scale_per_element: torch.Tensor) -> torch.Tensor:
    # e4m3: 3 mantissa bits (relative half-ulp 2**-4); subnormal spacing 2**-9 (fn) / 2**-10 (fnuz) times scale.
    return w.abs() * 2.0**-4 + scale_per_element * 2.0**-9


def _per_element(scale: torch.Tensor, n: int, k: int, rows: int = 128) -> torch.Tensor:
    return scale.repeat_interleave(rows, 0).repeat_interleave(128, 1)[:n, :k]


@pytest.mark.parametrize("fp8", ["e4m3fn", "e4m3fnuz"])
def test_fp8_block_quantize_bound(fp8: str):
    """FP8 128x128 block quantization keeps each tile within its scale's error, edge tiles included."""
    gen = torch.Generator().manual_seed(3)
    w = torch.randn(300, 200, generator=gen) * torch.logspace(-4, 2, 300).unsqueeze(1)
    q, scale = quantize_fp8_block(w, fp8=fp8)
    assert q.dtype == {"e4m3fn": torch.float8_e4m3fn, "e4m3fnuz": torch.float8_e4m3fnuz}[fp8]
    assert q.shape == (300, 200) and scale.shape == (3, 2) and scale.dtype == torch.float32
    # Edge tile (rows 256..299, cols 128..199): its amax covers only the real elements.
    assert scale[2, 1] == pytest.approx(float(w[256:, 128:].abs().max()) / FP8_MAX[fp8], rel=1e-6)
    # The tile's largest element maps onto FP8_MAX.
    assert q[256:, 128:].float().abs().max().item() == FP8_MAX[fp8]
    out = dequantize_fp8_block(q, scale)
    assert ((out - w).abs() <= _fp8_error_bound(w, _per_element(scale, 300, 200))).all()


def test_fp8_block_pow2_and_floor():
    """FP8 block pow2 scales are powers of two and an all-zero tile gets the floor scale."""
    gen = torch.Generator().manual_seed(4)
    w = torch.randn(2, 256, 256, generator=gen) * 7.0
    w[1, :128, :128] = 0.0
    q, scale = quantize_fp8_block(w, pow2_scales=True)
    assert scale.shape == (2, 2, 2)
    mantissa, _ = torch.frexp(scale)
    assert (mantissa == 0.5).all()
    amax = w.reshape(2, 2, 128, 2, 128).abs().amax(dim=(2, 4)).clamp_min(1e-4)
    assert (scale >= amax / 448).all() and (scale < 2 * amax / 448).all()
    assert scale[1, 0, 0].item() == 2.0 ** -22  # 1e-4 / 448 = 2.2e-7 rounds up to 2**-22
    assert q.float().abs().max() <= 448
    out = dequantize_fp8_block(q, scale)
    per_el = scale.repeat_interleave(128, 1).repeat_interleave(128, 2)
    assert ((out - w).abs() <= _fp8_error_bound(w, per_el)).all()
    assert (out[1, :128, :128] == 0).all()


def test_fp8_block_nan_propagates_and_shape_errors():
    """A NaN stays in its FP8 block only, and dequantization refuses a bad scale shape."""
    w = torch.ones(128, 256)
    w[5, 200] = float("nan")
    q, scale = quantize_fp8_block(w)
    out = dequantize_fp8_block(q, scale)
    assert torch.isnan(out[5, 200]) and torch.isfinite(out[:, :128]).all()
    with pytest.raises(ValueError, match="scale shape"):
        dequantize_fp8_block(q, scale[:, :1])


def test_act_quant_1x128():
    """act_quant_1x128 scales each 128-wide group by its amax / 448."""
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(6, 384, generator=gen) * torch.logspace(-2, 2, 6).unsqueeze(1)
    q, scale = act_quant_1x128(x)
    assert q.dtype == torch.float8_e4m3fn and scale.shape == (6, 3)
    want = x.reshape(6, 3, 128).abs().amax(-1).clamp_min(1e-4) / 448
    assert torch.allclose(scale, want, rtol=1e-6, atol=0)
    out = act_dequant_1x128(q, scale)
    assert ((out - x).abs() <= _fp8_error_bound(x, _per_element(scale, 6, 384, rows=1))).all()
    with pytest.raises(ValueError, match=r"\[T, K\]"):
        act_quant_1x128(torch.zeros(2, 3, 128))
