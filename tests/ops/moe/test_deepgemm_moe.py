"""The DeepGEMM FP8 MoE bindings (dsv4hal_cuda_sm90.deepgemm_moe: the per-row layout and the psum layout) against
a fake `deep_gemm` module whose m_grouped_fp8_gemm_nt_contiguous checks the documented SM90 contract
(docs/vendor-apis.md 2.2-2.3: K-major operands, fp32 SFA [M, K/128] and SFB [G, N/128, K/128], int32
grouped_layout: [M] with -1 padding and aligned segments, or with use_psum_layout [G] unaligned ends, group g
from align(end[g-1], 128)) and then computes the GEMM in float64 from the codes and scales it was given, for the
rows DeepGEMM 2.5.0's scheduler gives a group only. The glue (route alignment, the Triton gather/SwiGLU
quantization under the interpreter, the combine) is thereby checked numerically against the float64 oracle;
DeepGEMM's own kernel is not (that is the H200 conformance)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from conftest import on_the_cpu, registry_with
from dsv4hal_cuda_sm90 import deepgemm_moe
from vendor_fakes import fake_module, install_modules, simulated_info

import dsv4hal
from dsv4hal import override as ov
from dsv4hal.conformance.cases_moe import EXPERTS_REL_L2, oracle_moe_experts
from dsv4hal.errors import PreparedWeightsMismatchError
from dsv4hal.ops.moe import case_expert_weights
from dsv4hal.reference.moe import quantize_experts
from dsv4hal.selection import select_kernel

pytestmark = pytest.mark.slow  # minutes under the Triton interpreter: the whole suite runs it

E, H, I = 5, 256, 128
ALIGN = 128


def _dequant(q: torch.Tensor, sf: torch.Tensor, block_mn: int) -> torch.Tensor:
    """[MN, K] fp8 codes with [ceil(MN/block_mn), K/128] scales -> float64."""
    s = sf.double().repeat_interleave(block_mn, 0)[: q.shape[0]].repeat_interleave(128, 1)[:, : q.shape[1]]
    return q.double() * s


class FakeDeepGemm:
    def __init__(self) -> None:
        self.calls: list[dict] = []
        self.multiple: tuple[int, int] = (1, 1)  # set_block_size_multiple_of's process-wide setting

    def get_mk_alignment_for_contiguous_layout(self) -> int:
        return ALIGN

    def set_block_size_multiple_of(self, value: int | tuple[int, int]) -> None:
        self.multiple = value if isinstance(value, tuple) else (value, value)

    def m_grouped_fp8_gemm_nt_contiguous(self, a, b, d, grouped_layout, *, use_psum_layout: bool = False,  # noqa: ANN001
                                         expected_m_for_psum_layout: int | None = None) -> None:
        (aq, sfa), (bq, sfb) = a, b
        m, k = aq.shape
        g, n, kb = bq.shape
        assert kb == k and aq.dtype == bq.dtype == torch.float8_e4m3fn
        assert aq.stride(1) == 1 and bq.stride(2) == 1, "SM90 takes K-major (NT) operands only"
        assert sfa.dtype == sfb.dtype == torch.float32 and sfa.shape == (m, k // 128)
        assert sfa.stride() == (1, m) and m % 4 == 0, "SFA MN-major and TMA-aligned (no per-call transform)"
        assert sfb.shape == (g, -(-n // 128), k // 128) and sfb.is_contiguous()
        assert d.shape == (m, n) and d.dtype == torch.bfloat16 and d.is_contiguous()
        assert grouped_layout.dtype == torch.int32 and grouped_layout.is_contiguous()
        assert m % ALIGN == 0
        if use_psum_layout:
            assert grouped_layout.shape == (g,), "psum: one unaligned end a group"
            # an int from the shapes (a tensor or a device read would not be CUDA-graph safe)
            assert type(expected_m_for_psum_layout) is int and expected_m_for_psum_layout > 0
            groups, start = [], 0
            for e, end in enumerate(grouped_layout.tolist()):  # scheduler/gemm.cuh, BLOCK_M == the alignment
                assert start <= end <= m, "an end before its group's start wraps DeepGEMM's uint32 block count"
                groups.append((e, list(range(start, end))))
                # the visited blocks' rows past the end get whatever DeepGEMM computes there: anything
                d[end:-(-end // ALIGN) * ALIGN] = float("nan")
                start = -(-end // ALIGN) * ALIGN
        else:
            assert grouped_layout.shape == (m,) and expected_m_for_psum_layout is None  # DeepGEMM asserts both
            lay = grouped_layout.long()
            for start in range(0, m, ALIGN):  # each segment of one expert starts on an aligned row
                seg = lay[start:start + ALIGN]
                used = seg[seg >= 0]
                assert used.numel() == 0 or (bool((used == used[0]).all()) and int(seg[0]) >= 0)
            groups = [(e, (lay == e).nonzero().squeeze(1).tolist()) for e in range(g)]
        self.calls.append({"m": m, "n": n, "k": k, "g": g, "psum": use_psum_layout,
                           "expected_m": expected_m_for_psum_layout, "multiple": self.multiple})
        for e, rows in groups:
            if rows:
                idx = torch.tensor(rows)
                a_rows = _dequant(aq.float()[idx], sfa[idx], 1)
                w = _dequant(bq[e].float(), sfb[e], 128)
                d[idx] = (a_rows @ w.T).to(torch.bfloat16)


@pytest.fixture
def fake_dg(monkeypatch: pytest.MonkeyPatch) -> FakeDeepGemm:
    fake = FakeDeepGemm()
    install_modules(monkeypatch, {"deep_gemm": fake_module(
        "deep_gemm", get_mk_alignment_for_contiguous_layout=fake.get_mk_alignment_for_contiguous_layout,
        m_grouped_fp8_gemm_nt_contiguous=fake.m_grouped_fp8_gemm_nt_contiguous,
        set_block_size_multiple_of=fake.set_block_size_multiple_of)})
    return fake


def _weights(fmt: str = "fp8_block", h: int = H, i: int = I, gain: float = 1.0):  # noqa: ANN202
    gen = torch.Generator().manual_seed(3)
    return quantize_experts(torch.randn(E, 2 * i, h, generator=gen) * (gain / h ** 0.5),
                            torch.randn(E, h, i, generator=gen) / i ** 0.5, fmt)


def _routing(t: int, k: int, masked: bool, seed: int = 4):  # noqa: ANN202
    gen = torch.Generator().manual_seed(seed)
    ids = torch.rand(t, E, generator=gen).argsort(1)[:, :k].to(torch.int32)
    if masked:
        ids[0, 0] = -1
        ids[-1, -1] = E + 1  # out of range: dropped, as -1
    return torch.randn(t, H, generator=gen).bfloat16(), ids, torch.rand(t, k, generator=gen) + 0.5


@on_the_cpu
@pytest.mark.parametrize("t,k,gain,masked", [(1, 2, 1.0, False), (7, 3, 20.0, True), (40, 4, 1.0, False)])
def test_matches_the_oracle(fake_dg: FakeDeepGemm, t: int, k: int, gain: float, masked: bool) -> None:
    """The DeepGEMM MoE path matches the float64 oracle, masked routes included."""
    w = _weights(gain=gain)
    x, ids, tw = _routing(t, k, masked)
    y = deepgemm_moe.moe_experts(x, ids, tw, deepgemm_moe.prepare_weights(w))
    want = oracle_moe_experts(x, torch.where(ids < E, ids, -1), tw, w, 10.0)
    assert y.dtype == torch.bfloat16 and y.shape == (t, H) and bool(torch.isfinite(y).all())
    rel = float((y.double() - want).norm() / want.norm())
    assert rel < EXPERTS_REL_L2, rel  # FP8 1x128 activations: a few percent (5% with the clamp active)
    assert [(c["n"], c["k"]) for c in fake_dg.calls] == [(2 * I, H), (H, I)]


@on_the_cpu
@pytest.mark.parametrize("psum", [False, True])
@pytest.mark.parametrize("t", [7, 40])  # the gather pass in one launch, and per token + copy
@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy on the NaN (the interpreter)
def test_a_nan_input_is_a_nan_output_row(fake_dg: FakeDeepGemm, t: int, psum: bool) -> None:
    """The quantizers' amax skips NaNs, so a NaN activation must reach the GEMM as FP8's NaN code, not as a finite
    one (before: min/max clamps turned it into -448): the token's output row is NaN, every other row as without it."""
    w = deepgemm_moe.prepare_weights(_weights())
    x, ids, tw = _routing(t, 3, False)
    x[3, 17] = float("nan")
    run = deepgemm_moe.moe_experts_psum if psum else deepgemm_moe.moe_experts
    y = run(x, ids, tw, w)
    assert bool(y[3].isnan().all())
    others = torch.ones(t, dtype=torch.bool)
    others[3] = False
    assert bool(torch.isfinite(y[others]).all())
    x[3, 17] = 0.0
    assert torch.equal(run(x, ids, tw, w)[others], y[others])


