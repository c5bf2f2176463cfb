"""Marlin MXFP4 layouts (dsv4hal_cuda_sm90.marlin_layout): repack and scale permutation against the documented
formulas (docs/vendor-apis.md 3.6, 3.7) and their inverses."""

from __future__ import annotations

import pytest
import torch
from dsv4hal_cuda_sm90.marlin_layout import (
    SCALE_PERM,
    permute_scales_for_marlin,
    repack_mxfp4_for_marlin,
    unpermute_scales_for_marlin,
    unrepack_marlin_mxfp4,
)

from dsv4hal.formats.mxfp4 import pack_nibbles


def _random_packed(e: int, n: int, k: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (e, n, k // 2), generator=gen, dtype=torch.uint8)


def _one_code(n: int, k: int, row: int, col: int, code: int) -> torch.Tensor:
    codes = torch.zeros(1, n, k, dtype=torch.uint8)
    codes[0, row, col] = code
    return pack_nibbles(codes)


def _word(q: torch.Tensor, *idx: int) -> int:
    return int(q[idx]) & 0xFFFFFFFF


@pytest.mark.parametrize("e,n,k", [(1, 64, 16), (2, 128, 32), (3, 192, 64), (2, 256, 128), (1, 64, 256)])
def test_repack_roundtrip_and_shape(e: int, n: int, k: int) -> None:
    """The Marlin MXFP4 repack has the expected shape and un-repacks to the input."""
    packed = _random_packed(e, n, k, seed=n + k)
    q = repack_mxfp4_for_marlin(packed)
    assert q.dtype == torch.int32 and q.shape == (e, k // 16, 2 * n)
    assert torch.equal(unrepack_marlin_mxfp4(q), packed)


def _literal_repack(packed: torch.Tensor) -> list[list[int]]:
    """The documented closed form, word by word in plain Python (one expert)."""
    n, k = packed.shape[0], packed.shape[1] * 2
    p = packed.tolist()

    def w_(kk: int, nn: int) -> int:  # W[k, n] = code of logical (row n, column k)
        return (p[nn][kk // 2] >> (4 * (kk % 2))) & 0xF

    out = [[0] * (2 * n) for _ in range(k // 16)]
    for kt in range(k // 16):
        for nt in range(n // 64):
            for w in range(4):
                for t in range(32):
                    r, n0 = kt * 16 + 2 * (t % 4), nt * 64 + 16 * w + t // 4
                    n1 = n0 + 8
                    nibbles = (w_(r, n0), w_(r + 8, n0), w_(r, n1), w_(r + 8, n1),
                               w_(r + 1, n0), w_(r + 9, n0), w_(r + 1, n1), w_(r + 9, n1))
                    out[kt][nt * 128 + 4 * t + w] = sum(v << (4 * j) for j, v in enumerate(nibbles))
    return out


def test_repack_matches_literal_formula() -> None:
    """The Marlin repack equals the literal per-nibble formula."""
    packed = _random_packed(1, 128, 32, seed=7)
    q = repack_mxfp4_for_marlin(packed)[0]
    got = [[v & 0xFFFFFFFF for v in row] for row in q.tolist()]
    assert got == _literal_repack(packed[0])


def test_repack_hand_checked_nibbles() -> None:
    """Single codes land in the hand-computed Marlin word and nibble."""
    # Logical (row n=9, col k=3), code 5, in a 64x16 weight: W[3, 9]. With kt = nt = 0: k = 3 = 2*(t%4) + 1 needs
    # t%4 = 1 and a "+1" row (nibbles 4..7); n = 9 = 16w + t//4 (+8 for n1) needs w = 0, t//4 = 1, n1: nibble 6
    # ("W[r+1, n1]", r = 2, n1 = 1 + 8). So t = 5 and word 4t + w = 20 holds 5 << 24; every other word is 0.
    q = repack_mxfp4_for_marlin(_one_code(64, 16, row=9, col=3, code=5))
    assert _word(q, 0, 0, 20) == 5 << 24
    assert int(torch.count_nonzero(q)) == 1
    # Logical (row n=81, col k=26) in a 128x32 weight: tile kt = 1, nt = 1; in-tile k = 10 = 2*1 + 8 (nibble 1 or 3),
    # in-tile n = 17 = 16*1 + 1 (+0: n0) -> nibble 1 ("W[r+8, n0]"), t = 4*1 + 1 = 5, w = 1: Q[1, 128 + 21].
    # Code 0xF fills the nibble's four bits: 0xF << 4.
    q = repack_mxfp4_for_marlin(_one_code(128, 32, row=81, col=26, code=0xF))
    assert _word(q, 0, 1, 128 + 21) == 0xF << 4
    assert int(torch.count_nonzero(q)) == 1
    # The top nibble: W[r+9, n1] with r = 0, n1 = 8 -> t = 0, w = 0, word 0, bits 28..31 (the int32 sign bit).
    q = repack_mxfp4_for_marlin(_one_code(64, 16, row=8, col=9, code=0xC))
    assert _word(q, 0, 0, 0) == 0xC << 28 and int(q[0, 0, 0]) < 0


def test_repack_rejects_bad_shapes() -> None:
    """The Marlin repack refuses N or K off its tile multiples and non-uint8 input."""
    with pytest.raises(ValueError, match="N % 64"):
        repack_mxfp4_for_marlin(torch.zeros(1, 32, 8, dtype=torch.uint8))
    with pytest.raises(ValueError, match="K % 16"):
        repack_mxfp4_for_marlin(torch.zeros(1, 64, 4, dtype=torch.uint8))
    with pytest.raises(ValueError, match="uint8"):
        repack_mxfp4_for_marlin(torch.zeros(1, 64, 8, dtype=torch.int8))


def test_scale_perm_is_the_documented_composition() -> None:
    """SCALE_PERM is the documented transpose then row-of-4 reorder, a permutation of 64."""
    # scale_perm: new 8a + b <- old a + 8b; then rows of 4 reordered [0, 2, 1, 3].
    step1 = [a + 8 * b for a in range(8) for b in range(8)]
    expect = [step1[4 * (i // 4) + (0, 2, 1, 3)[i % 4]] for i in range(64)]
    assert list(SCALE_PERM) == expect and sorted(SCALE_PERM) == list(range(64))
    assert SCALE_PERM[:8] == (0, 16, 8, 24, 32, 48, 40, 56)


@pytest.mark.parametrize("e,n,g", [(1, 64, 1), (2, 128, 2), (3, 192, 4), (2, 64, 7)])
def test_scale_permute_roundtrip(e: int, n: int, g: int) -> None:
    """Marlin scale permutation keeps each expert's bytes and un-permutes to the input."""
    gen = torch.Generator().manual_seed(n * g)
    scale = torch.randint(0, 255, (e, n, g), generator=gen, dtype=torch.uint8)
    s = permute_scales_for_marlin(scale)
    assert s.dtype == torch.float8_e8m0fnu and s.shape == (e, g, n) and s.is_contiguous()
    assert torch.equal(unpermute_scales_for_marlin(s), scale)
    # the same bytes, only moved: per-expert multisets are unchanged
    for i in range(e):
        assert torch.equal(s[i].view(torch.uint8).flatten().sort().values, scale[i].flatten().sort().values)


def test_scale_permute_hand_checked() -> None:
    """A hand-built scale tensor permutes to SCALE_PERM and decodes as e8m0."""
    # scale[e=0, n, g=0] = n: after the transpose the first 64 bytes are n = 0..63, so the result's first row is
    # SCALE_PERM itself; e8m0 byte b decodes to 2^(b-127).
    scale = torch.arange(64, dtype=torch.uint8).view(1, 64, 1)
    s = permute_scales_for_marlin(scale)
    assert s.view(torch.uint8)[0, 0].tolist() == list(SCALE_PERM)
    assert float(s[0, 0, 1].float()) == 2.0 ** (16 - 127)
