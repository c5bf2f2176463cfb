"""The fp8_grouped_linear binding to DeepGEMM's fp8_einsum (dsv4hal_cuda_sm90.deepgemm_grouped_linear) against a
fake `deep_gemm` whose fp8_einsum checks what DeepGEMM 2.5.0's SM90 path needs (docs/vendor-apis.md 2.2b: the
expression "bhr,hdr->bhd", K-major e4m3fn A [T, G, K] and B [G, N, K], fp32 SFA [T, G, K/128] (any strides: DeepGEMM
copies them into its TMA-aligned layout; the fake reads them through their strides, as that copy does), fp32 SFB
[G, ceil(N/128), K/128] contiguous, bf16 D [T, G, N] with unit stride along N, no C, the default recipe) and then
computes D in float64 from the codes and scales it was given. The Triton quantizer runs under the interpreter, so the
whole path is checked against the contract's float64 oracle; DeepGEMM's kernel itself is not (that is the GPU
conformance). Also its selection on simulated Hopper."""

from __future__ import annotations

import pytest
import torch
from conftest import on_the_cpu
from dsv4hal_cuda_sm90 import deepgemm_grouped_linear as binding
from vendor_fakes import install_deep_gemm, simulated_info

import dsv4hal
from dsv4hal.conformance import cases_linear as cases

pytest.importorskip("triton")


