"""mHC references (pre, post, head), their contracts and their conformance catalog."""

from __future__ import annotations

import math

import pytest
import torch

from dsv4hal.conformance import cases_mhc
from dsv4hal.conformance.types import compare_close
from dsv4hal.errors import InvalidArgumentError
from dsv4hal.ops import mhc as contract
from dsv4hal.reference.mhc import mhc_head, mhc_post, mhc_post_pre, mhc_pre, sinkhorn

CPU = torch.device("cpu")


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _params(d: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gate logits of order 1 (m ~ N(0, 1)), the regime where 20 Sinkhorn rounds converge to 1e-3."""
    g = _gen(seed)
    fn = torch.randn(24, 4 * d, generator=g) / math.sqrt(4 * d)
    return fn, 0.5 * torch.randn(24, generator=g), 0.5 + 0.5 * torch.rand(3, generator=g)


def _stream(t: int, d: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(t, 4, d, generator=_gen(seed)).bfloat16()


# ---------------------------------------------------------------- semantics

def test_sinkhorn_comb_is_doubly_stochastic_and_post_in_range() -> None:
    """mhc_pre's comb is doubly stochastic and positive, post in range."""
    x = _stream(33, 64)
    y, post, comb = mhc_pre(x, *_params(64))
    assert y.dtype == torch.bfloat16 and y.shape == (33, 64)
    assert post.dtype == comb.dtype == torch.float32 and comb.shape == (33, 4, 4)
    assert bool((comb > 0).all())
    torch.testing.assert_close(comb.sum(-1), torch.ones(33, 4), rtol=0, atol=1e-3)
    torch.testing.assert_close(comb.sum(-2), torch.ones(33, 4), rtol=0, atol=1e-3)
    assert bool(((post > 0) & (post < 2)).all())


def test_sinkhorn_columns_are_normalised_last_even_for_sharp_logits() -> None:
    """Sinkhorn normalises columns last, staying finite for sharp logits."""
    logits = 8.0 * torch.randn(64, 4, 4, generator=_gen(9))
    comb = sinkhorn(logits, 20, 1e-6)
    torch.testing.assert_close(comb.sum(-2), torch.ones(64, 4), rtol=0, atol=1e-5)
    assert bool(torch.isfinite(comb).all() and (comb > 0).all())


def test_sinkhorn_first_step_is_row_softmax_then_column_normalisation() -> None:
    """Sinkhorn's first step is a row softmax then column normalisation."""
    logits = torch.tensor([[[0.0, 1.0, 2.0, 3.0], [1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 5.0, 0.0], [2.0, 2.0, 2.0, 2.0]]])
    one = sinkhorn(logits, 1, 0.0)
    soft = torch.softmax(logits, -1)
    torch.testing.assert_close(one, soft / soft.sum(-2, keepdim=True))
    many = sinkhorn(logits, 20, 1e-6)
    assert (many.sum(-1) - 1).abs().max() < (one.sum(-1) - 1).abs().max()  # iterations fix the rows too


def test_mhc_pre_hand_example_with_zero_mixing_weights() -> None:
    """fn = 0 makes every gate logit its bias: pre = sigmoid(b)+eps, post = 2 sigmoid(b), comb from b alone."""
    x = _stream(2, 8)
    base = torch.zeros(24)
    base[0], base[1] = math.log(3.0), -math.log(3.0)  # sigmoid = 0.75, 0.25
    base[4] = math.log(3.0)
    y, post, comb = mhc_pre(x, torch.zeros(24, 32), base, torch.ones(3), hc_eps=0.0)
    torch.testing.assert_close(post, torch.tensor([[1.5, 1.0, 1.0, 1.0]] * 2))
    torch.testing.assert_close(comb, torch.full((2, 4, 4), 0.25))
    expected = 0.75 * x[:, 0].float() + 0.25 * x[:, 1].float() + 0.5 * x[:, 2].float() + 0.5 * x[:, 3].float()
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y.float(), expected, rtol=2**-8, atol=1e-6)  # one bf16 rounding


def test_mhc_pre_gates_ignore_stream_scale() -> None:
    """m is normalised by the stream's RMS, so scaling x by 2 (exact in bf16) changes y only."""
    x = _stream(8, 64)
    p = _params(64, 3)
    y1, post1, comb1 = mhc_pre(x, *p)
    y2, post2, comb2 = mhc_pre(x * 2, *p)
    torch.testing.assert_close(post1, post2)
    torch.testing.assert_close(comb1, comb2)
    torch.testing.assert_close(y2.float(), y1.float() * 2, rtol=2**-7, atol=0)  # within a bf16 ulp


