"""RoPE table and rotation, the compressor reference, its contract and its conformance catalog."""

from __future__ import annotations

import math

import pytest
import torch

from dsv4hal.conformance import cases_compress
from dsv4hal.conformance.types import compare_close
from dsv4hal.errors import InvalidArgumentError
from dsv4hal.ops import compress as contract
from dsv4hal.reference.compress import compress, compression_positions, hadamard_transform, rms_norm
from dsv4hal.reference.rope import DSV4_YARN, YarnConfig, apply_rope, make_rope_table, rope_frequencies

CPU = torch.device("cpu")


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ---------------------------------------------------------------- RoPE

def test_rope_table_plain_matches_closed_form() -> None:
    """make_rope_table matches the closed-form cos and sin."""
    cos, sin = make_rope_table(50, 10000.0)
    assert cos.shape == sin.shape == (50, 32) and cos.dtype == torch.float32
    p, i = 37, 5
    angle = p * 10000.0 ** (-2 * i / 64)
    assert cos[p, i].item() == pytest.approx(math.cos(angle), abs=1e-6)
    assert sin[p, i].item() == pytest.approx(math.sin(angle), abs=1e-6)
    assert torch.equal(cos[0], torch.ones(32)) and torch.equal(sin[0], torch.zeros(32))


def test_yarn_keeps_fast_dims_and_slows_slow_dims() -> None:
    """YaRN leaves fast dims and divides slow dims by the factor, blending monotonically."""
    plain, yarn = rope_frequencies(160000.0), rope_frequencies(160000.0, DSV4_YARN)
    assert yarn[0] == plain[0]  # wavelength far below the original context: untouched
    assert yarn[-1].item() == pytest.approx(plain[-1].item() / DSV4_YARN.factor, rel=1e-12)
    ratio = yarn / plain
    assert bool(((ratio <= 1 + 1e-12) & (ratio >= 1 / DSV4_YARN.factor - 1e-12)).all())
    assert bool((ratio[1:] <= ratio[:-1] + 1e-12).all())  # blend moves monotonically towards freq/factor
    assert torch.equal(rope_frequencies(160000.0, YarnConfig(16.0, 32.0, 1.0, 0)), plain)  # 0 disables


def test_rope_hand_example_and_nope_untouched() -> None:
    """apply_rope rotates the rope pairs by the hand-computed angle and leaves nope dims."""
    x = torch.zeros(1, 70)
    x[0, :6] = torch.arange(1.0, 7.0)
    x[0, 6], x[0, 7] = 1.0, 0.0  # first rope pair = 1 + 0i
    cos, sin = torch.zeros(1, 32), torch.zeros(1, 32)
    cos[0, 0], sin[0, 0] = math.cos(0.3), math.sin(0.3)
    out = apply_rope(x, cos, sin)
    assert torch.equal(out[0, :6], x[0, :6])
    assert out[0, 6].item() == pytest.approx(math.cos(0.3)) and out[0, 7].item() == pytest.approx(math.sin(0.3))
    back = apply_rope(out, cos, sin, inverse=True)
    assert back[0, 6].item() == pytest.approx(1.0) and abs(back[0, 7].item()) < 1e-7


def test_rope_preserves_pair_norms_and_inverse_undoes() -> None:
    """RoPE preserves each pair's norm and the inverse rotation undoes it."""
    cos, sin = make_rope_table(4096, 10000.0, DSV4_YARN)
    pos = torch.randint(0, 4096, (16,), generator=_gen())
    x = torch.randn(16, 3, 512, generator=_gen(1))
    c, s = cos[pos][:, None], sin[pos][:, None]
    y = apply_rope(x, c, s)
    pair_norm = lambda t: t[..., 448:].unflatten(-1, (32, 2)).norm(dim=-1)  # noqa: E731
    torch.testing.assert_close(pair_norm(y), pair_norm(x), rtol=1e-5, atol=1e-5)
    assert (y[..., 448:] - x[..., 448:]).abs().max() > 0.1  # it did rotate
    torch.testing.assert_close(apply_rope(y, c, s, inverse=True), x, rtol=1e-5, atol=1e-5)


def test_rope_keeps_dtype() -> None:
    """apply_rope keeps the input dtype."""
    cos, sin = make_rope_table(4, 10000.0)
    assert apply_rope(torch.randn(4, 128).bfloat16(), cos, sin).dtype == torch.bfloat16


# ---------------------------------------------------------------- compressor semantics

def _cu(*lengths: int) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)


def test_compression_positions_hand_example() -> None:
    """compression_positions gives each sequence's compressed rows and their positions."""
    rows, pos = compression_positions(_cu(3, 9, 0, 4), 4)
    assert rows.tolist() == [3, 7, 12] and pos.tolist() == [0, 4, 0]


