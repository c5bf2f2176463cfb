"""ep_fused_moe: the whole expert-parallel MoE layer in one call. The split path over gloo against single-rank
moe_experts, selection and explain of DeepGEMM Mega MoE, its argument mapping against a fake deep_gemm (not installed
here: its kernels are not run), and typed errors for bad input."""

from __future__ import annotations

import types
from typing import Any

import pytest
import torch
from vendor_fakes import Recorder, fake_module, install_modules, simulated_info

import dsv4hal
from dsv4hal.collectives import EP_FUSED_MOE
from dsv4hal.distributed.spawn import ok_results, run_ranks
from dsv4hal.errors import ExpertParallelError

E, H, I, K, MAX_TOKENS = 8, 128, 128, 6, 8
TOKENS = (5, 3)


def _weights(fmt: str = "mxfp4") -> Any:
    from dsv4hal.formats.experts import quantize_experts

    g = torch.Generator().manual_seed(3)
    return quantize_experts(torch.randn(E, 2 * I, H, generator=g) * H ** -0.5, torch.randn(E, H, I, generator=g)
                            * I ** -0.5, fmt)


def _inputs(rank: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(10 + rank)
    t = TOKENS[rank]
    ids = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(t)]).to(torch.int32)
    ids[0, 0] = -1  # a dropped route
    return torch.randn(t, H, generator=g).to(torch.bfloat16), ids, torch.rand(t, K, generator=g)


def _fused_worker(rank: int, world: int) -> tuple[float, float, str]:
    """(max |fused - reference|, the largest excess over 2^-6 RMS + 2^-7 |reference| (<= 0: inside), the backend)
    on this rank."""
    import torch.distributed as dist

    from dsv4hal.distributed import ExpertParallel, local_expert_weights

    cpu = dsv4hal.select_platform("cpu")
    group = dist.group.WORLD if world > 1 else None
    w = _weights()
    ep = ExpertParallel(num_experts=E, hidden=H, top_k=K, group=group, max_tokens_per_rank=MAX_TOKENS, platform=cpu)
    fw = ep.prepare_fused_weights(local_expert_weights(w, ep.local_experts()))
    x, ids, tw = _inputs(rank)
    got = ep.fused_moe(x, ids, tw, fw)
    assert torch.equal(got, ep.fused_moe(x, ids, tw, fw, decode=True)), "decode mode differs from normal mode"
    want = cpu.ops.moe_experts(x, ids, tw, cpu.ops.moe_experts.prepare_weights(w))
    diff, ref = (got.float() - want.float()).abs(), want.float()
    excess = diff - (2 ** -6 * float(ref.pow(2).mean().sqrt()) + 2 ** -7 * ref.abs())
    return float(diff.max()), float(excess.max()), fw.backend


def test_fused_moe_split_path_equals_single_rank_moe_experts_on_one_rank() -> None:
    """On one rank the split path (loop-back dispatch, moe_experts, combine) gives moe_experts' bits."""
    err, _, backend = _fused_worker(0, 1)
    assert backend == "split" and err == 0.0


def test_fused_moe_split_path_over_two_gloo_ranks_matches_moe_experts() -> None:
    """On two gloo ranks each rank's fused_moe equals single-rank moe_experts on its tokens, within the bf16
    rounding of the per-rank partial sums (a missing or doubled route would err by tens of percent of the RMS)."""
    for err, excess, backend in ok_results(run_ranks(_fused_worker, 2, timeout_s=20, join_timeout_s=180)):
        assert backend == "split" and excess <= 0 and err == err, (err, excess)


def _decide(arch: str, case: dict[str, object], **libs: str) -> Any:
    return dsv4hal.select_platform(info=simulated_info(arch, **libs)).decide_collective(EP_FUSED_MOE, case)


def test_mega_moe_chosen_on_blackwell_for_mxfp4_and_hopper_for_fp8_block_with_deep_gemm() -> None:
    """With deep_gemm, SM100 MXFP4 experts get fp8_fp4_mega_moe and SM90 fp8_block experts get fp8_mega_moe; the
    split path stays eligible beneath them."""
    for arch, fmt in (("sm100", "mxfp4"), ("sm90", "fp8_block")):
        d = _decide(arch, {"weights": fmt}, deep_gemm="2.6.1")
        assert d.chosen.name == f"deepgemm_mega_moe_{arch}" and "eligible split" in d.explain()


