"""The Marlin MoE binding (dsv4hal_cuda_sm90.marlin_moe) against a fake torch.ops._moe_C.moe_wna16_marlin_gemm defined
from vLLM 0.24's schema string (docs/vendor-apis.md 3.2), so torch checks argument types against the schema; the
recorded calls are checked against the documented contract. The fake's outputs (zeros) mean nothing, and nothing
here runs the real kernel: its numerical result is not checked."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch
from conftest import TRITON_DEVICE, on_the_cpu, registry_with
from dsv4hal_cuda_sm90 import marlin_moe, vllm_moe_lib
from dsv4hal_cuda_sm90.marlin_layout import unpermute_scales_for_marlin, unrepack_marlin_mxfp4
from vendor_fakes import Recorder, define_fake_op, simulated_info

import dsv4hal
from dsv4hal import override as ov
from dsv4hal.hardware import PlatformInfo
from dsv4hal.ops.moe import case_expert_weights
from dsv4hal.reference.moe import quantize_experts
from dsv4hal.selection import select_kernel

MARLIN_SCHEMA = (
    "moe_wna16_marlin_gemm(Tensor! a, Tensor? c_or_none, Tensor! b_q_weight, Tensor? b_bias_or_none, "
    "Tensor! b_scales, Tensor? a_scales, Tensor? global_scale, Tensor? b_zeros_or_none, Tensor? g_idx_or_none, "
    "Tensor? perm_or_none, Tensor! workspace, Tensor sorted_token_ids, Tensor! expert_ids, "
    "Tensor! num_tokens_past_padded, Tensor! topk_weights, int moe_block_size, int top_k, bool mul_topk_weights, "
    "int b_type_id, int size_m, int size_n, int size_k, bool is_full_k, bool use_atomic_add, bool use_fp32_reduce, "
    "bool is_zp_float, int thread_k, int thread_n, int blocks_per_sm) -> Tensor")
PARAMS = ("a", "c_or_none", "b_q_weight", "b_bias_or_none", "b_scales", "a_scales", "global_scale", "b_zeros_or_none",
          "g_idx_or_none", "perm_or_none", "workspace", "sorted_token_ids", "expert_ids", "num_tokens_past_padded",
          "topk_weights", "moe_block_size", "top_k", "mul_topk_weights", "b_type_id", "size_m", "size_n", "size_k",
          "is_full_k", "use_atomic_add", "use_fp32_reduce", "is_zp_float", "thread_k", "thread_n", "blocks_per_sm")
_state: dict[str, Any] = {"recorder": None}

E, H, I, T, K = 4, 128, 64, 3, 2
SIM_LIBS = {"vllm_moe": "0.24", "triton": "3"}


def _marlin_impl(*args: Any) -> torch.Tensor:
    rec = _state["recorder"]
    if rec is None:
        raise RuntimeError("fake _moe_C is not installed in this test")
    bound = dict(zip(PARAMS, args))
    rec.record("moe_wna16_marlin_gemm", bound, PARAMS)
    rows = bound["size_m"] * bound["top_k"]
    return torch.zeros(rows, bound["size_n"], dtype=bound["a"].dtype, device=bound["a"].device)


@pytest.fixture
def fake_moe_c(monkeypatch: pytest.MonkeyPatch) -> Recorder:
    define_fake_op("_moe_C", MARLIN_SCHEMA, _marlin_impl)
    rec = Recorder()
    monkeypatch.setitem(_state, "recorder", rec)
    monkeypatch.setattr(marlin_moe, "_WORKSPACES", {})
    monkeypatch.delenv(marlin_moe.ENV_LIB, raising=False)
    return rec


@pytest.fixture(scope="module")
def reg():  # noqa: ANN201
    """The installed plugins, cuda_sm90 registering Marlin through its kernels.register."""
    registry = registry_with(strict=True)
    assert marlin_moe.NAME in registry.kernels["moe_experts"]
    return registry


def _weights(fmt: str = "mxfp4", e: int = E, h: int = H, i: int = I):  # noqa: ANN202
    gen = torch.Generator().manual_seed(1)
    return quantize_experts(torch.randn(e, 2 * i, h, generator=gen) * 0.1, torch.randn(e, h, i, generator=gen) * 0.1,
                            fmt)


def _inputs(t: int = T):  # noqa: ANN202
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(t, H, generator=gen).bfloat16()
    ids = torch.randint(0, E, (t, K), generator=gen, dtype=torch.int32)
    return x, ids, torch.rand(t, K, generator=gen)


def test_float4_e2m1f_id() -> None:
    """The Marlin float4_e2m1f scalar type id matches vLLM's."""
    assert marlin_moe.FLOAT4_E2M1F_ID == 562949953487106 == 0x2000000010102


