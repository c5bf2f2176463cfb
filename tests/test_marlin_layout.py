"""Marlin MXFP4 layouts (dsv4hal_cuda_sm90.marlin_layout): repack and scale permutation against the documented
formulas (docs/vendor-apis.md 3.6, 3.7) and their inverses, and align_tokens_to_experts against a Python oracle."""

from __future__ import annotations

import pytest
import torch
from dsv4hal_cuda_sm90.marlin_layout import (
    SCALE_PERM,
    align_tokens_to_experts,
    padded_route_capacity,
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
    packed = _random_packed(1, 128, 32, seed=7)
    q = repack_mxfp4_for_marlin(packed)[0]
    got = [[v & 0xFFFFFFFF for v in row] for row in q.tolist()]
    assert got == _literal_repack(packed[0])


def test_repack_hand_checked_nibbles() -> None:
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
    with pytest.raises(ValueError, match="N % 64"):
        repack_mxfp4_for_marlin(torch.zeros(1, 32, 8, dtype=torch.uint8))
    with pytest.raises(ValueError, match="K % 16"):
        repack_mxfp4_for_marlin(torch.zeros(1, 64, 4, dtype=torch.uint8))
    with pytest.raises(ValueError, match="uint8"):
        repack_mxfp4_for_marlin(torch.zeros(1, 64, 8, dtype=torch.int8))


def test_scale_perm_is_the_documented_composition() -> None:
    # scale_perm: new 8a + b <- old a + 8b; then rows of 4 reordered [0, 2, 1, 3].
    step1 = [a + 8 * b for a in range(8) for b in range(8)]
    expect = [step1[4 * (i // 4) + (0, 2, 1, 3)[i % 4]] for i in range(64)]
    assert list(SCALE_PERM) == expect and sorted(SCALE_PERM) == list(range(64))
    assert SCALE_PERM[:8] == (0, 16, 8, 24, 32, 48, 40, 56)


@pytest.mark.parametrize("e,n,g", [(1, 64, 1), (2, 128, 2), (3, 192, 4), (2, 64, 7)])
def test_scale_permute_roundtrip(e: int, n: int, g: int) -> None:
    gen = torch.Generator().manual_seed(n * g)
    scale = torch.randint(0, 255, (e, n, g), generator=gen, dtype=torch.uint8)
    s = permute_scales_for_marlin(scale)
    assert s.dtype == torch.float8_e8m0fnu and s.shape == (e, g, n) and s.is_contiguous()
    assert torch.equal(unpermute_scales_for_marlin(s), scale)
    # the same bytes, only moved: per-expert multisets are unchanged
    for i in range(e):
        assert torch.equal(s[i].view(torch.uint8).flatten().sort().values, scale[i].flatten().sort().values)


def test_scale_permute_hand_checked() -> None:
    # scale[e=0, n, g=0] = n: after the transpose the first 64 bytes are n = 0..63, so the result's first row is
    # SCALE_PERM itself; e8m0 byte b decodes to 2^(b-127).
    scale = torch.arange(64, dtype=torch.uint8).view(1, 64, 1)
    s = permute_scales_for_marlin(scale)
    assert s.view(torch.uint8)[0, 0].tolist() == list(SCALE_PERM)
    assert float(s[0, 0, 1].float()) == 2.0 ** (16 - 127)


def _oracle(ids: list[list[int]], e: int, bs: int):  # noqa: ANN202
    numel = sum(len(r) for r in ids)
    k = len(ids[0]) if ids else 0
    per = {x: [t * k + j for t, row in enumerate(ids) for j, v in enumerate(row) if v == x] for x in range(e)}
    sorted_ids, experts = [], []
    for x in range(e):
        seg = per[x] + [numel] * ((-len(per[x])) % bs)
        sorted_ids += seg
        experts += [x] * (len(seg) // bs)
    return sorted_ids, experts, len(sorted_ids)


@pytest.mark.parametrize("t,k,e,bs", [(1, 6, 16, 8), (5, 6, 16, 16), (40, 6, 8, 16), (3, 2, 4, 64), (64, 6, 256, 8),
                                      (2, 1, 1, 16)])
def test_align_tokens_to_experts(t: int, k: int, e: int, bs: int) -> None:
    gen = torch.Generator().manual_seed(t * 131 + e)
    ids = torch.randint(0, e, (t, k), generator=gen, dtype=torch.int32)
    sorted_ids, expert_ids, total = align_tokens_to_experts(ids, e, bs)
    cap = padded_route_capacity(t * k, e, bs)
    assert sorted_ids.dtype == expert_ids.dtype == total.dtype == torch.int32
    assert sorted_ids.shape == (cap,) and expert_ids.shape == (-(-cap // bs),) and total.shape == (1,)
    want_sorted, want_experts, want_total = _oracle(ids.tolist(), e, bs)
    n = int(total)
    assert n == want_total and n % bs == 0 and n <= cap
    assert sorted_ids[:n].tolist() == want_sorted  # ascending inside each expert
    assert (sorted_ids[n:] == t * k).all()
    assert expert_ids[: n // bs].tolist() == want_experts and (expert_ids[n // bs:] == -1).all()
    real = sorted_ids[sorted_ids < t * k]
    assert sorted(real.tolist()) == list(range(t * k))  # every (token, slot) exactly once
    for b in range(n // bs):  # every block holds routes of its expert only
        blk = sorted_ids[b * bs:(b + 1) * bs]
        blk = blk[blk < t * k].long()
        assert (ids.flatten()[blk] == expert_ids[b]).all()


def test_align_drops_invalid_ids() -> None:
    ids = torch.tensor([[0, -1], [3, 1], [-1, 0]], dtype=torch.int32)
    sorted_ids, expert_ids, total = align_tokens_to_experts(ids, 2, 4)  # id 3 >= E is dropped too
    assert int(total) == 8
    assert sorted_ids[:8].tolist() == [0, 5, 6, 6, 3, 6, 6, 6] and (sorted_ids[8:] == 6).all()
    assert expert_ids.tolist()[:2] == [0, 1] and (expert_ids[2:] == -1).all()


def test_capacity_matches_vllm_allocation() -> None:
    assert padded_route_capacity(6, 256, 8) == 48  # numel < E: min(numel * bs, numel + E*(bs-1))
    assert padded_route_capacity(384, 256, 16) == 384 + 256 * 15