def test_mega_moe_refused_with_reasons_and_split_chosen_otherwise() -> None:
    """Without deep_gemm, on a gloo group, for the other weight format, a hidden size off 128, no max_tokens, or an
    SM90 intermediate over 4096, Mega MoE is refused naming the reason and the split path is chosen."""
    cases = (("sm100", {}, {}, "missing deep_gemm"),
             ("sm100", {"group_backend": "gloo", "device": "cpu"}, {"deep_gemm": "2.6.1"}, "NCCL"),
             ("sm100", {"weights": "fp8_block"}, {"deep_gemm": "2.6.1"}, "MXFP4"),
             ("sm90", {"weights": "mxfp4"}, {"deep_gemm": "2.6.1"}, "fp8_block"),
             ("sm100", {"hidden": 4000}, {"deep_gemm": "2.6.1"}, "multiple of 128"),
             ("sm100", {"max_tokens": 0}, {"deep_gemm": "2.6.1"}, "max_tokens_per_rank"),
             ("sm90", {"weights": "fp8_block", "intermediate": 8192}, {"deep_gemm": "2.6.1"}, "4096"))
    for arch, case, libs, why in cases:
        d = _decide(arch, case, **libs)
        assert d.chosen.name == "split", (case, d.explain())
        reasons = "; ".join(next(c for c in d.candidates if c.name == f"deepgemm_mega_moe_{arch}").reasons)
        assert why in reasons, (why, reasons)


def test_explain_fused_on_the_cpu_says_split_is_chosen() -> None:
    """An ExpertParallel on the cpu platform explains its fused choice: the split path (no vendor kernel here)."""
    from dsv4hal.distributed import ExpertParallel

    ep = ExpertParallel(num_experts=E, hidden=H, top_k=K, max_tokens_per_rank=MAX_TOKENS,
                        platform=dsv4hal.select_platform("cpu"))
    text = ep.explain_fused(_weights())
    assert "chosen   split" in text and "weights=mxfp4" in text and "intermediate=128" in text


# ---------------------------------------------------------------- the binding against a fake deep_gemm


