"""fp8_grouped_linear: the reference is fp8_linear's group by group; the Triton kernel (under the interpreter on the
CPU) against the contract's float64 oracle and the reference over drawn shapes, its groups bit-equal to fp8_linear's
launches, strided views of x and the weight, split-K and its launch rule counting every group's tiles, NaN rows, no
tokens, the case, per-group weight quantization and the NaN cases' comparison. The checks it shares with fp8_linear
(typed errors of bad calls, checked mode, the CPU conformance cells, torch.compile) are in test_linear_contracts.py."""

from __future__ import annotations

import pytest
import torch
from conftest import TRITON_DEVICE
from hypothesis import given, settings
from hypothesis import strategies as st

import dsv4hal
from dsv4hal.conformance import cases_linear as cases
from dsv4hal.ops import linear as contract
from dsv4hal.reference.linear import fp8_grouped_linear as reference
from dsv4hal.reference.linear import fp8_linear as linear_reference

pytest.importorskip("triton")
from dsv4hal.kernels.triton import fp8_linear as triton_linear  # noqa: E402

DEV = TRITON_DEVICE
CPU = torch.device("cpu")
FLAVOURS = ("e4m3fn", "e4m3fnuz")


def _inputs(t: int, g: int, n: int, k: int, fp8: str = "e4m3fn", kind: str = "random", seed: int = 0,
            dev: torch.device = DEV) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    spec = cases._grouped_case("test", t, g, n, k, fp8, kind)
    fx = cases.build(spec, dev, torch.Generator().manual_seed(seed))
    return fx.args["x"], fx.args["weight"], fx.args["weight_scale"]


@pytest.mark.parametrize("fp8", FLAVOURS)
def test_reference_is_fp8_linear_group_by_group_and_within_the_contract(fp8: str) -> None:
    """Each group of the reference's output is fp8_linear's reference on that group, bit for bit, and the whole is
    within the conformance bound of the contract's exact sums (a partial last weight block included)."""
    x, w, s = _inputs(7, 3, 200, 384, fp8, "outliers", dev=CPU)
    out = reference(x, w, s)
    assert out.shape == (7, 3, 200) and out.dtype == torch.bfloat16
    for g in range(3):
        assert torch.equal(out[:, g], linear_reference(x[:, g], w[g], s[g])), g
    assert cases.within_bound(out, x, w, s, fp8) == ""


@settings(max_examples=20, deadline=None, database=None, derandomize=True)
@given(t=st.integers(0, 70), g=st.integers(1, 8), n=st.sampled_from([128, 200, 256]), kb=st.integers(1, 3),
       fp8=st.sampled_from(FLAVOURS), kind=st.sampled_from(cases.KINDS))
def test_triton_matches_the_contract_and_the_reference_over_drawn_shapes(t: int, g: int, n: int, kb: int, fp8: str,
                                                                       kind: str) -> None:
    """Over drawn T (0 included), G, N (whole and partial last blocks), K and flavours, the Triton kernel is within
    the conformance bound of the contract's exact sums, and within two bf16 roundings of the reference."""
    x, w, s = _inputs(t, g, n, 128 * kb, fp8, kind, seed=t * 31 + g * 7 + n + kb)
    got = triton_linear.fp8_grouped_linear(x, w, s)
    assert cases.within_bound(got, x, w, s, fp8) == ""
    want, mag = cases.grouped_oracle(x, w, s, fp8)
    ref = reference(x, w, s)
    assert bool(((got.double() - ref.double()).abs() <= 2.0**-7 * want.abs() + 2 * cases.SUM_SLACK * mag).all())