def test_prepare_weights_layout() -> None:
    """Marlin prepare_weights gives int32 repacked weights and e8m0 scales of the spec's shapes."""
    w = _weights()
    mw = marlin_moe.prepare_weights(w)
    assert (mw.num_experts, mw.hidden, mw.intermediate) == (E, H, I)
    assert mw.w13.dtype == mw.w2.dtype == torch.int32
    assert mw.w13.shape == (E, H // 16, 4 * I) and mw.w2.shape == (E, I // 16, 2 * H)
    assert mw.w13_scale.dtype == mw.w2_scale.dtype == torch.float8_e8m0fnu
    assert mw.w13_scale.shape == (E, H // 32, 2 * I) and mw.w2_scale.shape == (E, I // 32, H)
    assert torch.equal(unrepack_marlin_mxfp4(mw.w13), w.w13) and torch.equal(unrepack_marlin_mxfp4(mw.w2), w.w2)
    assert torch.equal(unpermute_scales_for_marlin(mw.w13_scale), w.w13_scale)
    assert torch.equal(unpermute_scales_for_marlin(mw.w2_scale), w.w2_scale)


def test_prepare_refuses_fp8_block_and_bad_shapes() -> None:
    """Marlin prepare_weights refuses FP8-block weights and shapes Marlin cannot tile."""
    with pytest.raises(ValueError, match="MXFP4 expert weights only"):
        marlin_moe.prepare_weights(_weights("fp8_block"))
    with pytest.raises(ValueError, match="size_n % 64"):
        marlin_moe.prepare_weights(_weights(h=96, i=32))


@on_the_cpu
def test_calls_match_the_contract(fake_moe_c: Recorder) -> None:
    """The Marlin MoE binding calls the library twice with the contract's arguments."""
    x, ids, tw = _inputs()
    mw = marlin_moe.prepare_weights(_weights())
    y = marlin_moe.moe_experts(x, ids, tw, mw)
    assert y.dtype == torch.bfloat16 and y.shape == (T, H)
    c1, c2 = fake_moe_c.calls
    bs = marlin_moe.choose_block_size(T, K, E)
    assert bs == 8
    for c, (a_shape, top_k, mul, m, n, k, w) in zip(
            (c1, c2), (((T, H), K, False, T, 2 * I, H, mw.w13), ((T * K, I), 1, True, T * K, H, I, mw.w2))):
        f = dict(zip(PARAMS, c.args))
        assert f["a"].shape == a_shape and f["a"].dtype == torch.bfloat16 and f["a"].contiguous
        assert f["b_q_weight"].dtype == torch.int32 and f["b_q_weight"].shape == tuple(w.shape)
        assert f["b_q_weight"].shape[1] == k // 16 and f["b_q_weight"].shape[2] // 16 * 8 == n  # the op's checks
        assert f["b_scales"].dtype == torch.float8_e8m0fnu and f["b_scales"].shape == (E, k // 32, n)
        for name in ("c_or_none", "b_bias_or_none", "a_scales", "global_scale", "b_zeros_or_none", "g_idx_or_none",
                     "perm_or_none"):
            assert f[name] is None, name
        assert f["workspace"].dtype == torch.int32 and f["workspace"].shape == (132 * 4,)
        cap = T * K + E * (bs - 1) if T * K >= E else min(T * K * bs, T * K + E * (bs - 1))
        assert f["sorted_token_ids"].dtype == torch.int32 and f["sorted_token_ids"].shape == (cap,)
        assert f["expert_ids"].dtype == torch.int32 and f["expert_ids"].shape == (-(-cap // bs),)
        assert f["num_tokens_past_padded"].dtype == torch.int32 and f["num_tokens_past_padded"].shape == (1,)
        assert f["topk_weights"].dtype == torch.float32 and f["topk_weights"].shape == (T, K)
        assert (f["moe_block_size"], f["top_k"], f["mul_topk_weights"]) == (bs, top_k, mul)
        assert f["b_type_id"] == marlin_moe.FLOAT4_E2M1F_ID
        assert (f["size_m"], f["size_n"], f["size_k"]) == (m, n, k)
        assert (f["is_full_k"], f["use_atomic_add"], f["use_fp32_reduce"], f["is_zp_float"]) == (True, False, True,
                                                                                                   False)
        assert (f["thread_k"], f["thread_n"], f["blocks_per_sm"]) == (-1, -1, -1)
    # one workspace for the device, reused by both GEMMs and by the next call; the routing is shared too
    assert c1.tensors["workspace"] is c2.tensors["workspace"]
    assert c1.tensors["sorted_token_ids"] is c2.tensors["sorted_token_ids"]
    assert c1.tensors["b_q_weight"] is mw.w13 and c2.tensors["b_q_weight"] is mw.w2
    assert c1.tensors["b_scales"] is mw.w13_scale and c2.tensors["b_scales"] is mw.w2_scale
    marlin_moe.moe_experts(x, ids, tw, mw)
    assert fake_moe_c.calls[2].tensors["workspace"] is c1.tensors["workspace"]
    # the routes in sorted_token_ids are this call's
    s = c1.tensors["sorted_token_ids"]
    assert sorted(s[s < T * K].tolist()) == list(range(T * K))


@on_the_cpu
def test_swiglu_clamp_between_the_gemms(fake_moe_c: Recorder, monkeypatch: pytest.MonkeyPatch) -> None:
    """GEMM1's output (gate | up) goes through DSV4's clamped SwiGLU; dropped routes contribute nothing."""
    x, ids, tw = _inputs()
    ids[1, 1] = -1  # expert owned by another rank
    mw = marlin_moe.prepare_weights(_weights())
    gen = torch.Generator().manual_seed(3)
    h13 = (torch.randn(T * K, 2 * I, generator=gen) * 20).bfloat16()
    y2 = torch.randn(T * K, H, generator=gen).bfloat16()
    outs = iter((h13, y2))
    real = marlin_moe._gemm()

    def fake(*args: Any) -> torch.Tensor:
        real(*args)
        return next(outs)

    monkeypatch.setattr(marlin_moe, "_gemm", lambda: fake)
    y = marlin_moe.moe_experts(x, ids, tw, mw, swiglu_limit=10.0)
    act = fake_moe_c.calls[1].tensors["a"]
    g, u = h13.float().chunk(2, dim=-1)
    want_act = (torch.nn.functional.silu(g.clamp(max=10.0)) * u.clamp(-10.0, 10.0)).bfloat16()
    assert torch.equal(act, want_act)
    keep = (ids >= 0).flatten().unsqueeze(1).float()
    want = (y2.float() * keep).view(T, K, H).sum(1)
    assert torch.allclose(y.float(), want, rtol=2 ** -7, atol=0)  # fp32 sums in another order: one bf16 ulp


def test_empty_batch_makes_no_call(fake_moe_c: Recorder) -> None:
    """An empty batch returns an empty result without calling Marlin."""
    mw = marlin_moe.prepare_weights(_weights())
    y = marlin_moe.moe_experts(torch.zeros(0, H, dtype=torch.bfloat16), torch.zeros(0, K, dtype=torch.int32),
                               torch.zeros(0, K), mw)
    assert y.shape == (0, H) and not fake_moe_c.calls


def test_library_loading(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:  # noqa: ANN001
    """The vLLM MoE library loads from VLLM_MOE_LIB, with clear errors when unset or missing."""
    monkeypatch.delenv(marlin_moe.ENV_LIB, raising=False)
    with pytest.raises(RuntimeError, match="VLLM_MOE_LIB is not set"):
        vllm_moe_lib.load_library(None, marlin_moe.NAME)
    with pytest.raises(RuntimeError, match="VLLM_MOE_LIB='/nonexistent.so' is not a file"):
        vllm_moe_lib.load_library("/nonexistent.so", marlin_moe.NAME)
    loaded = []
    monkeypatch.setattr(torch.ops, "load_library", loaded.append)
    so = tmp_path / "_moe_C_stable_libtorch.abi3.so"
    so.write_bytes(b"")
    vllm_moe_lib.load_library(str(so), marlin_moe.NAME)
    assert loaded == [str(so)]
    # not registered and no variable: the first call says which variable to set
    monkeypatch.setattr(vllm_moe_lib, "op_registered", lambda name: False)
    with pytest.raises(RuntimeError, match="VLLM_MOE_LIB"):
        marlin_moe._gemm()


# ---------------------------------------------------------------- selection


def _candidate(decision, name: str):  # noqa: ANN001, ANN202
    return next(c for c in decision.candidates if c.name == name)


def test_selection_ranks_marlin_after_the_fused_moe_and_picks_it_without_triton(reg, fake_moe_c: Recorder) -> None:  # noqa: ANN001
    """Marlin ranks after the fused Triton MoE and is chosen when Triton is absent."""
    info = simulated_info("sm90", **SIM_LIBS)
    auto = dsv4hal.select_platform(info=info, registry=reg)
    d = auto.explain("moe_experts")  # the catalog's MXFP4 case, class decode: the portable fused MoE, then Marlin
    assert d.chosen.name == "triton_fused_moe" and _candidate(d, marlin_moe.NAME).status == "eligible"
    no_triton = simulated_info("sm90", vllm_moe="0.24")  # without Triton, Marlin is the choice
    assert dsv4hal.select_platform(info=no_triton, registry=reg).explain("moe_experts").chosen.name == marlin_moe.NAME
    with ov.overrides(kernels={"moe_experts": marlin_moe.NAME}):
        p = dsv4hal.select_platform(info=info, registry=reg)
    assert p.name == "cuda_sm90"
    d = p.explain("moe_experts")
    assert d.chosen.name == marlin_moe.NAME and d.chosen.tier == "vendor" and d.source == "api"
    w = _weights()
    prepared = p.ops.moe_experts.prepare_weights(w)
    assert (prepared.implementation, prepared.layout) == (marlin_moe.NAME, marlin_moe.LAYOUT)
    assert isinstance(prepared.payload, marlin_moe.MarlinWeights)
    if TRITON_DEVICE.type == "cpu":  # (the call: the fake op's CPU tensors through the Triton glue, on_the_cpu)
        x, ids, tw = _inputs()
        y = p.ops.moe_experts(x, ids, tw, prepared)
        assert y.shape == (T, H) and [c.name for c in fake_moe_c.calls] == ["moe_wna16_marlin_gemm"] * 2


def test_selection_refuses_fp8_block_with_reasons(reg) -> None:  # noqa: ANN001
    """Selection rejects Marlin for FP8-block weights, saying MXFP4 only."""
    info = simulated_info("sm90", **SIM_LIBS)
    case = case_expert_weights(_weights("fp8_block"))
    d = select_kernel(reg, "moe_experts", case, info, "cuda_sm90", ov.Overrides())
    assert d.chosen.name != marlin_moe.NAME
    c = _candidate(d, marlin_moe.NAME)
    assert c.status == "rejected" and any("MXFP4 weights only" in r for r in c.reasons)
    p = dsv4hal.select_platform(info=info, registry=reg)
    assert p.ops.moe_experts.prepare_weights(_weights("fp8_block")).implementation != marlin_moe.NAME


def test_selection_refuses_bad_shapes_and_missing_library(reg) -> None:  # noqa: ANN001
    """Selection rejects Marlin for untileable GEMMs or a missing library, with reasons."""
    case = case_expert_weights(_weights(h=96, i=32))
    d = select_kernel(reg, "moe_experts", case, simulated_info("sm90", **SIM_LIBS), "cuda_sm90", ov.Overrides())
    reasons = _candidate(d, marlin_moe.NAME).reasons
    assert any("GEMM1" in r for r in reasons) and any("GEMM2" in r for r in reasons)
    d = select_kernel(reg, "moe_experts", case_expert_weights(_weights()), simulated_info("sm90", triton="3"),
                      "cuda_sm90", ov.Overrides())
    assert d.chosen.name != marlin_moe.NAME
    assert _candidate(d, marlin_moe.NAME).reasons == ("missing vllm_moe (the simulated machine lists no 'vllm_moe' "
                                                      "library)",)
    assert marlin_moe.supports({"format": "mxfp4", "fp8": "e4m3fnuz"}, simulated_info("sm90", **SIM_LIBS))


def test_detected_machine_reads_the_variable(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:  # noqa: ANN001
    """On a detected machine Marlin's availability reads VLLM_MOE_LIB and says how to set it."""
    info = dataclasses.replace(simulated_info("sm90"), detected_by="nvidia-smi")
    assert isinstance(info, PlatformInfo)
    monkeypatch.setattr(vllm_moe_lib, "op_registered", lambda name: False)
    monkeypatch.delenv(marlin_moe.ENV_LIB, raising=False)
    assert marlin_moe.availability_reasons(info) == [
        "VLLM_MOE_LIB is not set or does not exist (set it to vLLM 0.24's _moe_C_stable_libtorch.abi3.so)"]
    monkeypatch.setenv(marlin_moe.ENV_LIB, str(tmp_path / "missing.so"))
    assert marlin_moe.availability_reasons(info)
    so = tmp_path / "lib.so"
    so.write_bytes(b"")
    monkeypatch.setenv(marlin_moe.ENV_LIB, str(so))
    assert marlin_moe.availability_reasons(info) == []
    assert marlin_moe.supports({"format": "mxfp4", "H": 7168, "I": 3072}, info) == []
    assert marlin_moe.supports({"format": "mxfp4", "H": 4096, "I": 2048}, info) == []