def test_mhc_post_hand_example() -> None:
    """mhc_post on a hand-built example gives the hand-computed streams."""
    f = torch.tensor([[1.0, -2.0]]).bfloat16()
    x = torch.tensor([[[1.0, 0.0], [0.0, 1.0], [2.0, 2.0], [-1.0, 4.0]]]).bfloat16()
    post = torch.tensor([[1.0, 0.5, 0.0, 2.0]])
    comb = torch.zeros(1, 4, 4)
    comb[0, 0, 1] = 1.0  # stream 0 -> target 1
    comb[0, 2, 3], comb[0, 3, 3] = 0.5, 0.25  # targets 3 mixes streams 2 and 3
    out = mhc_post(f, x, post, comb)
    expected = torch.tensor([[[1.0, -2.0], [1.5, -1.0], [0.0, 0.0], [2.75, -2.0]]])
    assert out.dtype == torch.bfloat16
    assert torch.equal(out.float(), expected)


def test_mhc_head_hand_example() -> None:
    """mhc_head on hand-picked parameters gives the hand-computed weighted stream sum."""
    x = _stream(3, 16)
    base = torch.tensor([0.0, math.log(3.0), 0.0, 0.0])
    y = mhc_head(x, torch.zeros(4, 64), base, torch.ones(1), hc_eps=0.0)
    expected = 0.5 * x[:, 0].float() + 0.75 * x[:, 1].float() + 0.5 * (x[:, 2].float() + x[:, 3].float())
    assert y.shape == (3, 16) and y.dtype == torch.bfloat16
    torch.testing.assert_close(y.float(), expected, rtol=2**-8, atol=1e-6)


# ---------------------------------------------------------------- contracts

def _pre_args(d: int = 16) -> dict:
    fn, base, scale = _params(d)
    return {"x": _stream(3, d), "fn": fn, "base": base, "scale": scale}


def _post_args(d: int = 16) -> dict:
    return {"f": torch.zeros(3, d).bfloat16(), "x": _stream(3, d), "post": torch.ones(3, 4),
            "comb": torch.full((3, 4, 4), 0.25)}


def test_validators_accept_good_arguments() -> None:
    """The mHC validators accept good arguments, hc_eps 0 included for mhc_head."""
    contract.validate_mhc_pre(**_pre_args(), checked=True)
    contract.validate_mhc_post(**_post_args(), checked=True)
    a = _pre_args()
    contract.validate_mhc_head(a["x"], a["fn"][:4], a["base"][:4], a["scale"][:1], checked=True)
    contract.validate_mhc_head(a["x"], a["fn"][:4], a["base"][:4], a["scale"][:1], hc_eps=0.0)  # no Sinkhorn
    contract.validate_mhc_post_pre(**_post_args(), **{k: v for k, v in _pre_args().items() if k != "x"},
                                   checked=True)
    assert contract.case_mhc_pre(**_pre_args()) == {"hidden": 16, "sinkhorn_iters": 20}
    assert contract.case_mhc_post(**_post_args()) == {"hidden": 16}
    contract.validate_mhc_post(f=torch.zeros(3, 0).bfloat16(), x=torch.zeros(3, 4, 0).bfloat16(),
                               post=torch.ones(3, 4), comb=torch.ones(3, 4, 4))  # post has no RMS: d = 0 is fine


@pytest.mark.parametrize(
    "change",
    [
        {"x": torch.zeros(3, 4, 16)},
        {"x": torch.zeros(3, 2, 16).bfloat16()},
        {"fn": torch.zeros(24, 16)},
        {"fn": torch.zeros(24, 64).bfloat16()},
        {"base": torch.zeros(16)},
        {"scale": torch.ones(1)},
        {"sinkhorn_iters": 0},
        {"rms_eps": float("nan")},
        {"rms_eps": 0.0},  # an all-zero token would give 0 * inf = NaN
        {"hc_eps": 0.0},  # a column of underflowed softmax entries gives 0 / 0 in the Sinkhorn
        {"hc_eps": True},
    ],
)
def test_validate_mhc_pre_rejects(change: dict) -> None:
    """mhc_pre validation refuses each bad shape, dtype, iteration count or epsilon."""
    with pytest.raises(InvalidArgumentError):
        contract.validate_mhc_pre(**{**_pre_args(), **change})


