"""fp8_linear: the reference against the contract's math in float64 (and by hand), the Triton kernel (under the
interpreter on the CPU) against both over drawn shapes, split-K and its launch rule, non-finite inputs, the typed
errors of bad calls, the CPU conformance cells, torch.compile, and the weight maker quantize_fp8_block."""

from __future__ import annotations

import pytest
import torch
from conftest import TRITON_DEVICE, on_the_cpu
from hypothesis import given, settings
from hypothesis import strategies as st

import dsv4hal
from dsv4hal import custom_ops
from dsv4hal.conformance import cases_linear as cases
from dsv4hal.conformance.runner import run_conformance
from dsv4hal.errors import Dsv4HalError, InvalidArgumentError
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


def _within_contract(got: torch.Tensor, x: torch.Tensor, w: torch.Tensor, s: torch.Tensor, fp8: str) -> str:
    """'' when got is within the conformance bound of the contract's exact result, else why."""
    want, mag = cases.oracle(x, w, s, fp8)
    assert got.dtype == torch.bfloat16 and got.shape == want.shape
    _, ok, detail = cases.compare_close(got, want, cases.TOLERANCE, slack=cases.SUM_SLACK * mag)
    return "" if ok else detail


@pytest.mark.parametrize("fp8", FLAVOURS)
def test_reference_is_the_contracts_float64_math(fp8: str) -> None:
    """The reference's output is within one bf16 rounding (and the fp32-sum slack) of the contract's exact sums, for
    every activation kind, a partial last weight block included."""
    for kind in cases.KINDS:
        x, w, s = _inputs(9, 200, 384, fp8, kind)
        assert _within_contract(reference(x, w, s), x, w, s, fp8) == "", kind


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
    assert _within_contract(got, x, w, s, fp8) == ""
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
    assert _within_contract(first, x, w, s, "e4m3fn") == ""
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


def _args() -> dict:
    """A valid call on the CPU (the CPU platform's)."""
    x, w, s = _inputs(3, 256, 256, dev=CPU)
    return {"x": x, "weight": w, "weight_scale": s}


@pytest.mark.parametrize(("change", "arg", "remedy"), [
    (lambda a: {**a, "x": a["x"].float()}, "x", ".to(torch.bfloat16)"),
    (lambda a: {**a, "x": a["x"][:, :200]}, "x", "pad x"),
    (lambda a: {**a, "x": a["x"][:, :128], "weight": a["weight"][:, :128]}, "weight_scale", "quantize_fp8_block"),
    (lambda a: {**a, "weight": a["weight"][:, :128]}, "weight", "[out_features, in_features]"),
    (lambda a: {**a, "weight": a["weight"].view(torch.uint8)}, "weight", "view(torch.float8_e4m3fn)"),
    (lambda a: {**a, "weight": a["weight"].float()}, "weight", "quantize_fp8_block"),
    (lambda a: {**a, "weight": a["weight"][:0]}, "weight", "[out_features, in_features]"),
    (lambda a: {**a, "weight_scale": a["weight_scale"].double()}, "weight_scale", ".to(torch.float32)"),
    (lambda a: {**a, "weight_scale": a["weight_scale"][:, :1]}, "weight_scale", "quantize_fp8_block"),
    (lambda a: {**a, "weight_scale": a["weight_scale"].to("meta")}, "weight_scale", None),
    (lambda a: {**a, "weight": a["weight"].to("meta")}, "weight", None),
    (lambda a: {**a, "x": torch.cat([a["x"], a["x"]], 1)[:, ::2]}, "x", ".contiguous()"),
    (lambda a: {**a, "x": a["x"][0]}, "x", None),
    (lambda a: {**a, "x": a["x"][:1].expand(2**40, 256)}, "x", "smaller batch"),
])
def test_bad_calls_raise_typed_errors_naming_the_argument_and_remedy(change, arg: str, remedy: str | None) -> None:  # noqa: ANN001
    """Wrong dtypes, K not a multiple of 128, mismatched K, scale shapes or devices, a strided K and a huge output
    raise InvalidArgumentError naming the argument, with the remedy where there is one; nothing else is raised."""
    p = dsv4hal.select_platform("cpu")
    with pytest.raises(InvalidArgumentError) as e:
        p.ops.fp8_linear(**change(_args()))
    assert f"'{arg}'" in str(e.value)
    if remedy is not None:
        assert remedy in (e.value.remedy or ""), e.value.remedy