class _FakeDeepGemm:
    def __init__(self, with_sm90: bool = True) -> None:
        self.recorder = Recorder()
        attrs: dict[str, Any] = {name: getattr(self, name) for name in (
            "get_symm_buffer_for_mega_moe", "transform_sf_into_required_layout", "transform_weights_for_mega_moe",
            "fp8_fp4_mega_moe", "get_mn_major_tma_aligned_tensor", "transform_weights_for_mega_moe_sm90")}
        if with_sm90:
            attrs["fp8_mega_moe"] = self.fp8_mega_moe
        self.module = fake_module("deep_gemm", **attrs)

    def get_symm_buffer_for_mega_moe(self, group, num_experts, num_max_tokens_per_rank, num_topk, hidden,  # noqa: ANN001, ANN201
                                     intermediate_hidden, use_fp8_dispatch=None, mma_type="fp8xfp4",  # noqa: ANN001
                                     activation="swiglu"):  # noqa: ANN001
        self.recorder.record("get_symm_buffer_for_mega_moe", {
            "num_experts": num_experts, "num_max_tokens_per_rank": num_max_tokens_per_rank, "num_topk": num_topk,
            "hidden": hidden, "intermediate_hidden": intermediate_hidden}, ())
        n, sm90 = num_max_tokens_per_rank, self.sm90
        return types.SimpleNamespace(
            x=torch.zeros(n, hidden, dtype=torch.float8_e4m3fn),
            x_sf=torch.zeros(n, hidden // 128, dtype=torch.float32 if sm90 else torch.int32),
            topk_idx=torch.zeros(n, num_topk, dtype=torch.int64), topk_weights=torch.zeros(n, num_topk))

    def transform_sf_into_required_layout(self, sf, mn, k, recipe, num_groups=None):  # noqa: ANN001, ANN201
        self.recorder.record("transform_sf_into_required_layout", {"sf": sf, "mn": mn, "k": k, "recipe": recipe,
                                                                   "num_groups": num_groups}, ())
        return sf

    def transform_weights_for_mega_moe(self, l1_weights, l2_weights, activation="swiglu"):  # noqa: ANN001, ANN201
        self.recorder.record("transform_weights_for_mega_moe", {"l1": l1_weights[0], "l1_sf": l1_weights[1],
                                                                "l2": l2_weights[0], "l2_sf": l2_weights[1]}, ())
        return l1_weights, l2_weights

    def get_mn_major_tma_aligned_tensor(self, sf):  # noqa: ANN001, ANN201
        return sf

    def transform_weights_for_mega_moe_sm90(self, l1_weights, l2_weights):  # noqa: ANN001, ANN201
        self.recorder.record("transform_weights_for_mega_moe_sm90", {"l1": l1_weights[0], "l1_sf": l1_weights[1],
                                                                     "l2": l2_weights[0], "l2_sf": l2_weights[1]}, ())
        return l1_weights, l2_weights

    def _run(self, name: str, y, l1_weights, l2_weights, sym_buffer, activation_clamp=None):  # noqa: ANN001
        self.recorder.record(name, {"y": y, "x": sym_buffer.x, "x_sf": sym_buffer.x_sf,
                                    "topk_idx": sym_buffer.topk_idx, "topk_weights": sym_buffer.topk_weights,
                                    "activation_clamp": activation_clamp}, ())

    def fp8_fp4_mega_moe(self, y, l1_weights, l2_weights, sym_buffer, cumulative_local_expert_recv_stats=None,  # noqa: ANN001, ANN201
                         recipe=(1, 1, 32), activation="swiglu", activation_clamp=None, fast_math=True):  # noqa: ANN001
        self._run("fp8_fp4_mega_moe", y, l1_weights, l2_weights, sym_buffer, activation_clamp)

    def fp8_mega_moe(self, y, l1_weights, l2_weights, sym_buffer, cumulative_local_expert_recv_stats=None,  # noqa: ANN001, ANN201
                     recipe=(128, 128, 128), activation="swiglu", activation_clamp=None, fast_math=True):  # noqa: ANN001
        self._run("fp8_mega_moe", y, l1_weights, l2_weights, sym_buffer, activation_clamp)

    sm90 = False


def _ep() -> Any:
    from dsv4hal.distributed import ExpertParallel

    return ExpertParallel(num_experts=E, hidden=H, top_k=K, max_tokens_per_rank=MAX_TOKENS,
                          platform=dsv4hal.select_platform("cpu"))


def test_mega_moe_sm100_maps_mxfp4_weights_and_fp8_ue8m0_tokens_into_deep_gemm(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The SM100 binding hands DeepGEMM int8 FP4 weights with fp32 scales for (2I, H) and (H, I) at (1, 32), the
    symmetric buffer sized by max_tokens_per_rank / experts / top_k / H / I, FP8 tokens with packed per-32 UE8M0
    scales that dequantize back to the tokens, int64 physical ids with -1 for a dropped route (weight 0), and the
    SwiGLU limit as activation_clamp; y is bf16 [T, H]."""
    from dsv4hal.kernels.deepgemm_mega_moe import make_sm100

    fake = _FakeDeepGemm()
    install_modules(monkeypatch, {"deep_gemm": fake.module})
    ep, w, backend = _ep(), _weights(), make_sm100()
    state = backend.prepare(ep, w)
    sfs = [c for c in fake.recorder.calls if c.name == "transform_sf_into_required_layout"]
    assert [(c.kwargs["mn"], c.kwargs["k"], c.kwargs["recipe"], c.kwargs["num_groups"]) for c in sfs] == [
        (2 * I, H, (1, 32), E), (H, I, (1, 32), E)]
    assert torch.equal(sfs[0].tensors["sf"], torch.exp2(w.w13_scale.float() - 127))
    t = fake.recorder.only("transform_weights_for_mega_moe").tensors
    assert t["l1"].dtype == torch.int8 and t["l1"].shape == (E, 2 * I, H // 2)
    assert torch.equal(t["l2"].view(torch.uint8), w.w2)
    assert fake.recorder.only("get_symm_buffer_for_mega_moe").kwargs == {
        "num_experts": E, "num_max_tokens_per_rank": MAX_TOKENS, "num_topk": K, "hidden": H, "intermediate_hidden": I}
    x, ids, tw = _inputs(0)
    y = backend.run(ep, x, ids, tw, state, False, 7.0)
    call = fake.recorder.only("fp8_fp4_mega_moe")
    assert y.dtype == torch.bfloat16 and y.shape == (TOKENS[0], H) and call.kwargs["activation_clamp"] == 7.0
    n = TOKENS[0]
    assert torch.equal(call.tensors["topk_idx"][:n], ids.long().clamp(min=-1))
    assert call.tensors["topk_weights"][0, 0] == 0 and torch.equal(call.tensors["topk_weights"][0, 1:], tw[0, 1:])
    scales = torch.exp2(call.tensors["x_sf"][:n].contiguous().view(torch.uint8).float() - 127)
    back = call.tensors["x"][:n].float() * scales.repeat_interleave(32, dim=1)
    assert torch.allclose(back, x.float(), rtol=2 ** -3, atol=0)


def test_mega_moe_sm90_maps_fp8_block_weights_and_1x128_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    """The SM90 binding hands fp8_mega_moe the fp8_block weights with fp32 block scales through
    transform_weights_for_mega_moe_sm90 and FP8 tokens with fp32 1x128 scales."""
    from dsv4hal.kernels.deepgemm_mega_moe import make_sm90

    fake = _FakeDeepGemm()
    fake.sm90 = True
    install_modules(monkeypatch, {"deep_gemm": fake.module})
    ep, w = _ep(), _weights("fp8_block")
    backend = make_sm90()
    state = backend.prepare(ep, w)
    t = fake.recorder.only("transform_weights_for_mega_moe_sm90").tensors
    assert torch.equal(t["l1"].view(torch.uint8), w.w13.view(torch.uint8))
    assert t["l1_sf"].dtype == torch.float32 and t["l1_sf"].shape == (E, 2, 1)
    x, ids, tw = _inputs(1)
    backend.run(ep, x, ids, tw, state, True, 10.0)
    call = fake.recorder.only("fp8_mega_moe")
    assert call.tensors["x_sf"].dtype == torch.float32 and call.kwargs["activation_clamp"] == 10.0


def test_mega_moe_sm90_without_fp8_mega_moe_falls_back_to_split(monkeypatch: pytest.MonkeyPatch) -> None:
    """A deep_gemm without fp8_mega_moe makes the SM90 backend fail to build with ImportError naming the entry
    point; ExpertParallel marks it broken and takes the split path."""
    from dsv4hal.distributed import ExpertParallel
    from dsv4hal.kernels.deepgemm_mega_moe import make_sm90

    install_modules(monkeypatch, {"deep_gemm": _FakeDeepGemm(with_sm90=False).module})
    with pytest.raises(ImportError, match="fp8_mega_moe"):
        make_sm90()
    p = dsv4hal.select_platform(info=simulated_info("sm90", deep_gemm="2.6.1"))
    ep = ExpertParallel(num_experts=E, hidden=H, top_k=K, max_tokens_per_rank=MAX_TOKENS, platform=p)
    case = {"group_backend": "nccl", "device": "cuda"}
    monkeypatch.setattr("dsv4hal.distributed.fused.fused_case", lambda ep, w, device: {
        "world_size": 1, "weights": w.format, "hidden": H, "intermediate": I, "top_k": K, "experts_per_rank": E,
        "max_tokens": MAX_TOKENS, **case})
    d = ep.decide_fused(_weights("fp8_block"))
    assert d.chosen.name == "split"
    assert "fp8_mega_moe" in "; ".join(next(c for c in d.candidates if c.name == "deepgemm_mega_moe_sm90").reasons)


# ---------------------------------------------------------------- bad input


def test_fused_moe_bad_input_raises_typed_errors_naming_the_argument() -> None:
    """Weights of another rank's expert count, a prepared object that is not FusedWeights, int64 ids, a batch over
    max_tokens_per_rank and weights that are not ExpertWeights each raise ExpertParallelError (agreed over the
    group) naming the argument, with a remedy."""
    from dsv4hal.distributed import local_expert_weights

    ep, w = _ep(), _weights()
    x, ids, tw = _inputs(0)
    with pytest.raises(ExpertParallelError, match="weights") as exc:
        ep.prepare_fused_weights(local_expert_weights(w, [0, 1]))
    assert exc.value.remedy
    fw = ep.prepare_fused_weights(w)
    for args, what in (((x, ids, tw, "weights"), "prepared"), ((x, ids.long(), tw, fw), "topk_ids"),
                       ((x.repeat(2, 1), ids.repeat(2, 1), tw.repeat(2, 1), fw), "max_tokens_per_rank")):
        with pytest.raises(ExpertParallelError, match=what):
            ep.fused_moe(*args)
    with pytest.raises(ExpertParallelError, match="ExpertWeights"):
        ep.prepare_fused_weights("w")  # type: ignore[arg-type]
