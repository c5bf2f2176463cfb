"""fp8_linear: the reference against the contract's math in float64 (and by hand), the Triton kernel (under the
interpreter on the CPU) against both over drawn shapes, split-K and its launch rule, non-finite inputs, the case,
and the weight maker quantize_fp8_block. The checks it shares with fp8_grouped_linear (typed errors of bad calls,
checked mode, the CPU conformance cells, torch.compile) are in test_linear_contracts.py."""

from __future__ import annotations

import pytest
import torch
from conftest import TRITON_DEVICE
from hypothesis import given, settings
from hypothesis import strategies as st

import dsv4hal
from dsv4hal.conformance import cases_linear as cases
from dsv4hal.errors import InvalidArgumentError
from dsv4hal.formats import fp8_block
from dsv4hal.ops import linear as contract
from dsv4hal.reference.linear import fp8_linear as reference

pytest.importorskip("triton")
from dsv4hal.kernels.triton import fp8_linear as triton_linear  # noqa: E402

DEV = TRITON_DEVICE
CPU = torch.device("cpu")
FLAVOURS = ("e4m3fn", "e4m3fnuz")


def _inputs(t: int, n: int, k: int, fp8: str = "e4m3fn", kind: str = "random", seed: int = 0,
            dev: torch.device = DEV) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    x = cases._activations(t, k, kind, gen)
    w, s = cases._weight(n, k, fp8, gen)
    return x.to(dev), w.to(dev), s.to(dev)


@pytest.mark.parametrize("fp8", FLAVOURS)
def test_reference_is_the_contracts_float64_math(fp8: str) -> None:
    """The reference's output is within one bf16 rounding (and the fp32-sum slack) of the contract's exact sums, for
    every activation kind, a partial last weight block included."""
    for kind in cases.KINDS:
        x, w, s = _inputs(9, 200, 384, fp8, kind)
        assert cases.within_bound(reference(x, w, s), x, w, s, fp8) == "", kind


@pytest.mark.parametrize(("fp8", "fp8_max"), [("e4m3fn", 448.0), ("e4m3fnuz", 240.0)])
def test_reference_by_hand_uses_the_flavours_max_and_the_amax_floor(fp8: str, fp8_max: float) -> None:
    """By hand, output n reading only x's 128-group n: a group of ones quantizes to FP8_MAX codes (scale 1/FP8_MAX)
    and gives exactly 128; a group of 1e-5, below the 1e-4 amax floor, gets scale 1e-4/FP8_MAX and codes rounded
    from x / that scale; a zero group gives 0."""
    k = 3 * 128
    x = torch.zeros(1, k)
    x[0, :128] = 1.0
    x[0, 128:256] = 1e-5
    w, s = dsv4hal.quantize_fp8_block(torch.eye(3).repeat_interleave(128, 1), fp8)  # row n: ones on group n
    assert torch.equal(s, torch.full((1, 3), 1.0 / fp8_max))
    out = reference(x.bfloat16(), w, s)
    sx = torch.tensor(1e-4, dtype=torch.float32) / fp8_max  # the floor's scale
    value = torch.tensor(1e-5).bfloat16().float() / sx
    code = value.to(torch.float8_e4m3fn if fp8 == "e4m3fn" else torch.float8_e4m3fnuz).float()
    assert code != value  # the code really is a rounding
    want = torch.tensor([[128.0, float(128 * code * sx), 0.0]]).bfloat16()
    assert torch.equal(out, want), (out, want)


@settings(max_examples=25, deadline=None, database=None, derandomize=True)
@given(t=st.integers(0, 70), n=st.sampled_from([128, 256, 384, 200, 1000]), kb=st.integers(1, 4),
       fp8=st.sampled_from(FLAVOURS), kind=st.sampled_from(cases.KINDS))
def test_triton_matches_the_contract_and_the_reference_over_drawn_shapes(t: int, n: int, kb: int, fp8: str,
                                                                       kind: str) -> None:
    """Over drawn T (0 included), N (whole and partial last blocks), K and flavours, the Triton kernel is within the
    conformance bound of the contract's exact sums, and within two bf16 roundings of the reference."""
    x, w, s = _inputs(t, n, 128 * kb, fp8, kind, seed=t * 31 + n + kb)
    got = triton_linear.fp8_linear(x, w, s)
    assert cases.within_bound(got, x, w, s, fp8) == ""
    want, mag = cases.oracle(x, w, s, fp8)
    ref = reference(x, w, s)
    assert bool(((got.double() - ref.double()).abs() <= 2.0**-7 * want.abs() + 2 * cases.SUM_SLACK * mag).all())