def test_c128_equal_scores_give_mean_then_norm_and_rope() -> None:
    """C128 with equal scores averages its 128 rows, then applies RMSNorm and RoPE."""
    hd, n = 512, 256
    kv = torch.randn(n, hd, generator=_gen())
    kv_score = torch.cat((kv, torch.full((n, hd), 0.7)), dim=1)
    cos, sin = make_rope_table(200, 160000.0, DSV4_YARN)
    w = 1.0 + 0.1 * torch.randn(hd, generator=_gen(2))
    out = compress(kv_score, _cu(n), torch.zeros(128, hd), w, cos, sin, 128)
    first = rms_norm(kv[:128].mean(0), w, 1e-6)  # position 0: RoPE is the identity
    second = apply_rope(rms_norm(kv[128:].mean(0), w, 1e-6), cos[128], sin[128])
    torch.testing.assert_close(out, torch.stack((first, second)), rtol=1e-5, atol=1e-5)


def _c4_score(n: int, hd: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, 4 * hd, generator=_gen(seed))


def test_c4_first_group_ignores_overlap_halves() -> None:
    """The first C4 group ignores the overlap halves, there being no previous group."""
    hd = 128
    ks = _c4_score(4, hd)
    ape = torch.randn(4, 2 * hd, generator=_gen(3))
    cos, sin = make_rope_table(8, 160000.0)
    w = torch.ones(hd)
    base = compress(ks, _cu(4), ape, w, cos, sin, 4)
    poisoned = ks.clone()
    poisoned[:, :hd] = float("nan")  # kv_ov
    poisoned[:, 2 * hd : 3 * hd] = 1e4  # score_ov would dominate the softmax if it were read
    assert torch.equal(compress(poisoned, _cu(4), ape, w, cos, sin, 4), base)
    p = torch.softmax(ks[:, 3 * hd :] + ape[:, hd:], dim=0)  # cur halves only
    torch.testing.assert_close(base[0], rms_norm((p * ks[:, hd : 2 * hd]).sum(0), w, 1e-6))


def test_c4_second_group_uses_previous_group_through_ov_halves() -> None:
    """The second C4 group reads the previous group's rows through the overlap halves."""
    hd = 128
    ks = _c4_score(8, hd)
    ks[:, 2 * hd :] = 0.0  # equal scores: plain mean over the 8-row window
    cos, sin = make_rope_table(8, 160000.0)
    out = compress(ks, _cu(8), torch.zeros(4, 2 * hd), torch.ones(hd), cos, sin, 4)
    window = torch.cat((ks[0:4, :hd], ks[4:8, hd : 2 * hd]))  # positions 0..3 via kv_ov, 4..7 via kv_cur
    expected = apply_rope(rms_norm(window.mean(0), torch.ones(hd), 1e-6), cos[4], sin[4])
    torch.testing.assert_close(out[1], expected, rtol=1e-5, atol=1e-5)


def test_c4_ape_halves_apply_to_their_rows() -> None:
    """Each C4 ape half biases the scores of its own rows."""
    hd = 128
    ks = _c4_score(4, hd)
    ks[:, 2 * hd :] = 0.0
    ape = torch.zeros(4, 2 * hd)
    ape[2, hd:] = 50.0  # own-group token w=2 takes all the weight
    cos, sin = make_rope_table(8, 160000.0)
    out = compress(ks, _cu(4), ape, torch.ones(hd), cos, sin, 4)
    torch.testing.assert_close(out[0], rms_norm(ks[2, hd : 2 * hd], torch.ones(hd), 1e-6), rtol=1e-5, atol=1e-5)


def test_hadamard_is_orthonormal_sylvester() -> None:
    """hadamard_transform is the orthonormal Sylvester matrix."""
    h = hadamard_transform(torch.eye(128))
    torch.testing.assert_close(h @ h, torch.eye(128), rtol=0, atol=1e-5)
    assert torch.allclose(h[0], torch.full((128,), 128**-0.5))
    assert h[1, :4].tolist() == pytest.approx([128**-0.5, -(128**-0.5), 128**-0.5, -(128**-0.5)])


def test_compress_hadamard_is_transform_of_plain_output() -> None:
    """compress with hadamard=True is the Hadamard transform of the plain output."""
    hd = 128
    ks, ape = _c4_score(20, hd), torch.randn(4, 2 * hd, generator=_gen(5))
    cos, sin = make_rope_table(32, 160000.0)
    plain = compress(ks, _cu(9, 11), ape, torch.ones(hd), cos, sin, 4)
    rotated = compress(ks, _cu(9, 11), ape, torch.ones(hd), cos, sin, 4, hadamard=True)
    assert plain.shape == (4, hd)
    torch.testing.assert_close(rotated, hadamard_transform(plain))


def test_compress_matches_oracle_and_oracle_detects_a_shift() -> None:
    """Reference compress matches the oracle, which fails outputs shifted by one row."""
    spec = cases_compress.CASES[0]
    fx = cases_compress.build(spec, CPU, _gen(7))
    got = compress(**fx.args)
    assert compare_close(got, fx.expected, fx.tolerance)[1]
    assert not compare_close(got.roll(1, dims=0), fx.expected, fx.tolerance)[1]


# ---------------------------------------------------------------- contract

