"""The triton_kernels MXFP4 MoE binding (cuda_sm90 plugin, oai_triton_moe): its route padding kernel against a torch
oracle (under the interpreter on the CPU), the gate/up interleave, its selection on simulated machines, and on a GPU
with triton_kernels installed the whole op against the reference, eagerly and in a CUDA graph."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from conftest import registry_with
from hypothesis import given, settings
from hypothesis import strategies as st

import dsv4hal
from dsv4hal import override as ov
from dsv4hal.formats.experts import quantize_experts
from dsv4hal.hardware import simulated
from dsv4hal.ops.moe import case_expert_weights
from dsv4hal.reference.moe import moe_experts as ref_moe_experts
from dsv4hal.selection import select_kernel

pytest.importorskip("triton")
from dsv4hal_cuda_sm90 import oai_triton_moe as oai  # noqa: E402
from dsv4hal_cuda_sm90.oai_kernels import padded_routes  # noqa: E402

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")
HAS_LIBRARY = torch.cuda.is_available() and importlib.util.find_spec("triton_kernels") is not None


def oracle(ids: torch.Tensor, w: torch.Tensor, e: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The routes rule by rule: ids outside [0, E) dropped, a repeated expert's weight summed into its first
    slot, k padded to a power of two with (-1, 0), one bit per kept (token, expert)."""
    t, k = ids.shape
    kp = 1 << (k - 1).bit_length()
    out_ids = torch.full((t, kp), -1, dtype=torch.int32)
    out_w = torch.zeros(t, kp)
    bits = torch.zeros(t, -(-e // 32), dtype=torch.int64)
    for r in range(t):
        seen: dict[int, int] = {}
        for j in range(k):
            x = int(ids[r, j])
            if not 0 <= x < e:
                continue
            if x in seen:
                out_w[r, seen[x]] += w[r, j]
                continue
            seen[x] = j
            out_ids[r, j], out_w[r, j] = x, w[r, j]
            bits[r, x // 32] |= 1 << (x % 32)
    return bits, out_ids, out_w


@settings(max_examples=25, deadline=None)
@given(t=st.integers(0, 40), k=st.sampled_from([1, 2, 3, 6, 8]), e=st.sampled_from([8, 33, 80]),
       seed=st.integers(0, 2 ** 31 - 1))
def test_padded_routes_follow_the_rules(t: int, k: int, e: int, seed: int) -> None:
    """padded_routes builds triton_kernels' bitmatrix and routes per the oracle, scratch zeroed."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(-3, e + 3, (t, k), generator=g, dtype=torch.int32)  # dropped ids both sides, repeats
    w = torch.rand(t, k, generator=g)
    bits, sums, got_ids, got_w = padded_routes(ids.to(DEV), w.to(DEV), e)
    want_bits, want_ids, want_w = oracle(ids, w, e)
    assert sums.shape == (32 * -(-e // 32),) and (t == 0 or not sums.any())  # the bitmatrix's scratchpad: zeroed
    assert torch.equal(got_ids.cpu(), want_ids)
    assert torch.allclose(got_w.cpu(), want_w, rtol=1e-6, atol=0)
    assert torch.equal(bits.cpu().view(torch.int32).long() & 0xFFFFFFFF, want_bits)


def test_interleave_gate_up() -> None:
    """interleave_gate_up alternates gate and up rows."""
    t = torch.arange(2 * 6 * 3).view(2, 6, 3)  # E=2, 2I=6: gate rows 0-2, up rows 3-5
    got = oai.interleave_gate_up(t)
    assert torch.equal(got[:, 0::2], t[:, :3]) and torch.equal(got[:, 1::2], t[:, 3:])


@pytest.mark.parametrize("perm", [(0, 1, 2), (0, 2, 1)])
def test_stack_keeps_the_chunks_memory_order(perm: tuple[int, int, int]) -> None:
    """Chunks converted a few experts at a time join into what one conversion of all experts gives: the same
    values and the same stride order (expert dim outermost); a layout with another outermost dim is refused."""
    full = torch.arange(5 * 6 * 4, dtype=torch.int32).view(5, 6, 4).permute(perm).contiguous().permute(
        [perm.index(d) for d in range(3)])  # memory order `perm`, logical [5, ...]
    parts = [full[0:2].clone(memory_format=torch.preserve_format), full[2:5].clone(memory_format=torch.preserve_format)]
    got = oai._stack(parts)
    assert torch.equal(got, full) and got.stride() == full.stride()
    assert oai._stack([full]) is full
    expert_inner = torch.arange(5 * 6, dtype=torch.int32).view(6, 5).t()  # [5, 6] with the expert dim innermost
    assert oai._stack([expert_inner[:2].clone(memory_format=torch.preserve_format), expert_inner[2:]]) is None


def test_chunked_conversion_equals_one_conversion() -> None:
    """prepare_weights converts PREPARE_CHUNK experts at a time: the same storage, strides and layout as converting
    all experts at once (wherever triton_kernels is importable; its layout code is torch code)."""
    pytest.importorskip("triton_kernels")
    w = _weights(h=256, i=128)
    e = w.num_experts
    for q, s in ((oai.interleave_gate_up(w.w13), oai.interleave_gate_up(w.w13_scale)), (w.w2, w.w2_scale)):
        chunked, whole = oai._to_library(q, s, chunk=3), oai._to_library(q, s, chunk=e)
        for a, b in zip(chunked, whole, strict=True):
            assert torch.equal(a.storage.data, b.storage.data)
            assert a.storage.data.stride() == b.storage.data.stride() and a.shape == b.shape
            assert type(a.storage.layout) is type(b.storage.layout)


def _decide(weights_case: dict, libraries: dict[str, str]):  # noqa: ANN202
    info = simulated("sm90", libraries={"torch": "2", "triton": "3", **libraries})
    return select_kernel(registry_with(strict=True), "moe_experts", weights_case, info, "cuda_sm90", ov.Overrides())


def _weights(fmt: str = "mxfp4", h: int = 256, i: int = 128):  # noqa: ANN202
    g = torch.Generator().manual_seed(0)
    return quantize_experts(torch.randn(4, 2 * i, h, generator=g) * 0.1, torch.randn(4, h, i, generator=g) * 0.1, fmt)


def test_selection_below_marlin_up_to_64_tokens_above_it_from_65_and_reasons() -> None:
    """triton_kernels MoE ranks below Marlin up to 64 tokens and above it from 65."""
    both = {"triton_kernels": "1", "vllm_moe": "0.24"}
    for tokens in (None, 1, 8, 9, 64):  # few (the default) and decode: the portable fused MoE, Marlin, triton_kernels
        d = _decide(case_expert_weights(_weights(), tokens), both)
        cand = {c.name: c for c in d.candidates}
        assert d.chosen.name == "triton_fused_moe" and cand[oai.NAME].status == "eligible"
        assert cand["marlin_mxfp4_sm90"].status == "eligible"
        assert cand["triton_fused_moe"].priority > cand["marlin_mxfp4_sm90"].priority > cand[oai.NAME].priority
    for tokens in (65, 4096):  # prefill: triton_kernels, measured faster than Marlin from T = 16 up
        d = _decide(case_expert_weights(_weights(), tokens), both)
        cand = {c.name: c for c in d.candidates}
        assert d.chosen.name == oai.NAME and cand["marlin_mxfp4_sm90"].status == "eligible"
        assert cand[oai.NAME].priority > cand["marlin_mxfp4_sm90"].priority
    d = _decide(case_expert_weights(_weights("fp8_block"), 4096), both)  # no MXFP4: its reason, whatever the class
    assert d.chosen.name != oai.NAME and next(c for c in d.candidates if c.name == oai.NAME).reasons
    only_oai = {"triton_kernels": "1"}  # without Marlin's library: the vendor choice from 65 tokens
    assert _decide(case_expert_weights(_weights(), 65), only_oai).chosen.name == oai.NAME
    assert _decide(case_expert_weights(_weights(), 64), only_oai).chosen.name == "triton_fused_moe"
    assert _decide(case_expert_weights(_weights()), only_oai).chosen.name == "triton_fused_moe"
    d = _decide(case_expert_weights(_weights()), {})
    assert next(c for c in d.candidates if c.name == oai.NAME).reasons == ("missing triton_kernels",)
    reasons = oai.supports(case_expert_weights(_weights(h=192, i=96)), simulated("sm90"))
    assert any("multiples of 128" in r and "H=192" in r and "I=96" in r for r in reasons)
    assert any("MXFP4 weights only" in r for r in oai.supports(case_expert_weights(_weights("fp8_block")),
                                                               simulated("sm90")))
    assert any("65534" in r for r in oai.supports({"format": "mxfp4", "E": 70000, "H": 256, "I": 128},
                                                  simulated("sm90")))


def test_prepare_refuses_other_weights_before_importing_the_library() -> None:
    """triton_kernels prepare_weights refuses non-MXFP4 or misaligned weights before importing."""
    with pytest.raises(ValueError, match="mxfp4"):
        oai.prepare_weights(_weights("fp8_block"))
    with pytest.raises(ValueError, match="multiples of 128"):
        oai.prepare_weights(_weights(h=192, i=96))


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_LIBRARY, reason="needs a CUDA GPU with triton_kernels (vLLM 0.24's bundle)")
@pytest.mark.parametrize(("t", "k", "e", "h", "i"), [(1, 6, 16, 512, 256), (5, 6, 16, 512, 256),
                                                     (64, 6, 32, 1024, 512), (33, 4, 8, 256, 128)])
def test_matches_the_reference_on_the_gpu(t: int, k: int, e: int, h: int, i: int) -> None:
    """triton_kernels MoE matches the reference on a GPU, a dropped route included."""
    g = torch.Generator().manual_seed(t * 131 + k)
    w = quantize_experts((torch.randn(e, 2 * i, h, generator=g) * 0.05).cuda(),
                         (torch.randn(e, h, i, generator=g) * 0.05).cuda(), "mxfp4")
    x = torch.randn(t, h, generator=g).bfloat16().cuda()
    ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)]).int()
    ids[0, -1] = -1  # a dropped route
    if t > 2:
        ids[1, 1] = ids[1, 0]  # a repeated expert
        ids[2] = e  # every route dropped (ids past E)
    tw = torch.rand(t, k, generator=g) + 0.1
    ids, tw = ids.cuda(), tw.cuda()
    with ov.overrides(kernels={"moe_experts": oai.NAME}):
        p = dsv4hal.select_platform()
    prepared = p.ops.moe_experts.prepare_weights(w)
    assert prepared.implementation == oai.NAME
    got = p.ops.moe_experts(x, ids, tw, prepared)
    want = ref_moe_experts(x, ids, tw, w)
    scale = want.float().abs().max().clamp_min(1e-6)
    assert bool(torch.isfinite(got).all())
    assert float((got.float() - want.float()).abs().max() / scale) < 2e-2
    if t > 2:
        assert bool((got[2] == 0).all())
    graph = torch.cuda.CUDAGraph()
    p.ops.moe_experts(x, ids, tw, prepared)  # warm: the kernel variants of this shape compiled
    with torch.cuda.graph(graph):
        out = p.ops.moe_experts(x, ids, tw, prepared)
    x.copy_(torch.randn(t, h, generator=g).bfloat16())
    graph.replay()
    torch.cuda.synchronize()
    want = ref_moe_experts(x, ids, tw, w)
    assert float((out.float() - want.float()).abs().max() / want.float().abs().max().clamp_min(1e-6)) < 2e-2


def test_prepare_weights_states_the_token_class() -> None:
    """prepare_weights records the token class: few up to 8 tokens, decode above."""
    from dsv4hal.errors import InvalidArgumentError

    op = dsv4hal.select_platform("cpu").ops.moe_experts
    assert op.prepare_weights(_weights()).case["tokens"] == "few"
    assert op.prepare_weights(_weights(), tokens=8).case["tokens"] == "few"
    assert op.prepare_weights(_weights(), tokens=9).case["tokens"] == "decode"
    assert op.prepare_weights(_weights(), tokens=64).case["tokens"] == "decode"
    assert op.prepare_weights(_weights(), tokens=65).case["tokens"] == "prefill"
    assert op.prepare_weights(_weights(), tokens=torch.tensor(4096)).case["tokens"] == "prefill"  # any integer
    for bad in (0, -3, 2.5, True, "4096", torch.tensor(1.5)):
        with pytest.raises(InvalidArgumentError, match="tokens") as err:
            op.prepare_weights(_weights(), tokens=bad)  # type: ignore[arg-type]
        assert repr(bad) in str(err.value)  # the value given, as given
