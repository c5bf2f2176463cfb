"""The Blackwell and ROCm MoE bindings without their hardware: every weight/scale transform against its documented
formula and inverted back to the logical weights; the DeepGEMM SM100 FP8 x FP4 path end to end against the float64
oracle through a fake deep_gemm that checks the SM100 contract (int8 FP4 weights, packed UE8M0 scales, power-of-two
activation scales on every row) and computes from what it is given; the FlashInfer and aiter calls recorded by
fakes and checked against their documented signatures (their outputs mean nothing); selection with reasons."""

from __future__ import annotations

import types

import pytest
import torch
from conftest import on_the_cpu, registry_with
from dsv4hal_cuda_sm100 import deepgemm_moe as dg100
from dsv4hal_cuda_sm100 import flashinfer_moe as fi
from dsv4hal_cuda_sm100 import moe_layouts as bw
from dsv4hal_rocm import aiter_moe
from dsv4hal_rocm import moe_layouts as amd
from vendor_fakes import fake_module, install_modules, simulated_info

import dsv4hal
from dsv4hal import override as ov
from dsv4hal.conformance.cases_moe import EXPERTS_REL_L2, oracle_moe_experts
from dsv4hal.formats.mxfp4 import dequantize_mxfp4
from dsv4hal.ops.moe import case_expert_weights
from dsv4hal.reference.moe import quantize_experts
from dsv4hal.selection import select_kernel

pytestmark = pytest.mark.slow  # minutes under the Triton interpreter: the whole suite runs it

E, H, I = 3, 256, 128
# flashinfer utils.py srcToDstBlk32RowMap: source row i of a 32-row block lands on row MAP[i]
SRC_TO_DST_BLK32 = [0, 8, 16, 24, 1, 9, 17, 25, 2, 10, 18, 26, 3, 11, 19, 27, 4, 12, 20, 28, 5, 13, 21, 29, 6, 14,
                    22, 30, 7, 15, 23, 31]


def _weights(fmt: str = "mxfp4", h: int = H, i: int = I, gain: float = 1.0):  # noqa: ANN202
    gen = torch.Generator().manual_seed(4)
    return quantize_experts(torch.randn(E, 2 * i, h, generator=gen) * (gain / h ** 0.5),
                            torch.randn(E, h, i, generator=gen) / i ** 0.5, fmt)


def _bytes(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 256, shape, dtype=torch.uint8, generator=torch.Generator().manual_seed(seed))


# ---------------------------------------------------------------- Blackwell layouts

def test_trtllm_row_shuffle_is_flashinfers_block32_map() -> None:
    """The TRT-LLM row shuffle is FlashInfer's 32-row block map."""
    idx = bw.shuffle_rows(64)
    for blk in (0, 32):
        for src, dst in enumerate(SRC_TO_DST_BLK32):
            assert int(idx[blk + dst]) == blk + src


def test_trtllm_gated_order_is_up_gate_interleaved() -> None:
    """The TRT-LLM gated weight order interleaves up and gate rows."""
    order = bw.gated_interleave_rows(8)  # DSV4 rows: gate 0..3, up 4..7
    assert order.tolist() == [4, 0, 5, 1, 6, 2, 7, 3]


def test_trtllm_scale_swizzle_hand_checked_and_bijective() -> None:
    """The TRT-LLM scale swizzle matches hand-computed offsets and is a bijection."""
    offs = bw.swizzle_offsets(256, 8)
    assert offs[0, 0] == 0 and offs[0, 1] == 1 and offs[0, 4] == 512 and offs[1, 0] == 16 and offs[32, 0] == 4
    assert offs[128, 0] == 2 * 512 and offs[37, 6] == 512 + 5 * 16 + 1 * 4 + 2
    assert torch.equal(offs.flatten().sort().values, torch.arange(256 * 8))
    with pytest.raises(ValueError, match="multiple of 128"):
        bw.swizzle_offsets(96, 8)


@pytest.mark.parametrize("gated", [True, False])
def test_trtllm_layout_inverts(gated: bool) -> None:
    """The TRT-LLM weight and scale layout round-trips, scales moving with their rows."""
    w, s = _bytes(2, 256, 64, seed=1), _bytes(2, 256, 8, seed=2)
    tw, ts = bw.to_trtllm(w, s, gated=gated)
    assert tw.shape == w.shape and ts.shape == s.shape and not torch.equal(tw, w)
    back_w, back_s = bw.from_trtllm(tw, ts, gated=gated)
    assert torch.equal(back_w, w) and torch.equal(back_s, s)
    # row r of the kernel's matrix is logical row order[r]; its scales moved with it, then got swizzled
    order = bw.gated_interleave_rows(256)[bw.shuffle_rows(256)] if gated else bw.shuffle_rows(256)
    assert torch.equal(tw[1, 5], w[1, order[5]])
    flat = ts.reshape(2, -1)
    assert int(flat[1, bw.swizzle_offsets(256, 8)[5, 3]]) == int(s[1, order[5], 3])