@pytest.mark.parametrize(
    "change",
    [
        {"f": torch.zeros(3, 16)},
        {"f": torch.zeros(3, 8).bfloat16()},
        {"post": torch.ones(3, 4).bfloat16()},
        {"post": torch.ones(2, 4)},
        {"comb": torch.ones(3, 16)},
        {"x": torch.zeros(3, 4, 16, dtype=torch.float16)},
    ],
)
def test_validate_mhc_post_rejects(change: dict) -> None:
    """mhc_post validation refuses each bad shape or dtype."""
    with pytest.raises(InvalidArgumentError):
        contract.validate_mhc_post(**{**_post_args(), **change})


def test_validate_rejects_hidden_size_zero() -> None:
    """Hidden size 0 (the RMS of no values is 0/0, a NaN) is a typed error for every gated op."""
    x = torch.zeros(2, 4, 0).bfloat16()
    fn, base, scale = torch.zeros(24, 0), torch.zeros(24), torch.ones(3)
    with pytest.raises(InvalidArgumentError, match="hidden size"):
        contract.validate_mhc_pre(x, fn, base, scale)
    with pytest.raises(InvalidArgumentError, match="hidden size"):
        contract.validate_mhc_head(x, fn[:4], base[:4], scale[:1])
    with pytest.raises(InvalidArgumentError, match="hidden size"):
        contract.validate_mhc_post_pre(torch.zeros(2, 0).bfloat16(), x, torch.ones(2, 4), torch.ones(2, 4, 4), fn,
                                       base, scale)


def test_refused_inputs_are_the_ones_that_give_nan_and_the_platform_refuses_them() -> None:
    """The reference shows why rms_eps = 0 and hc_eps = 0 are refused; the smallest accepted values stay finite."""
    import dsv4hal

    x = _stream(2, 16)
    x[0] = 0
    fn, base, scale = _params(16)
    y, post, comb = mhc_pre(x, fn, base, scale, rms_eps=0.0)
    assert bool(torch.isnan(post[0]).all())  # the defect: 0 * rsqrt(0)
    y, post, comb = mhc_pre(x, fn, base, scale, rms_eps=1e-30)
    assert all(bool(torch.isfinite(v).all()) for v in (y, post, comb)) and bool((y[0] == 0).all())
    torch.testing.assert_close(post[0], 2 * torch.sigmoid(base[4:8]))  # m = 0 for a zero token
    sharp = torch.zeros(1, 4, 4)
    sharp[..., 0] = -200.0  # column 0's softmax entries underflow to 0
    assert bool(torch.isnan(sinkhorn(sharp, 2, 0.0)).any()) and bool(torch.isfinite(sinkhorn(sharp, 2, 1e-6)).all())
    ops = dsv4hal.select_platform("cpu").ops
    with pytest.raises(InvalidArgumentError, match="rms_eps"):
        ops.mhc_pre(x, fn, base, scale, rms_eps=0.0)
    with pytest.raises(InvalidArgumentError, match="hidden size"):
        ops.mhc_pre(torch.zeros(2, 4, 0).bfloat16(), torch.zeros(24, 0), base, scale)


def test_post_pre_is_post_then_pre_on_the_stored_stream() -> None:
    """mhc_post_pre equals mhc_post then mhc_pre on the stored stream."""
    a = _pre_args()
    p = _post_args()
    p["f"] = torch.randn(3, 16, generator=_gen(4)).bfloat16()
    stream, y, post, comb = mhc_post_pre(**p, fn=a["fn"], base=a["base"], scale=a["scale"], sinkhorn_iters=3)
    want = mhc_post(**p)
    assert stream.dtype == torch.bfloat16 and torch.equal(stream, want)
    for got, exp in zip((y, post, comb), mhc_pre(want, a["fn"], a["base"], a["scale"], sinkhorn_iters=3), strict=True):
        assert torch.equal(got, exp)


def test_validate_mhc_head_rejects_pre_sized_parameters() -> None:
    """mhc_head validation refuses mhc_pre-sized parameters."""
    a = _pre_args()
    with pytest.raises(InvalidArgumentError):
        contract.validate_mhc_head(a["x"], a["fn"], a["base"], a["scale"])


def test_checked_mode_catches_nan() -> None:
    """Checked mHC validation refuses NaN inputs; unchecked mode does not look."""
    pre = _pre_args()
    pre["x"][1, 2, 3] = float("nan")
    contract.validate_mhc_pre(**pre)  # unchecked mode reads no values
    with pytest.raises(InvalidArgumentError, match="finite"):
        contract.validate_mhc_pre(**pre, checked=True)
    post = _post_args()
    post["comb"][0, 1, 1] = float("inf")
    contract.validate_mhc_post(**post)
    with pytest.raises(InvalidArgumentError, match="comb"):
        contract.validate_mhc_post(**post, checked=True)