def _nan_empty(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fresh float and byte buffers hold NaN (0xFF bytes) until written: a row read without being written shows
    in the output."""
    real = torch.empty

    def empty(*size: Any, **kwargs: Any) -> torch.Tensor:
        t = real(*size, **kwargs)
        if t.is_floating_point() or t.dtype == torch.uint8:
            t.view(torch.uint8).fill_(0xFF)
        return t

    monkeypatch.setattr(torch, "empty", empty)


def _routing_with_gaps(t: int, k: int, seed: int):  # noqa: ANN202
    """k distinct experts a token, never expert 2 (an empty expert between used ones), one route dropped as -1
    and one as an id >= E."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.rand(t, E - 1, generator=gen).argsort(1)[:, :k].to(torch.int32)
    ids = torch.where(ids >= 2, ids + 1, ids)
    ids[0, 0] = -1
    ids[-1, -1] = E + 1
    return torch.randn(t, H, generator=gen).bfloat16(), ids, torch.rand(t, k, generator=gen) + 0.5


@on_the_cpu
@pytest.mark.parametrize("t", [1, 3, 64, 300])
def test_psum_layout_matches_the_per_row_layout(fake_dg: FakeDeepGemm, monkeypatch: pytest.MonkeyPatch,
                                                t: int) -> None:
    """The same routed rows reach the GEMMs either way, so the outputs are equal to the bit; rows past each
    expert's end and the capacity's tail are NaN until the GEMM writes them (the fake writes NaN past the ends
    in the blocks it visits, as DeepGEMM's values there mean nothing): neither the SwiGLU pass nor the combine
    reads them."""
    k = 3
    w = _weights()
    prepared = deepgemm_moe.prepare_weights(w)
    x, ids, tw = _routing_with_gaps(t, k, seed=t)
    _nan_empty(monkeypatch)
    rows = deepgemm_moe.moe_experts(x, ids, tw, prepared)
    psum = deepgemm_moe.moe_experts_psum(x, ids, tw, prepared)
    assert psum.dtype == torch.bfloat16 and psum.shape == (t, H) and bool(torch.isfinite(psum).all())
    assert torch.equal(psum, rows)
    want = oracle_moe_experts(x, torch.where(ids < E, ids, -1), tw, w, 10.0)
    rel = float((psum.double() - want).norm() / want.norm())
    assert rel < EXPERTS_REL_L2, rel
    assert [(c["psum"], c["expected_m"]) for c in fake_dg.calls] == [(False, None)] * 2 + [(True, -(-t * k // E))] * 2
    # the psum GEMMs launch under PSUM_BLOCK_N's multiple, the per-row ones under DeepGEMM's default; it is put back
    psum_multiple = (1, deepgemm_moe.PSUM_BLOCK_N or 1)
    assert [c["multiple"] for c in fake_dg.calls] == [(1, 1)] * 2 + [psum_multiple] * 2
    assert fake_dg.multiple == (1, 1)


@on_the_cpu
def test_psum_block_n_is_put_back_when_the_gemm_raises(fake_dg: FakeDeepGemm, monkeypatch: pytest.MonkeyPatch) -> None:
    """A GEMM that raises (a DeepGEMM assertion) leaves DeepGEMM's process-wide setting as it found it; without
    PSUM_BLOCK_N the setting is never touched."""
    x, ids, tw = _routing(3, 2, False)
    prepared = deepgemm_moe.prepare_weights(_weights())
    seen: list[tuple[int, int]] = []

    def refuse(*args: Any, **kwargs: Any) -> None:
        seen.append(fake_dg.multiple)
        raise RuntimeError("DeepGEMM refused")

    monkeypatch.setattr(fake_dg, "m_grouped_fp8_gemm_nt_contiguous", refuse)
    import deep_gemm

    monkeypatch.setattr(deep_gemm, "m_grouped_fp8_gemm_nt_contiguous", refuse)
    monkeypatch.setattr(deepgemm_moe, "PSUM_BLOCK_N", 128)
    with pytest.raises(RuntimeError, match="refused"):
        deepgemm_moe.moe_experts_psum(x, ids, tw, prepared)
    assert seen == [(1, 128)] and fake_dg.multiple == (1, 1)
    monkeypatch.setattr(deepgemm_moe, "PSUM_BLOCK_N", None)
    fake_dg.multiple = (1, 64)  # as an engine might have set it
    with pytest.raises(RuntimeError, match="refused"):
        deepgemm_moe.moe_experts_psum(x, ids, tw, prepared)
    assert seen[-1] == (1, 64) and fake_dg.multiple == (1, 64)


@on_the_cpu
def test_quantized_rows_match_the_formula() -> None:
    """quantize_routed_rows gives the spec's per-group FP8 codes and scales, padding zeroed."""
    from dsv4hal.kernels.triton.moe_quant import quantize_routed_rows

    gen = torch.Generator().manual_seed(9)
    x = (torch.randn(3, 256, generator=gen) * 3).bfloat16()
    x[1, :128] = 0  # an all-zero group: scale floored at 1e-4, codes 0
    sorted_routes = torch.tensor([4, 0, 6, 6, 2, 6, 6, 6], dtype=torch.int32)  # 6 = T*k: padding
    q, sf = quantize_routed_rows(x, sorted_routes, 6, 2, 256, gather=True)
    assert sf.shape == (8, 2) and sf.stride() == (1, 8)
    for r, route in ((0, 4), (1, 0), (4, 2)):
        v = x[route // 2].float().view(2, 128)
        scale = v.abs().amax(1).clamp_min(1e-4) / 448
        assert torch.allclose(sf[r], scale, rtol=1e-6)
        want = (v / scale[:, None]).to(torch.float8_e4m3fn).view(torch.uint8).view(256)
        assert torch.equal(q[r], want)


def test_prepare_refuses_what_it_cannot_run(fake_dg: FakeDeepGemm) -> None:
    """DeepGEMM prepare_weights refuses non-FP8 or misaligned weights and lays out what it takes."""
    with pytest.raises(ValueError, match="takes fp8_block expert weights"):
        deepgemm_moe.prepare_weights(_weights("mxfp4"))
    with pytest.raises(ValueError, match="multiples of 128"):
        deepgemm_moe.prepare_weights(_weights(i=96))
    p = deepgemm_moe.prepare_weights(_weights())
    assert p.w13.dtype == torch.float8_e4m3fn and p.w13_scale.dtype == torch.float32 and p.alignment == ALIGN


@on_the_cpu
def test_selection_and_mismatch(fake_dg: FakeDeepGemm) -> None:
    """Selection rejects DeepGEMM MoE for MXFP4 weights or a missing library, saying why."""
    reg = registry_with(strict=True)
    info = simulated_info("sm90", deep_gemm="2.5.0", triton="3")
    d = select_kernel(reg, "moe_experts", case_expert_weights(_weights("mxfp4")), info, "cuda_sm90", ov.Overrides())
    c = next(c for c in d.candidates if c.name == deepgemm_moe.NAME)
    assert c.status == "rejected" and any("FP8 weights only" in r for r in c.reasons)
    no_lib = select_kernel(reg, "moe_experts", case_expert_weights(_weights()), simulated_info("sm90", triton="3"),
                           "cuda_sm90", ov.Overrides())
    assert any("deep_gemm" in r for r in next(c for c in no_lib.candidates if c.name == deepgemm_moe.NAME).reasons)
    with ov.overrides(kernels={"moe_experts": deepgemm_moe.NAME}):
        p = dsv4hal.select_platform(info=info, registry=reg)
    prepared = p.ops.moe_experts.prepare_weights(_weights())
    assert (prepared.implementation, prepared.layout) == (deepgemm_moe.NAME, deepgemm_moe.LAYOUT)
    x, ids, tw = _routing(3, 2, False)
    assert p.ops.moe_experts(x, ids, tw, prepared).shape == (3, H)
    with ov.overrides(kernels={"moe_experts": "triton_fused_moe"}):
        other = dsv4hal.select_platform(info=info, registry=reg)
    with pytest.raises(PreparedWeightsMismatchError):
        other.ops.moe_experts(x, ids, tw, prepared)


@on_the_cpu
def test_psum_registration_above_the_per_row_layout(fake_dg: FakeDeepGemm) -> None:
    """The DeepGEMM psum MoE kernel ranks above the per-row layout for FP8 weights."""
    reg = registry_with(strict=True)
    info = simulated_info("sm90", deep_gemm="2.5.0", triton="3")
    fp8 = case_expert_weights(_weights())
    d = select_kernel(reg, "moe_experts", fp8, info, "cuda_sm90", ov.Overrides())
    names = [c.name for c in d.candidates]
    rows, psum = (next(c for c in d.candidates if c.name == n) for n in (deepgemm_moe.NAME, deepgemm_moe.PSUM_NAME))
    # measured faster in 9 of the 10 shapes of bench-moe.json on the H200
    assert d.chosen.name == deepgemm_moe.PSUM_NAME and rows.status == "eligible" and not rows.reasons
    assert psum.priority == rows.priority + 1 and names.index(psum.name) < names.index(rows.name)
    text = d.explain()  # what `dsv4hal explain moe_experts` prints
    assert text.index(f" {deepgemm_moe.PSUM_NAME} (") < text.index(f" {deepgemm_moe.NAME} (")

    def reasons(case: dict, machine: object = info) -> list[str]:
        decision = select_kernel(reg, "moe_experts", case, machine, "cuda_sm90", ov.Overrides())
        return next(c for c in decision.candidates if c.name == deepgemm_moe.PSUM_NAME).reasons

    assert any("e4m3fnuz" in r for r in reasons({**fp8, "fp8": "e4m3fnuz"}))
    assert any("FP8 weights only" in r for r in reasons(case_expert_weights(_weights("mxfp4"))))
    assert any("multiples of 128" in r for r in reasons({**fp8, "I": 96}))
    assert any("deep_gemm" in r for r in reasons(fp8, simulated_info("sm90", triton="3")))
    old = simulated_info("sm90", deep_gemm="2.4.1", triton="3")
    assert any("predates 2.5.0" in r and "use_psum_layout" in r for r in reasons(fp8, old))
    assert select_kernel(reg, "moe_experts", fp8, old, "cuda_sm90", ov.Overrides()).chosen.name == deepgemm_moe.NAME

    with ov.overrides(kernels={"moe_experts": deepgemm_moe.PSUM_NAME}):
        p = dsv4hal.select_platform(info=info, registry=reg)
    prepared = p.ops.moe_experts.prepare_weights(_weights())
    assert (prepared.implementation, prepared.layout) == (deepgemm_moe.PSUM_NAME, deepgemm_moe.LAYOUT)
    x, ids, tw = _routing(3, 2, True)
    y = p.ops.moe_experts(x, ids, tw, prepared)
    assert torch.equal(y, deepgemm_moe.moe_experts(x, ids, tw, prepared.payload))
    assert [c["psum"] for c in fake_dg.calls] == [True, True, False, False]


def test_forcing_it_without_the_library_still_fails_at_selection() -> None:
    """Forcing the DeepGEMM MoE kernel without deep_gemm fails at selection with a typed error."""
    from dsv4hal.errors import UnsupportedCaseError

    reg = registry_with(strict=True)
    with ov.overrides(kernels={"moe_experts": deepgemm_moe.NAME}), pytest.raises(UnsupportedCaseError) as err:
        dsv4hal.select_platform(info=simulated_info("sm90", triton="3"), registry=reg)
    assert "deep_gemm" in str(err.value) and "format=mxfp4" in str(err.value)


@on_the_cpu
def test_pow2_scales_and_zeroed_padding_rows() -> None:
    """pow2_scales quantization rounds scales to powers of two and zeroes padding rows."""
    from dsv4hal.kernels.triton.moe_quant import quantize_routed_rows

    gen = torch.Generator().manual_seed(10)
    x = (torch.randn(2, 128, generator=gen) * 5).bfloat16()
    sorted_routes = torch.tensor([1, 2, 2, 0], dtype=torch.int32)  # 2 = T*k: padding
    q, sf = quantize_routed_rows(x, sorted_routes, 2, 1, 128, gather=True, pow2_scales=True)
    for r, t in ((0, 1), (3, 0)):
        v = x[t].float()
        want = 2.0 ** torch.ceil(torch.log2(v.abs().max() / 448))
        assert float(sf[r, 0]) == float(want)  # amax / 448 rounded up to a power of two
        assert torch.equal(q[r], (v / want).to(torch.float8_e4m3fn).view(torch.uint8))
    assert bool((q[1:3] == 0).all()) and sf[1:3].tolist() == [[1.0], [1.0]]