@pytest.mark.parametrize("splits", [1, 2, 3, 5])
def test_split_k_sums_are_deterministic_and_within_the_contract(splits: int) -> None:
    """Any split of K (the last split short when it does not divide) gives results within the bound, and the same
    launch twice gives the same bits (the splits are summed in order)."""
    x, w, s = _inputs(6, 256, 5 * 128)
    per = -(-5 // splits)
    cfg = triton_linear.Config(block_m=16, splits=-(-5 // per), blocks_per_split=per)
    first = triton_linear.launch(x, w, s, cfg)
    assert cases.within_bound(first, x, w, s, "e4m3fn") == ""
    assert torch.equal(first, triton_linear.launch(x, w, s, cfg))


@pytest.mark.parametrize(("t", "n", "k", "block_m", "splits"), [
    (1, 512, 4096, 16, 32),  # wkv at decode: 4 column tiles, one k-block a split, 128 programs
    (1, 1024, 4096, 16, 32),  # wq_a
    (1, 4096, 8192, 16, 8),  # wo_b: 32 tiles, 8 splits of 8 blocks
    (1, 32768, 1024, 16, 1),  # wq_b: 256 tiles fill the GPU unsplit
    (64, 512, 4096, 64, 32),  # wkv at 64 tokens: 32 splits of one block, 4 MiB of partials
    (17, 1024, 4096, 32, 32),
    (4096, 512, 4096, 64, 1),  # prefill: 256 tiles
    (0, 512, 4096, 16, 32),  # no tokens: the grid is empty whatever the split
])
def test_launch_rule_covers_an_h200_and_bounds_the_workspace(t: int, n: int, k: int, block_m: int,
                                                             splits: int) -> None:
    """On 132 SMs: BLOCK_M holds every decode token, K splits only while the column tiles are fewer than the SMs,
    every split gets at least one k-block, and splits * T stays within SPLIT_ROWS."""
    cfg = triton_linear.config(t, n, k, 132)
    assert (cfg.block_m, cfg.splits) == (block_m, splits)
    kb = k // 128
    assert (cfg.splits - 1) * cfg.blocks_per_split < kb <= cfg.splits * cfg.blocks_per_split
    assert cfg.splits == 1 or cfg.splits * max(t, 1) <= triton_linear.SPLIT_ROWS


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy on the NaN (the interpreter)
@pytest.mark.parametrize("fp8", FLAVOURS)
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
@pytest.mark.parametrize("impl", ["reference", "triton"])
def test_a_non_finite_x_element_makes_its_row_nan(impl: str, bad: float, fp8: str) -> None:
    """A NaN or inf in x makes its token's output row NaN (its FP8 code is NaN) and leaves every other row as it was."""
    fn = reference if impl == "reference" else triton_linear.fp8_linear
    x, w, s = _inputs(5, 256, 256, fp8)
    clean = fn(x, w, s)
    x[2, 130] = bad
    got = fn(x, w, s)
    assert bool(torch.isnan(got[2]).all())
    keep = [0, 1, 3, 4]
    assert torch.equal(got[keep], clean[keep])


@pytest.mark.parametrize("t", [0, 1, 5, 8, 70])
def test_quantize_tokens_gives_act_quant_1x128s_bytes_in_deepgemms_scale_layout(t: int) -> None:
    """The MoE quantizer's token pass (exact divisions) gives the bytes and scales of the reference's
    act_quant_1x128, the scales MN-major with the row pitch T rounded up to 4 (TMA-aligned)."""
    from dsv4hal.kernels.triton.moe_quant import quantize_tokens

    x, _, _ = _inputs(t, 128, 384, kind="outliers")
    codes, scales = quantize_tokens(x)
    want_codes, want_scales = fp8_block.act_quant_1x128(x)
    assert torch.equal(codes, want_codes.view(torch.uint8)) and torch.equal(scales, want_scales)
    assert scales.shape == (t, 3) and (t == 0 or scales.stride() == (1, -(-t // 4) * 4))


def test_case_and_key_name_the_flavour_token_class_and_partial_block() -> None:
    """The case says the weight's FP8 flavour, the token class and whether N leaves a partial 128-row block."""
    x, w, s = _inputs(65, 200, 128, "e4m3fnuz")
    assert contract.case(x, w, s) == {"fp8": "e4m3fnuz", "tokens": "prefill", "partial_block": True}
    x, w, s = _inputs(1, 256, 128)
    assert contract.case(x, w, s) == {"fp8": "e4m3fn", "tokens": "few", "partial_block": False}
    assert contract.key(x, w, s) == (torch.float8_e4m3fn, "few", False)


def test_quantize_fp8_block_is_exported_and_refuses_bad_input_typed() -> None:
    """dsv4hal.quantize_fp8_block is the formats' function: [N, K] -> (FP8 [N, K], fp32 [ceil(N/128), ceil(K/128)]);
    a non-tensor, an integer or FP8 tensor, a rank-1 tensor, an unknown flavour or block raise typed errors."""
    assert dsv4hal.quantize_fp8_block is fp8_block.quantize_fp8_block
    w, s = dsv4hal.quantize_fp8_block(torch.randn(200, 256).bfloat16())
    assert (w.dtype, tuple(w.shape), s.dtype, tuple(s.shape)) == (torch.float8_e4m3fn, (200, 256), torch.float32,
                                                                  (2, 2))
    for bad, kw in ((None, {}), (torch.ones(4, 4, dtype=torch.int32), {}), (w, {}), (torch.ones(4), {}),
                    (torch.ones(4, 4), {"fp8": "e5m2"}), (torch.ones(4, 4), {"block": 0})):
        with pytest.raises(InvalidArgumentError):
            dsv4hal.quantize_fp8_block(bad, **kw)