@pytest.mark.parametrize("arg", ["weight", "weight_scale"])
def test_the_contract_refuses_an_argument_on_another_device(arg: str) -> None:
    """validate refuses a weight or scale on another device than x, naming it and the move."""
    args = _args()
    args[arg] = args[arg].to("meta")
    with pytest.raises(InvalidArgumentError, match=f"'{arg}'") as e:
        contract.validate(**args)
    assert ".to('cpu')" in (e.value.remedy or "")


def test_the_contract_refuses_an_output_larger_than_the_device() -> None:
    """An expand view of x (no memory of its own) whose output would not fit the device is refused by the
    contract's output-size check."""
    args = _args()
    args["x"] = args["x"][:1].expand(2**36, 256)
    with pytest.raises(InvalidArgumentError, match=r"'x \(output size\)'"):
        contract.validate(**args)


def test_checked_mode_refuses_non_finite_values_and_unchecked_runs() -> None:
    """Checked mode refuses a NaN in x and an inf in weight_scale (reading values); unchecked mode runs the call."""
    args = _args()
    args["x"][1, 5] = float("nan")
    checked, unchecked = dsv4hal.select_platform("cpu", checked=True), dsv4hal.select_platform("cpu")
    with pytest.raises(InvalidArgumentError, match="'x'"):
        checked.ops.fp8_linear(**args)
    assert bool(torch.isnan(unchecked.ops.fp8_linear(**args)[1]).all())
    good = _args()
    good["weight_scale"][0, 1] = float("inf")
    with pytest.raises(InvalidArgumentError, match="'weight_scale'"):
        checked.ops.fp8_linear(**good)


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


@pytest.mark.parametrize("forced", [None, pytest.param("triton_fp8_linear", marks=on_the_cpu)])
def test_cpu_conformance_cells_pass(forced: str | None) -> None:
    """Every CPU conformance cell of fp8_linear passes, on the reference and with the Triton kernel forced."""
    with dsv4hal.overrides(kernels={"fp8_linear": forced} if forced else {}):
        report = run_conformance("cpu", ops=["fp8_linear"])
    cells = [c for c in report.cells if c.op == "fp8_linear" and c.status != "not-run"]
    assert len(cells) == sum(not s.gpu_only for s in cases.CASES)
    assert all(c.status == "pass" and c.implementation == (forced or "torch_reference") for c in cells), cells


def test_compiles_fullgraph_and_passes_opcheck() -> None:
    """torch.compile(fullgraph=True) of a function calling the op matches eager; its custom op passes opcheck (the
    schema check is left out: its allclose has no CPU kernel for float8); a bad argument under compile raises the
    contract's typed error."""
    p = dsv4hal.select_platform("cpu")
    x, w, s = _inputs(4, 256, 256, dev=CPU)
    fn = torch.compile(lambda x, w, s: p.ops.fp8_linear(x, w, s).float() * 2, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(fn(x, w, s), p.ops.fp8_linear(x, w, s).float() * 2)
    overload, flat = custom_ops.flatten(p.ops.fp8_linear, x, w, s)
    torch.library.opcheck(overload, flat, test_utils=("test_autograd_registration", "test_faketensor",
                                                      "test_aot_dispatch_dynamic"))
    torch._dynamo.reset()
    bad = torch.compile(lambda x, w, s: p.ops.fp8_linear(x, w, s), fullgraph=True, backend="aot_eager")
    with pytest.raises(InvalidArgumentError, match="'weight_scale'"):
        bad(x, w, s[:, :1])


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


def test_every_error_of_a_drawn_bad_call_is_typed() -> None:
    """Arguments of the wrong kind entirely (None, lists, scalars) give typed errors only."""
    p = dsv4hal.select_platform("cpu")
    a = _args()
    for name in a:
        for junk in (None, [1, 2], 3.0):
            with pytest.raises(Dsv4HalError):
                p.ops.fp8_linear(**{**a, name: junk})