class FakeDeepGemm:
    def __init__(self) -> None:
        self.calls: list[dict] = []

    def fp8_einsum(self, expr, a, b, d, c=None, recipe=(1, 128, 128)) -> None:  # noqa: ANN001
        assert expr == "bhr,hdr->bhd", "the one expression SM90 runs"
        (aq, sfa), (bq, sfb) = a, b
        t, g, k = aq.shape
        n = bq.shape[1]
        kb = k // 128
        assert aq.dtype == bq.dtype == torch.float8_e4m3fn and bq.shape == (g, n, k)
        assert aq.stride(2) == 1 and bq.stride(2) == 1, "SM90 takes K-major operands only"
        assert c is None and tuple(recipe) == (1, 128, 128), "no accumulation, the fp32 recipe"
        assert sfa.dtype == sfb.dtype == torch.float32 and sfa.shape == (t, g, kb)
        pitch = -(-t // 4) * 4  # [G, T, K/128] MN-major and TMA-aligned: fp8_einsum takes it without a copy
        assert sfa.permute(1, 0, 2).stride() == (kb * pitch, 1, pitch), sfa.stride()
        assert sfb.shape == (g, -(-n // 128), kb) and sfb.is_contiguous()
        assert d.shape == (t, g, n) and d.dtype == torch.bfloat16 and d.stride(2) == 1
        self.calls.append({"t": t, "g": g, "n": n, "k": k})
        xs = aq.double() * sfa.double().repeat_interleave(128, 2)
        ws = bq.double() * sfb.double().repeat_interleave(128, 1)[:, :n].repeat_interleave(128, 2)
        d.copy_(torch.einsum("bhr,hdr->bhd", xs, ws).to(torch.bfloat16))


@pytest.fixture
def fake_dg(monkeypatch: pytest.MonkeyPatch) -> FakeDeepGemm:
    fake = FakeDeepGemm()
    install_deep_gemm(monkeypatch, fp8_einsum=fake.fp8_einsum)
    return fake


def _fixture(t: int, g: int, n: int, k: int, kind: str = "random", nan: bool = False):  # noqa: ANN202
    spec = cases._grouped_case("binding", t, g, n, k, kind=kind, nan=nan)
    return cases.build(spec, torch.device("cpu"), torch.Generator().manual_seed(t + g + n))


@on_the_cpu
@pytest.mark.parametrize(("t", "g", "n", "k", "kind"), [(1, 8, 256, 512, "random"), (3, 8, 128, 256, "outliers"),
                                                        (6, 1, 384, 256, "zeros"), (33, 2, 256, 384, "huge"),
                                                        (70, 4, 128, 256, "tiny")])
def test_matches_the_contract_with_deepgemms_operands(fake_dg: FakeDeepGemm, t: int, g: int, n: int, k: int,
                                                      kind: str) -> None:
    """The binding hands fp8_einsum the contract's codes and scales in its SM90 layout (one token, T not a multiple
    of 4, one group included): the result is within the conformance bound of the float64 oracle, one call."""
    fx = _fixture(t, g, n, k, kind)
    got = binding.fp8_grouped_linear(**fx.args)
    _, ok, detail = fx.compare(got, fx.expected)
    assert ok, detail
    assert fake_dg.calls == [{"t": t, "g": g, "n": n, "k": k}]


@on_the_cpu
def test_nan_rows_reach_the_output(fake_dg: FakeDeepGemm) -> None:
    """A NaN in x gives its (token, group) row NaN codes and scale, so the output's NaNs are the oracle's rows."""
    fx = _fixture(5, 8, 256, 256, nan=True)
    got = binding.fp8_grouped_linear(**fx.args)
    _, ok, detail = fx.compare(got, fx.expected)
    assert ok, detail


@on_the_cpu
def test_one_quantizer_launch_reads_a_dense_x_as_t_times_g_rows(fake_dg: FakeDeepGemm,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The attention output's view [T, G, K] reaches the quantizer as its [T*G, K] rows in place (no copy), once."""
    from dsv4hal.kernels.triton import moe_quant

    seen = []
    real = moe_quant._quantize_tokens

    def spy(rows: torch.Tensor, *args: object, **kw: object) -> tuple[torch.Tensor, torch.Tensor]:
        seen.append((tuple(rows.shape), rows.data_ptr()))
        return real(rows, *args, **kw)

    monkeypatch.setattr(moe_quant, "_quantize_tokens", spy)
    fx = _fixture(5, 8, 256, 256)
    o = fx.args["x"].reshape(5, 16, 128)  # [T, H, head_dim]-like: two heads a group
    binding.fp8_grouped_linear(**{**fx.args, "x": o.view(5, 8, 256)})
    assert seen == [((40, 256), o.data_ptr())]


@on_the_cpu
@pytest.mark.parametrize("layout", ["row_pitch", "group_pitch"])
def test_strided_x_gives_the_dense_result(fake_dg: FakeDeepGemm, layout: str) -> None:
    """x sliced from a buffer with more groups (a token stride other than G*K) or with wider groups (a group stride
    other than K), copied into T*G rows first, gives the dense x's output."""
    fx = _fixture(5, 4, 256, 256)
    x = fx.args["x"]
    want = binding.fp8_grouped_linear(**fx.args)
    if layout == "row_pitch":
        buf = torch.zeros(5, 6, 256, dtype=x.dtype)
        buf[:, 2:] = x
        strided = buf[:, 2:]
    else:
        buf = torch.zeros(5, 4, 384, dtype=x.dtype)
        buf[..., :256] = x
        strided = buf[..., :256]
    assert torch.equal(binding.fp8_grouped_linear(**{**fx.args, "x": strided}), want)
    assert len(fake_dg.calls) == 2


@on_the_cpu
def test_no_tokens_launch_nothing(fake_dg: FakeDeepGemm) -> None:
    """T = 0 returns an empty [0, G, N] bf16 output without an fp8_einsum call."""
    fx = _fixture(0, 8, 256, 256)
    out = binding.fp8_grouped_linear(**fx.args)
    assert out.shape == (0, 8, 256) and out.dtype == torch.bfloat16 and fake_dg.calls == []


def _decide(case: dict, arch: str = "sm90", **libs: str) -> dsv4hal.Decision:
    p = dsv4hal.select_platform(info=simulated_info(arch, triton="3", **libs))
    return p.explain("fp8_grouped_linear", case)


CASE = {"fp8": "e4m3fn", "tokens": "decode", "partial_block": False}
TRITON = "triton_fp8_grouped_linear"


def test_chosen_on_hopper_above_triton_with_deepgemm() -> None:
    """With DeepGEMM on Hopper the binding serves fp8_grouped_linear, ranked above the portable Triton kernel; without
    DeepGEMM the Triton kernel does."""
    d = _decide(CASE, deep_gemm="2.5.0")
    cand = {c.name: c for c in d.candidates}
    assert d.chosen.name == binding.NAME and cand[TRITON].status == "eligible"
    assert cand[binding.NAME].priority > cand[TRITON].priority
    assert _decide(CASE).chosen.name == TRITON


@pytest.mark.parametrize(("change", "why"), [({"fp8": "e4m3fnuz"}, "e4m3fn"),
                                            ({"partial_block": True}, "multiple of 128")])
def test_refused_cases_fall_to_triton_with_reasons(change: dict, why: str) -> None:
    """An e4m3fnuz weight or a partial last weight block goes to the Triton kernel, the binding saying why and
    naming that kernel."""
    d = _decide({**CASE, **change}, deep_gemm="2.5.0")
    assert d.chosen.name == TRITON
    reasons = next(c for c in d.candidates if c.name == binding.NAME).reasons
    assert any(why in r and TRITON in r for r in reasons), reasons


@pytest.mark.parametrize("version", ["2.2.0", "1.1.0"])
def test_deepgemm_whose_fp8_einsum_is_sm100_only_is_refused(version: str) -> None:
    """DeepGEMM before 2.3.0 (2.2.0's fp8_einsum runs on SM100 only; 1.x has none) is refused with the version."""
    d = _decide(CASE, deep_gemm=version)
    reasons = next(c for c in d.candidates if c.name == binding.NAME).reasons
    assert d.chosen.name == TRITON
    assert any(version in r and "fp8_einsum" in r and "2.3.0" in r for r in reasons), reasons
    assert _decide(CASE, deep_gemm="2.3.0").chosen.name == binding.NAME


def test_not_offered_on_blackwell() -> None:
    """cuda_sm100 does not register the binding (DeepGEMM there truncates fp32 scales to UE8M0): Triton serves it."""
    d = _decide(CASE, "sm100", deep_gemm="2.5.0")
    assert d.chosen.name == TRITON
    assert all(c.name != binding.NAME for c in d.candidates)