@pytest.mark.parametrize("splits", [1, 3])
def test_each_group_of_a_launch_is_fp8_linears_launch_on_that_group(splits: int) -> None:
    """With one launch configuration, group g of the grouped kernel's output is the fp8_linear launch on x[:, g],
    weight[g], weight_scale[g] bit for bit (one kernel: fp8_linear is the case G = 1)."""
    x, w, s = _inputs(6, 4, 200, 3 * 128, seed=splits)
    per = -(-3 // splits)
    cfg = triton_linear.Config(block_m=16, splits=-(-3 // per), blocks_per_split=per)
    got = triton_linear.launch(x, w, s, cfg)
    for g in range(4):
        assert torch.equal(got[:, g], triton_linear.launch(x[:, g], w[g], s[g], cfg)), g


def test_strided_views_of_x_and_the_weight_give_the_dense_result() -> None:
    """x as the attention output's view o.view(T, G, K), as groups sliced from a wider buffer, and a weight and scales
    sliced from larger tensors (strides other than the dense ones) give the result of dense copies, bit for bit."""
    x, w, s = _inputs(5, 4, 128, 256, seed=3)
    want = triton_linear.fp8_grouped_linear(x, w, s)
    o = x.reshape(5, 8, 128)  # [T, H, 512]-like: heads of 128 columns, two to a group
    assert torch.equal(triton_linear.fp8_grouped_linear(o.view(5, 4, 256), w, s), want)
    wide = torch.zeros(5, 6, 256, dtype=x.dtype, device=x.device)
    wide[:, 1:5] = x
    assert torch.equal(triton_linear.fp8_grouped_linear(wide[:, 1:5], w, s), want)
    padded = torch.zeros(5, 4, 384, dtype=x.dtype, device=x.device)  # the group stride 384, not K
    padded[..., :256] = x
    assert torch.equal(triton_linear.fp8_grouped_linear(padded[..., :256], w, s), want)
    w_big = torch.zeros(6, 256, 256, dtype=torch.uint8, device=x.device)
    w_big[1:5, :128] = w.view(torch.uint8)
    s_big = torch.zeros(4, 3, 5, device=x.device)
    s_big[:, 1:2, 2:4] = s
    got = triton_linear.fp8_grouped_linear(x, w_big[1:5, :128].view(w.dtype), s_big[:, 1:2, 2:4])
    assert torch.equal(got, want)


@pytest.mark.parametrize("splits", [2, 5])
def test_split_k_sums_are_deterministic_and_within_the_contract(splits: int) -> None:
    """Any split of K across every group gives results within the bound, and the same launch twice the same bits."""
    x, w, s = _inputs(3, 8, 128, 5 * 128)
    per = -(-5 // splits)
    cfg = triton_linear.Config(block_m=16, splits=-(-5 // per), blocks_per_split=per)
    first = triton_linear.launch(x, w, s, cfg)
    assert cases.within_bound(first, x, w, s, "e4m3fn") == ""
    assert torch.equal(first, triton_linear.launch(x, w, s, cfg))


@pytest.mark.parametrize(("t", "g", "n", "k", "block_m", "splits"), [
    (1, 8, 1024, 4096, 16, 5),  # wo_a at decode: 64 tiles over 8 groups, 5 splits of 7 blocks
    (64, 8, 1024, 4096, 64, 5),
    (4096, 8, 1024, 4096, 64, 1),  # prefill: 4096 tiles
    (1, 1, 1024, 4096, 16, 32),  # one group: fp8_linear's wq_a
    (0, 8, 1024, 4096, 16, 5),  # no tokens: the grid is empty whatever the split
])
def test_launch_rule_counts_every_groups_tiles(t: int, g: int, n: int, k: int, block_m: int, splits: int) -> None:
    """On 132 SMs the split-K rule counts the tiles of every group (G times one group's), so 8 groups split K less
    than one would; one group is fp8_linear's launch."""
    cfg = triton_linear.config(t, n, k, 132, groups=g)
    assert (cfg.block_m, cfg.splits) == (block_m, splits)
    kb = k // 128
    assert (cfg.splits - 1) * cfg.blocks_per_split < kb <= cfg.splits * cfg.blocks_per_split
    if g == 1:
        assert cfg == triton_linear.config(t, n, k, 132)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy on the NaN (the interpreter)
@pytest.mark.parametrize("fp8", FLAVOURS)
@pytest.mark.parametrize("impl", ["reference", "triton"])
def test_a_nan_in_x_makes_only_its_token_groups_row_nan(impl: str, fp8: str) -> None:
    """A NaN in x[t, g] makes out[t, g] NaN and leaves every other (token, group) row, the same token's other groups
    included, as it was."""
    fn = reference if impl == "reference" else triton_linear.fp8_grouped_linear
    x, w, s = _inputs(4, 3, 256, 256, fp8)
    clean = fn(x, w, s)
    x[2, 1, 130] = float("nan")
    got = fn(x, w, s)
    assert bool(torch.isnan(got[2, 1]).all())
    nan_rows = got.isnan().any(-1)
    assert int(nan_rows.sum()) == 1
    assert torch.equal(got[~nan_rows], clean[~nan_rows])


@pytest.mark.parametrize("impl", ["reference", "triton", "platform"])
def test_no_tokens_give_an_empty_bf16_output(impl: str) -> None:
    """T = 0 returns a [0, G, N] bf16 tensor (the platform's op, the reference and the kernel)."""
    x, w, s = _inputs(0, 8, 200, 256, dev=CPU if impl == "platform" else DEV)
    fn = {"reference": reference, "triton": triton_linear.fp8_grouped_linear,
          "platform": dsv4hal.select_platform("cpu").ops.fp8_grouped_linear}[impl]
    out = fn(x, w, s)
    assert out.shape == (0, 8, 200) and out.dtype == torch.bfloat16


def test_case_names_the_flavour_token_class_of_t_and_partial_block() -> None:
    """The case says the weight's FP8 flavour, the class of T (not T * G) and whether N leaves a partial block."""
    x, w, s = _inputs(9, 8, 200, 128, "e4m3fnuz", dev=CPU)
    assert contract.case(x, w, s) == {"fp8": "e4m3fnuz", "tokens": "decode", "partial_block": True}
    x, w, s = _inputs(1, 8, 256, 128, dev=CPU)
    assert contract.case(x, w, s) == {"fp8": "e4m3fn", "tokens": "few", "partial_block": False}
    assert contract.key(x, w, s) == (torch.float8_e4m3fn, "few", False)


def test_quantize_fp8_block_makes_a_grouped_weight_per_group() -> None:
    """dsv4hal.quantize_fp8_block of a [G, N, K] tensor gives each group's blocks (no block spans two groups): group
    g's codes and scales are those of quantizing w[g] alone, N = 200 leaving a partial block in each group."""
    w = torch.randn(3, 200, 256, generator=torch.Generator().manual_seed(1))
    q, s = dsv4hal.quantize_fp8_block(w)
    assert q.shape == (3, 200, 256) and s.shape == (3, 2, 2)
    for g in range(3):
        qg, sg = dsv4hal.quantize_fp8_block(w[g])
        assert torch.equal(q[g].view(torch.uint8), qg.view(torch.uint8)) and torch.equal(s[g], sg)


def test_the_nan_comparison_fails_a_result_with_nan_elsewhere_or_missing() -> None:
    """The conformance comparison of the NaN cases fails an output whose NaNs are not exactly the oracle's rows,
    and one whose finite rows are off the bound."""
    spec = next(c for c in cases.CASES_GROUPED if c.params["nan_at"] and c.params["fp8"] == "e4m3fn")
    fx = cases.build(spec, CPU, torch.Generator().manual_seed(0))
    good = reference(**fx.args)
    assert fx.compare(good, fx.expected)[1]
    extra = good.clone()
    extra[0, 0, 0] = float("nan")
    missing = good.nan_to_num()
    off = good.clone()
    off[0, 0] *= 1.1
    for bad in (extra, missing, off):
        assert not fx.compare(bad, fx.expected)[1]