def _args(ratio: int = 4, hd: int = 512, lengths: tuple[int, ...] = (5, 8)) -> dict:
    coff = 2 if ratio == 4 else 1
    cos, sin = make_rope_table(300, 160000.0)
    return {
        "kv_score": torch.zeros(sum(lengths), 2 * coff * hd), "cu_seqlens": _cu(*lengths),
        "ape": torch.zeros(ratio, coff * hd), "norm_weight": torch.ones(hd), "cos": cos, "sin": sin, "ratio": ratio,
    }


def test_validate_accepts_good_arguments() -> None:
    """compress validation accepts good arguments and reports the case."""
    contract.validate(**_args(), checked=True)
    contract.validate(**_args(128, 512, (130, 1)), checked=True)
    contract.validate(**_args(4, 128), hadamard=True, checked=True)
    assert contract.case(**_args(4, 128), hadamard=True) == {"ratio": 4, "hd": 128, "hadamard": True}


@pytest.mark.parametrize(
    "change",
    [
        {"ratio": 8},
        {"ratio": 4.0},
        {"kv_score": torch.zeros(13, 2048, dtype=torch.float16)},
        {"kv_score": torch.zeros(13, 2000)},
        {"kv_score": torch.zeros(13, 1024)},  # ratio 4 with a C128-shaped projection
        {"ape": torch.zeros(4, 512)},
        {"norm_weight": torch.ones(128)},
        {"cos": torch.zeros(300, 64)},
        {"sin": torch.zeros(299, 32)},
        {"cu_seqlens": _cu(5, 8).long()},
        {"cu_seqlens": torch.tensor([0], dtype=torch.int32)},
        {"cu_seqlens": _cu(5, 7)},  # ends at 12, N is 13
        {"hadamard": True},  # hd 512
        {"eps": 0.0},
    ],
)
def test_validate_rejects(change: dict) -> None:
    """compress validation refuses each bad ratio, shape, dtype, cu_seqlens, hadamard or eps."""
    with pytest.raises(InvalidArgumentError):
        contract.validate(**{**_args(), **change})


def test_validate_rejects_positions_beyond_rope_table() -> None:
    """compress refuses positions past the RoPE table and accepts one just long enough."""
    args = _args(128, 512, (512,))
    args["cos"], args["sin"] = args["cos"][:384], args["sin"][:384]  # last group starts at 384
    with pytest.raises(InvalidArgumentError, match="RoPE table"):
        contract.validate(**args)
    args["cos"], args["sin"] = make_rope_table(385, 160000.0)
    contract.validate(**args)


def test_checked_mode_reads_values() -> None:
    """Checked compress refuses decreasing cu_seqlens and non-finite values."""
    bad_order = _args()
    bad_order["cu_seqlens"] = torch.tensor([0, 9, 5, 13], dtype=torch.int32)
    bad_order["kv_score"] = torch.zeros(13, 2048)
    with pytest.raises(InvalidArgumentError, match="non-decreasing"):
        contract.validate(**bad_order, checked=True)
    nan = _args()
    nan["kv_score"][3, 7] = float("nan")
    contract.validate(**nan)  # unchecked mode does not scan float inputs
    with pytest.raises(InvalidArgumentError, match="finite"):
        contract.validate(**nan, checked=True)


# ---------------------------------------------------------------- catalog

def test_catalog_shape() -> None:
    """The compress catalog covers ratios 4 and 128, hd 128 and 512, and hadamard."""
    assert {c.op for c in cases_compress.CASES} == {"compress"}
    assert {c.compress_ratio for c in cases_compress.CASES} == {4, 128}
    assert {c.params["hd"] for c in cases_compress.CASES} == {128, 512}
    assert any(c.params["hadamard"] for c in cases_compress.CASES)
    assert len({c.name for c in cases_compress.CASES}) == len(cases_compress.CASES)
    assert cases_compress.TOLERANCES["compress"].reason


@pytest.mark.parametrize("spec", [c for c in cases_compress.CASES if not c.gpu_only], ids=lambda c: c.name)
def test_catalog_fixture_passes_on_reference(spec) -> None:
    """Every CPU compress catalog fixture validates and passes on the reference."""
    fx = cases_compress.build(spec, CPU, _gen(11))
    contract.validate(**fx.args, checked=True)
    err, ok, detail = compare_close(compress(**fx.args), fx.expected, fx.tolerance)
    assert ok, detail


def test_num_groups_gives_the_row_count_as_unchecked_kernels_do() -> None:
    """num_groups = M: the same rows; past M, zero rows after them; below M, the first num_groups (what the
    contract leaves to a caller's promise in unchecked mode, the same in every implementation)."""
    hd = 512
    cos, sin = make_rope_table(64, cases_compress.COMPRESS_ROPE_BASE, DSV4_YARN)
    g = torch.Generator().manual_seed(3)
    ks = torch.randn(20, 4 * hd, generator=g)
    args = (ks, _cu(9, 11), 0.1 * torch.randn(4, 2 * hd, generator=g), torch.ones(hd), cos, sin, 4)
    base = compress(*args)
    assert base.shape == (4, hd)
    assert torch.equal(compress(*args, num_groups=4), base)
    more = compress(*args, num_groups=6)
    assert torch.equal(more[:4], base) and not bool(more[4:].any())
    assert torch.equal(compress(*args, num_groups=2), base[:2])