def test_deepgemm_ue8m0_packing_inverts_and_is_mn_major() -> None:
    """DeepGEMM's UE8M0 scale packing puts four groups per word, MN-major, padding zeroed."""
    s = _bytes(2, 6, 9, seed=3)  # K/32 = 9: three words, the last one partly padding
    p = bw.pack_ue8m0_for_deepgemm(s)
    assert p.dtype == torch.int32 and p.shape == (2, 6, 3) and p.stride() == (3 * 8, 1, 8)  # N 6 -> aligned 8
    word = int(p[1, 4, 1]) & 0xFFFFFFFF
    assert [(word >> (8 * j)) & 0xFF for j in range(4)] == s[1, 4, 4:8].tolist()  # group 4p + j in byte j
    assert (int(p[1, 4, 2]) & 0xFFFFFFFF) == int(s[1, 4, 8])  # groups 9..11 do not exist: zero bytes
    assert torch.equal(bw.unpack_ue8m0_for_deepgemm(p, 9), s)


# ---------------------------------------------------------------- ROCm layouts

@pytest.mark.parametrize("gate_up", [True, False])
def test_aiter_weight_shuffle_formula_and_inverse(gate_up: bool) -> None:
    """The aiter weight shuffle is aiter's view/permute formula and inverts."""
    w = _bytes(2, 64, 128, seed=5)
    sh = amd.shuffle_weights(w, gate_up=gate_up)
    assert torch.equal(amd.unshuffle_weights(sh, gate_up=gate_up), w)
    if gate_up:  # aiter: view(E, 2, N0, 16, K0, 4, 16).permute(0, 2, 1, 4, 5, 3, 6), N0 = rows/32, K0 = Kb/64
        want = w.view(2, 2, 2, 16, 2, 4, 16).permute(0, 2, 1, 4, 5, 3, 6).reshape(2, 64, 128)
    else:  # view(E, N0, 16, K0, 4, 16).permute(0, 1, 3, 4, 2, 5), N0 = rows/16
        want = w.view(2, 4, 16, 2, 4, 16).permute(0, 1, 3, 4, 2, 5).reshape(2, 64, 128)
    assert torch.equal(sh, want)
    if gate_up:  # the first 16-byte run after the shuffle is gate row 0, then 16 bytes of up row 0 follow later
        assert torch.equal(sh[0, 0, :16], w[0, 0, :16])


@pytest.mark.parametrize("gate_up", [True, False])
def test_aiter_scale_shuffle_pads_and_inverts(gate_up: bool) -> None:
    """The aiter scale shuffle pads with the unit scale and inverts."""
    s = _bytes(2, 64, 4, seed=6)  # K/32 = 4: padded to 8 with 0x7F (2**0)
    sh = amd.shuffle_scales(s, gate_up=gate_up)
    assert sh.shape == (2 * 64, 8)
    assert int((sh == amd.SCALE_ONE).sum()) >= 2 * 64 * 4  # the padding columns, wherever they landed
    assert torch.equal(amd.unshuffle_scales(sh, 2, 4, gate_up=gate_up), s)


# ---------------------------------------------------------------- DeepGEMM SM100 end to end through a fake

def _is_pow2(x: torch.Tensor) -> bool:
    bits = x.float().contiguous().view(torch.int32)
    return bool(((bits & 0x807FFFFF) == 0).all())


