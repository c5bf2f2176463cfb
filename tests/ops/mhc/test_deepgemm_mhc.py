"""mhc_pre through DeepGEMM's pre-norm GEMM (dsv4hal.kernels.deepgemm_mhc): the split rule against the H200's
measurements, selection on simulated Hopper and Blackwell, and the op on the CPU with a stand-in for
tf32_hc_prenorm_gemm that keeps DeepGEMM's output layout (split-K partials [S, T, rows], [S, T]) and the Triton
gates under the interpreter, against the reference."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import on_the_cpu, registry_with
from vendor_fakes import fake_module, install_modules

from dsv4hal import override as ov
from dsv4hal.conformance.cases_mhc import BF16_OUTPUT_TOLERANCE, TOLERANCES
from dsv4hal.hardware import simulated
from dsv4hal.kernels import deepgemm_mhc
from dsv4hal.reference import mhc as ref_mhc
from dsv4hal.selection import select_kernel

pytest.importorskip("triton")
pytestmark = pytest.mark.slow  # minutes under the Triton interpreter: the whole suite runs it

H200_SMS = 132


@pytest.mark.parametrize(("t", "d", "fastest"), [(1, 4096, 64), (8, 4096, 64), (64, 4096, 64), (512, 4096, 16),
                                                 (4096, 4096, 2), (1, 7168, 64), (64, 7168, 64), (512, 7168, 16),
                                                 (4096, 7168, 2)])
def test_split_rule_picks_the_fastest_measured(t: int, d: int, fastest: int) -> None:
    """bench/results/h200/bench-mhc.json: the fastest split count of those timed, per shape."""
    assert deepgemm_mhc.splits(t, 4 * d, H200_SMS) == fastest


def test_split_rule_limits() -> None:
    """DeepGEMM mHC split count is capped by K blocks and is 1 when token blocks fill the SMs."""
    assert deepgemm_mhc.splits(1, 256, H200_SMS) == 4  # one split per 64-column K block at most
    assert deepgemm_mhc.splits(100000, 4 * 4096, H200_SMS) == 1  # more token blocks than SMs: no split


@pytest.mark.parametrize(("arch", "platform"), [("sm90", "cuda_sm90"), ("sm100", "cuda_sm100")])
@pytest.mark.parametrize(("op", "triton"), [("mhc_pre", "triton_mhc_pre"),
                                            ("mhc_post_pre", "triton_mhc_post_then_pre")])
def test_selection_against_the_triton_kernels_with_reasons(arch: str, platform: str, op: str, triton: str) -> None:
    """Above the Triton kernels where it was timed faster (the H200, sm90); below them where it never ran (sm100)."""
    reg = registry_with(strict=True)
    name = f"deepgemm_{op}_{arch}"

    def decide(case: dict, **libs: str):  # noqa: ANN202
        info = simulated(arch, libraries={"torch": "2", "triton": "3", **libs})
        return select_kernel(reg, op, case, info, platform, ov.Overrides())

    d = decide({"hidden": 4096, "sinkhorn_iters": 20}, deep_gemm="2.5.0")
    cand = {c.name: c for c in d.candidates}
    triton_prios = [c.priority for c in d.candidates if c.name.startswith("triton_")]
    if arch == "sm90":
        assert d.chosen.name == name and cand[triton].status == "eligible"
        assert cand[name].priority > max(triton_prios)
    else:
        assert d.chosen.name == triton and cand[name].status == "eligible"
        assert cand[name].priority < min(triton_prios)
    assert decide({"hidden": 4096, "sinkhorn_iters": 20}).chosen.name == triton  # without DeepGEMM
    with ov.overrides(kernels={op: name}):
        info = simulated(arch, libraries={"torch": "2", "triton": "3", "deep_gemm": "2.5.0"})
        assert select_kernel(reg, op, {"hidden": 4096, "sinkhorn_iters": 20}, info, platform,
                             ov.current()).chosen.name == name
    reasons = next(c for c in decide({"hidden": 4100, "sinkhorn_iters": 20}, deep_gemm="2.4.1").candidates
                   if c.name == name).reasons
    assert any("multiple of 64" in r for r in reasons) and any("2.4.1" in r for r in reasons)
    assert next(c for c in decide({"hidden": 4096, "sinkhorn_iters": 20}).candidates
                if c.name == name).reasons == ("missing deep_gemm",)


def _stand_in(calls: list[int]):  # noqa: ANN202
    def tf32_hc_prenorm_gemm(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, sqr_sum: torch.Tensor,
                             num_splits: int | None = None) -> None:
        """DeepGEMM's contract as the binding relies on it: split s owns a contiguous share of K's 64-column
        blocks and writes its partial product and sum of squares (fp32 here, where DeepGEMM rounds to TF32)."""
        assert a.dtype == torch.bfloat16 and a.is_contiguous() and b.dtype == torch.float32 and b.is_contiguous()
        t, k = a.shape
        s = num_splits
        assert d.shape == (s, t, b.shape[0]) and sqr_sum.shape == (s, t) and k % 64 == 0
        blocks = k // 64
        bounds = [i * blocks // s * 64 for i in range(s + 1)]
        af = a.float()
        for i in range(s):
            lo, hi = bounds[i], bounds[i + 1]
            d[i] = af[:, lo:hi] @ b[:, lo:hi].t()
            sqr_sum[i] = (af[:, lo:hi] ** 2).sum(1)
        calls.append(s)

    return tf32_hc_prenorm_gemm


@on_the_cpu
@pytest.mark.parametrize(("t", "d", "iters"), [(1, 64, 20), (7, 64, 1), (33, 64, 20), (3, 256, 20), (0, 64, 20)])
def test_matches_the_reference_with_deepgemms_layout(monkeypatch: pytest.MonkeyPatch, t: int, d: int,
                                                     iters: int) -> None:
    """The DeepGEMM mHC path matches the reference given DeepGEMM's operand layout."""
    calls: list[int] = []
    install_modules(monkeypatch, {"deep_gemm": fake_module("deep_gemm", __version__="2.5.0",
                                                           tf32_hc_prenorm_gemm=_stand_in(calls))})
    g = torch.Generator().manual_seed(t * 7 + d)
    x = torch.randn(t, 4, d, generator=g).bfloat16()
    fn = torch.randn(24, 4 * d, generator=g) / math.sqrt(4 * d)
    base, scale = 0.5 * torch.randn(24, generator=g), 0.5 + 1.5 * torch.rand(3, generator=g)
    y, post, comb = deepgemm_mhc.mhc_pre(x, fn, base, scale, sinkhorn_iters=iters)
    want_y, want_post, want_comb = ref_mhc.mhc_pre(x, fn, base, scale, sinkhorn_iters=iters)
    assert (y.dtype, post.dtype, comb.dtype) == (torch.bfloat16, torch.float32, torch.float32)
    assert y.shape == (t, d) and post.shape == (t, 4) and comb.shape == (t, 4, 4)
    assert calls == ([] if t == 0 else [deepgemm_mhc.splits(t, 4 * d, 4)])
    if t:
        assert calls[0] > 1  # the partials really are split: the Triton gates sum them
    mix, out = TOLERANCES["mhc_pre"], BF16_OUTPUT_TOLERANCE
    for got, want, tol in ((post, want_post, mix), (comb, want_comb, mix), (y, want_y, out)):
        assert bool(torch.isfinite(got).all())
        assert torch.allclose(got.float(), want.float(), atol=tol.atol, rtol=tol.rtol)