# ---------------------------------------------------------------- catalog

def test_catalog_shape() -> None:
    """The mHC catalog covers the four ops at edge token counts and a range case."""
    ops = {c.op for c in cases_mhc.CASES}
    assert ops == {"mhc_pre", "mhc_post", "mhc_post_pre", "mhc_head"} and set(cases_mhc.TOLERANCES) == ops
    for op in ops:
        cpu = [c for c in cases_mhc.CASES if c.op == op and not c.gpu_only]
        assert {c.params["tokens"] for c in cpu} >= {0, 1, 7, 8, 33} and {c.params["hidden"] for c in cpu} == {64}
        assert any(c.params.get("range") for c in cpu)
        assert any(c.params.get("iters") == 1 for c in cpu) == (op in ("mhc_pre", "mhc_post_pre"))
        big = {(c.params["hidden"], c.params["tokens"]) for c in cases_mhc.CASES if c.op == op and c.gpu_only}
        assert big >= {(d, t) for d in (4096, 7168) for t in (1, 7, 64, 4096)}
        assert all(c.modes == ("eager", "graph") for c in cases_mhc.CASES if c.op == op)


REFERENCES = {"mhc_pre": mhc_pre, "mhc_post": mhc_post, "mhc_post_pre": mhc_post_pre, "mhc_head": mhc_head}
VALIDATORS = {"mhc_pre": contract.validate_mhc_pre, "mhc_post": contract.validate_mhc_post,
              "mhc_post_pre": contract.validate_mhc_post_pre, "mhc_head": contract.validate_mhc_head}


def _run(spec, fx) -> tuple[float, bool, str]:
    got = REFERENCES[spec.op](**fx.args)
    return fx.compare(got, fx.expected) if fx.compare else compare_close(got, fx.expected, fx.tolerance)


@pytest.mark.parametrize("spec", [c for c in cases_mhc.CASES if not c.gpu_only], ids=lambda c: f"{c.op}-{c.name}")
def test_catalog_fixture_passes_on_reference(spec) -> None:
    """Every CPU mHC catalog fixture validates and passes on the reference."""
    fx = cases_mhc.build(spec, CPU, _gen(5))
    VALIDATORS[spec.op](**fx.args, checked=True)
    err, ok, detail = _run(spec, fx)
    assert ok, detail


def test_catalog_comparisons_catch_wrong_results() -> None:
    """The mHC comparisons fail transposed comb, shifted post and NaN outputs."""
    pre_spec = next(c for c in cases_mhc.CASES if c.op == "mhc_pre" and c.name == "d64_t8")
    fx = cases_mhc.build(pre_spec, CPU, _gen(5))
    y, post, comb = mhc_pre(**fx.args)
    assert not fx.compare((y, post, comb.transpose(-1, -2)), fx.expected)[1]
    assert not fx.compare((y, post + 2e-3, comb), fx.expected)[1]  # post/comb bound is 1e-3, not bf16's
    y_nan = y.clone()
    y_nan[0, 0] = float("nan")
    assert not fx.compare((y_nan, post, comb), fx.expected)[1]
    post_spec = next(c for c in cases_mhc.CASES if c.op == "mhc_post" and c.name == "d64_t8")
    fx = cases_mhc.build(post_spec, CPU, _gen(5))
    args = {**fx.args, "comb": fx.args["comb"].transpose(-1, -2)}
    assert not fx.compare(mhc_post(**args), fx.expected)[1]
    spec = next(c for c in cases_mhc.CASES if c.op == "mhc_post_pre" and c.name == "d64_t7_range")
    fx = cases_mhc.build(spec, CPU, _gen(5))
    stream, y, post, comb = mhc_post_pre(**fx.args)
    assert fx.compare((stream, y, post, comb), fx.expected)[1]
    assert not fx.compare((stream, y, post, comb.transpose(-1, -2)), fx.expected)[1]
    worst = stream.float().abs().amax(dim=(1, 2)).argmax()
    bad = stream.clone()
    bad[worst, 0, 0] += bad[worst].float().abs().max() * 0.05  # 5% of the token's scale, however large it is
    assert not fx.compare((bad, y, post, comb), fx.expected)[1]
    spec = next(c for c in cases_mhc.CASES if c.op == "mhc_head" and c.name == "d64_t8")
    fx = cases_mhc.build(spec, CPU, _gen(5))
    y = mhc_head(**fx.args)
    assert fx.compare(y, fx.expected)[1] and not fx.compare(y.flip(0), fx.expected)[1]