class FakeDeepGemmSm100:
    def __init__(self) -> None:
        self.calls = 0

    def get_mk_alignment_for_contiguous_layout(self) -> int:
        return 128

    def m_grouped_fp8_fp4_gemm_nt_contiguous(self, a, b, d, grouped_layout, recipe_a=None, recipe_b=None):  # noqa: ANN001
        (aq, sfa), (bq, sfb) = a, b
        assert recipe_a == (1, 128) and recipe_b == (1, 32)
        m, k = aq.shape
        g, n, kb = bq.shape
        assert bq.dtype == torch.int8 and kb * 2 == k and bq.is_contiguous() and k % 128 == 0
        assert sfb.dtype == torch.int32 and sfb.shape == (g, n, k // 128) and sfb.stride(1) == 1
        assert sfa.dtype == torch.float32 and sfa.shape == (m, k // 128) and sfa.stride() == (1, m)
        assert _is_pow2(sfa), "SM100 packs activation scales to UE8M0 (every row, padding included)"
        assert grouped_layout.dtype == torch.int32 and grouped_layout.shape == (m,)
        self.calls += 1
        lay = grouped_layout.long()
        a = aq.float() * sfa.repeat_interleave(128, 1)
        for e in torch.unique(lay[lay >= 0]).tolist():
            rows = (lay == e).nonzero().squeeze(1)
            scale = bw.unpack_ue8m0_for_deepgemm(sfb[e:e + 1], k // 32)[0]
            w = dequantize_mxfp4(bq[e].view(torch.uint8), scale).double()
            d[rows] = (a[rows].double() @ w.T).to(torch.bfloat16)


@pytest.fixture
def fake_dg100(monkeypatch: pytest.MonkeyPatch) -> FakeDeepGemmSm100:
    fake = FakeDeepGemmSm100()
    install_modules(monkeypatch, {"deep_gemm": fake_module(
        "deep_gemm", get_mk_alignment_for_contiguous_layout=fake.get_mk_alignment_for_contiguous_layout,
        m_grouped_fp8_fp4_gemm_nt_contiguous=fake.m_grouped_fp8_fp4_gemm_nt_contiguous)})
    return fake


@on_the_cpu  # (the fake GEMM keeps CPU tensors; the glue around it is Triton)
@pytest.mark.parametrize("t,gain", [(1, 1.0), (9, 20.0)])
def test_deepgemm_sm100_matches_the_oracle(fake_dg100: FakeDeepGemmSm100, t: int, gain: float) -> None:
    """The SM100 DeepGEMM MoE path matches the float64 oracle, a dropped route included."""
    w = _weights(gain=gain)
    gen = torch.Generator().manual_seed(t)
    x = torch.randn(t, H, generator=gen).bfloat16()
    ids = torch.rand(t, E, generator=gen).argsort(1)[:, :2].to(torch.int32)
    ids[0, 1] = -1
    tw = torch.rand(t, 2, generator=gen) + 0.5
    y = dg100.moe_experts(x, ids, tw, dg100.prepare_weights(w))
    want = oracle_moe_experts(x, ids, tw, w, 10.0)
    rel = float((y.double() - want).norm() / want.norm())
    assert fake_dg100.calls == 2 and bool(torch.isfinite(y).all()) and rel < EXPERTS_REL_L2, rel


# ---------------------------------------------------------------- FlashInfer and aiter: recorded calls

def test_flashinfer_call_contract(monkeypatch: pytest.MonkeyPatch) -> None:
    """The FlashInfer MoE binding calls the library with the contract's layouts and arguments."""
    seen: dict = {}

    def mxfp8_quantize(x, is_sf_swizzled_layout=True, alignment=32):  # noqa: ANN001, ANN202
        seen["swizzled"] = is_sf_swizzled_layout
        return x.float().to(torch.float8_e4m3fn), torch.full((x.shape[0] * x.shape[1] // 32,), 127, dtype=torch.uint8)

    def routed_moe(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        seen["args"], seen["kwargs"] = args, kwargs
        return [torch.zeros(args[2].shape[0], args[2].shape[1], dtype=torch.bfloat16)]

    install_modules(monkeypatch, {
        "flashinfer": fake_module("flashinfer", __path__=[], mxfp8_quantize=mxfp8_quantize),
        "flashinfer.fused_moe": fake_module("flashinfer.fused_moe", trtllm_fp4_block_scale_routed_moe=routed_moe)})
    prepared = fi.prepare_weights(_weights())
    t = 4
    x = torch.randn(t, H).bfloat16()
    ids = torch.tensor([[0, 2], [1, -1], [2, 0], [1, 2]], dtype=torch.int32)
    y = fi.moe_experts(x, ids, torch.rand(t, 2), prepared)
    a = seen["args"]
    assert y.shape == (t, H) and seen["swizzled"] is False
    assert a[0][0].dtype == torch.int32 and a[0][1].dtype == torch.bfloat16  # (ids, weights), weights applied
    assert a[2].dtype == torch.float8_e4m3fn and a[3].shape == (t, H // 32) and a[3].dtype == torch.float8_e4m3fn
    assert a[4].dtype == torch.uint8 and a[4].shape == (E, 2 * I, H // 2) and a[5].dtype == torch.float8_e4m3fn
    assert a[6] is None and a[7] is None and a[8] is None  # no bias, alpha 1, beta 0
    assert a[9].tolist() == [10.0] * E  # clamp: min(gate, 10), up in [-10, 10]
    assert a[10].shape == (E, H, I // 2) and a[11].shape == (E, H, I // 32)
    assert a[16:24] == (E, 2, None, None, I, 0, E, None)
    assert seen["kwargs"] == {"routing_method_type": 5, "do_finalize": True, "activation_type": 3}


def test_aiter_call_contract(monkeypatch: pytest.MonkeyPatch) -> None:
    """The aiter MoE binding calls fused_moe with the contract's weights, ids and options."""
    seen: dict = {}

    def fused_moe(x, w1, w2, topk_weight, topk_ids, **kw):  # noqa: ANN001, ANN003, ANN202
        seen.update(x=x, w1=w1, w2=w2, tw=topk_weight, ids=topk_ids, kw=kw)
        return torch.zeros_like(x)

    install_modules(monkeypatch, {
        "aiter": fake_module("aiter", __path__=[], ActivationType=types.SimpleNamespace(Silu="Silu", Swiglu="Swiglu"),
                             QuantType=types.SimpleNamespace(per_1x32="per_1x32")),
        "aiter.fused_moe": fake_module("aiter.fused_moe", fused_moe=fused_moe)})
    prepared = aiter_moe.prepare_weights(_weights())
    ids = torch.tensor([[0, -1], [2, 1]], dtype=torch.int32)
    aiter_moe.moe_experts(torch.randn(2, H).bfloat16(), ids, torch.tensor([[0.7, 0.8], [0.5, 1.0]]), prepared)
    kw = seen["kw"]
    assert kw["activation"] == "Silu" and kw["quant_type"] == "per_1x32" and kw["swiglu_limit"] == 10.0
    assert kw["gate_mode"] == "interleave" and kw["doweight_stage1"] is False and kw["dtype"] == torch.bfloat16
    assert seen["w1"].is_shuffled and seen["w2"].is_shuffled and kw["w1_scale"].shape == (E * 2 * I, 8)
    assert seen["ids"].tolist() == [[0, 0], [2, 1]] and seen["tw"].tolist() == [[pytest.approx(0.7), 0.0],
                                                                                 [0.5, 1.0]]  # dropped: weight 0


# ---------------------------------------------------------------- selection

def _candidate(decision, name: str):  # noqa: ANN001, ANN202
    return next(c for c in decision.candidates if c.name == name)


def test_selection_on_simulated_blackwell_and_rocm() -> None:
    """MoE selection on simulated SM100 and ROCm picks the vendor kernel each format allows."""
    reg = registry_with(strict=True)
    mx, fp8 = case_expert_weights(_weights()), case_expert_weights(_weights("fp8_block"))
    sm100 = simulated_info("sm100", flashinfer="0.6.12", deep_gemm="2.5.0", triton="3")
    d = select_kernel(reg, "moe_experts", mx, sm100, "cuda_sm100", ov.Overrides())
    assert d.chosen.name == fi.NAME and _candidate(d, dg100.NAME).status == "eligible"
    d = select_kernel(reg, "moe_experts", fp8, sm100, "cuda_sm100", ov.Overrides())
    assert d.chosen.name == "triton_fused_moe"
    assert any("MXFP4" in r for r in _candidate(d, fi.NAME).reasons + _candidate(d, dg100.NAME).reasons)
    gfx950 = simulated_info("gfx950", aiter="0.1", triton="3", **{aiter_moe.ALL_TOKENS_FP8: "0.1"})
    assert select_kernel(reg, "moe_experts", mx, gfx950, "rocm", ov.Overrides()).chosen.name == aiter_moe.NAME
    bound = select_kernel(reg, "moe_experts", mx, simulated_info("gfx950", aiter="0.1", triton="3"), "rocm",
                          ov.Overrides())
    assert any("AITER_BF16_FP8_MOE_BOUND must be 0" in r for r in _candidate(bound, aiter_moe.NAME).reasons)
    gfx942 = simulated_info("gfx942", aiter="0.1", triton="3", **{aiter_moe.ALL_TOKENS_FP8: "0.1"})
    old = select_kernel(reg, "moe_experts", mx, gfx942, "rocm", ov.Overrides())
    assert any("gfx950 only" in r for r in _candidate(old, aiter_moe.NAME).reasons)
    with ov.overrides(kernels={"moe_experts": dg100.NAME}):
        p = dsv4hal.select_platform(info=sm100, registry=reg)
    assert p.explain("moe_experts").chosen.name == dg100.NAME


def test_environment_knob_is_recorded_at_detection(monkeypatch: pytest.MonkeyPatch) -> None:
    """Hardware detection records aiter's all-tokens-FP8 knob from the environment."""
    from dsv4hal import hardware

    monkeypatch.setattr(hardware, "library_versions", lambda names: {"torch": "2", "aiter": "0.1"})
    monkeypatch.setenv("AITER_BF16_FP8_MOE_BOUND", "0")
    assert hardware.detect().has(aiter_moe.ALL_TOKENS_FP8)
    monkeypatch.setenv("AITER_BF16_FP8_MOE_BOUND", "256")
    assert not hardware.detect().has(aiter_moe.ALL_TOKENS_FP8)