@on_the_cpu
def test_post_pre_is_triton_post_then_deepgemm_pre(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fused mHC post+pre runs the Triton post then the DeepGEMM pre."""
    from dsv4hal.kernels.triton.mhc import mhc_post

    calls: list[int] = []
    install_modules(monkeypatch, {"deep_gemm": fake_module("deep_gemm", __version__="2.5.0",
                                                           tf32_hc_prenorm_gemm=_stand_in(calls))})
    t, d = 6, 64
    g = torch.Generator().manual_seed(11)
    x, f = torch.randn(t, 4, d, generator=g).bfloat16(), torch.randn(t, d, generator=g).bfloat16()
    post, comb = torch.rand(t, 4, generator=g), torch.rand(t, 4, 4, generator=g)
    fn = torch.randn(24, 4 * d, generator=g) / math.sqrt(4 * d)
    base, scale = 0.5 * torch.randn(24, generator=g), 0.5 + 1.5 * torch.rand(3, generator=g)
    got = deepgemm_mhc.mhc_post_pre(f, x, post, comb, fn, base, scale)
    stream = mhc_post(f, x, post, comb)
    assert torch.equal(got[0], stream) and len(calls) == 1
    for a, b in zip(got[1:], deepgemm_mhc.mhc_pre(stream, fn, base, scale), strict=True):
        assert torch.equal(a, b)
    want = ref_mhc.mhc_post_pre(f, x, post, comb, fn, base, scale)
    tol = TOLERANCES["mhc_post_pre"]
    for a, b in zip(got[2:], want[2:], strict=True):
        assert torch.allclose(a, b, atol=tol.atol, rtol=tol.rtol)
