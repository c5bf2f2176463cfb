"""The fp8_linear binding to DeepGEMM's fp8_gemm_nt (dsv4hal_cuda_sm90.deepgemm_linear) against a fake `deep_gemm`
whose fp8_gemm_nt checks the SM90 contract the binding relies on (docs/vendor-apis.md 2.2-2.3: K-major e4m3fn A and
B, fp32 SFA [M, K/128] MN-major with the TMA-aligned pitch align(M, 4) so no transform runs, fp32 SFB
[ceil(N/128), K/128] contiguous, bf16 N-major D) and then computes D in float64 from the codes and scales it was
given. The Triton quantizer runs under the interpreter, so the whole path is checked against the contract's float64
oracle; DeepGEMM's kernel itself is not (that is the GPU conformance). Also its selection on simulated Hopper."""

from __future__ import annotations

import pytest
import torch
from conftest import on_the_cpu
from dsv4hal_cuda_sm90 import deepgemm_linear
from vendor_fakes import install_deep_gemm, simulated_info

import dsv4hal
from dsv4hal.conformance import cases_linear as cases

pytest.importorskip("triton")


class FakeDeepGemm:
    def __init__(self) -> None:
        self.calls: list[dict] = []

    def fp8_gemm_nt(self, a, b, d, c=None, recipe=None, recipe_a=None, recipe_b=None, compiled_dims="nk",  # noqa: ANN001
                    disable_ue8m0_cast=False) -> None:
        (aq, sfa), (bq, sfb) = a, b
        m, k = aq.shape
        n = bq.shape[0]
        assert aq.dtype == bq.dtype == torch.float8_e4m3fn and bq.shape[1] == k
        assert aq.stride(1) == 1 and bq.stride(1) == 1, "SM90 takes K-major (NT) operands only"
        assert c is None and recipe is None and recipe_a is None and recipe_b is None, "the default recipe (1,128,128)"
        assert sfa.dtype == sfb.dtype == torch.float32 and sfa.shape == (m, k // 128)
        assert sfa.stride() == (1, -(-m // 4) * 4), "SFA MN-major with the TMA-aligned pitch: no per-call transform"
        assert sfb.shape == (-(-n // 128), k // 128) and sfb.is_contiguous()
        assert d.shape == (m, n) and d.dtype == torch.bfloat16 and d.is_contiguous()
        self.calls.append({"m": m, "n": n, "k": k})
        xs = aq.double() * sfa.double().repeat_interleave(128, 1)
        ws = bq.double() * sfb.double().repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)
        d.copy_((xs @ ws.T).to(torch.bfloat16))


@pytest.fixture
def fake_dg(monkeypatch: pytest.MonkeyPatch) -> FakeDeepGemm:
    fake = FakeDeepGemm()
    install_deep_gemm(monkeypatch, fp8_gemm_nt=fake.fp8_gemm_nt)
    return fake


@on_the_cpu
@pytest.mark.parametrize(("t", "n", "k", "kind"), [(1, 256, 512, "random"), (3, 128, 128, "outliers"),
                                                   (6, 384, 256, "zeros"), (33, 256, 384, "huge"),
                                                   (70, 128, 256, "tiny")])
def test_matches_the_contract_with_deepgemms_operands(fake_dg: FakeDeepGemm, t: int, n: int, k: int,
                                                      kind: str) -> None:
    """The binding hands DeepGEMM the contract's codes and scales in its SM90 layout (T not a multiple of 4
    included): the result is within the conformance bound of the float64 oracle, one GEMM call."""
    spec = cases._case("binding", t, n, k, kind=kind)
    fx = cases.build(spec, torch.device("cpu"), torch.Generator().manual_seed(t + n))
    got = deepgemm_linear.fp8_linear(**fx.args)
    _, ok, detail = fx.compare(got, fx.expected)
    assert ok, detail
    assert fake_dg.calls == [{"m": t, "n": n, "k": k}]


@on_the_cpu
def test_no_tokens_launch_nothing(fake_dg: FakeDeepGemm) -> None:
    """T = 0 returns an empty [0, N] bf16 output without a GEMM call."""
    spec = cases._case("empty", 0, 256, 256)
    fx = cases.build(spec, torch.device("cpu"), torch.Generator().manual_seed(0))
    out = deepgemm_linear.fp8_linear(**fx.args)
    assert out.shape == (0, 256) and out.dtype == torch.bfloat16 and fake_dg.calls == []


def _decide(case: dict, **libs: str) -> dsv4hal.Decision:
    p = dsv4hal.select_platform(info=simulated_info("sm90", triton="3", **libs))
    return p.explain("fp8_linear", case)


CASE = {"fp8": "e4m3fn", "tokens": "decode", "partial_block": False}


def test_chosen_on_hopper_above_triton_with_deepgemm() -> None:
    """With DeepGEMM on Hopper the binding serves fp8_linear, ranked above the portable Triton kernel."""
    d = _decide(CASE, deep_gemm="2.5.0")
    cand = {c.name: c for c in d.candidates}
    assert d.chosen.name == deepgemm_linear.NAME and cand["triton_fp8_linear"].status == "eligible"
    assert cand[deepgemm_linear.NAME].priority > cand["triton_fp8_linear"].priority
    assert _decide(CASE).chosen.name == "triton_fp8_linear"  # no DeepGEMM


@pytest.mark.parametrize(("change", "why"), [({"fp8": "e4m3fnuz"}, "e4m3fn"),
                                            ({"partial_block": True}, "multiple of 128")])
def test_refused_cases_fall_to_triton_with_reasons(change: dict, why: str) -> None:
    """An e4m3fnuz weight or a partial last weight block goes to the Triton kernel, the binding saying why."""
    d = _decide({**CASE, **change}, deep_gemm="2.5.0")
    assert d.chosen.name == "triton_fp8_linear"
    reasons = next(c for c in d.candidates if c.name == deepgemm_linear.NAME).reasons
    assert any(why in r for r in reasons), reasons


def test_deepgemm_before_2_0_is_refused() -> None:
    """DeepGEMM 1.x (no fp8_gemm_nt) is refused with the version in the reason."""
    reasons = next(c for c in _decide(CASE, deep_gemm="1.1.0").candidates if c.name == deepgemm_linear.NAME).reasons
    assert any("1.1.0" in r and "fp8_gemm_nt" in r for r in reasons), reasons


def test_not_offered_on_blackwell() -> None:
    """cuda_sm100 does not register the binding (DeepGEMM there truncates fp32 scales to UE8M0): Triton serves it."""
    p = dsv4hal.select_platform(info=simulated_info("sm100", triton="3", deep_gemm="2.5.0"))
    d = p.explain("fp8_linear", CASE)
    assert d.chosen.name == "triton_fp8_linear"
    assert all(c.name != deepgemm_linear.NAME for c in d.candidates)
