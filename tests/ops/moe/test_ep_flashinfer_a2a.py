"""FlashInfer's MoE all-to-all as an expert-parallel backend: selection and explain against DeepEP and the torch
collectives, and the binding's arguments against a fake `flashinfer.comm` (not installed here: its kernels are not
run). The fake stands for one rank's view: tokens routed to this rank land in its own source row."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from vendor_fakes import Recorder, fake_module, install_modules, simulated_info

import dsv4hal
from dsv4hal.distributed import ExpertMap, ExpertParallel
from dsv4hal.distributed.backends import EP_OP
from dsv4hal.distributed.backends.base import EPContext
from dsv4hal.distributed.packing import RowCodec
from dsv4hal.errors import PluginFaultError, UnsupportedCaseError
from dsv4hal.kernels.deepep import DEEPEP_PRIORITY
from dsv4hal.kernels.flashinfer_a2a import FLASHINFER_A2A_PRIORITY, make
from dsv4hal.selection import Decision

FI = "0.6.16"


def _case(world: int = 8, mode: str = "decode", layout: str = "standard", backend: str = "nccl",
          device: str = "cuda", top_k: int = 6, hidden: int = 4096) -> dict[str, object]:
    return {"world_size": world, "group_backend": backend, "mode": mode, "layout": layout, "dtype": "bf16",
            "hidden": hidden, "top_k": top_k, "experts_per_rank": 32, "device": device}


def _decide(case: dict[str, object], arch: str = "sm90", **libs: str) -> Decision:
    return dsv4hal.select_platform(info=simulated_info(arch, **libs)).decide_collective(EP_OP, case)


def _reasons(d: Decision, name: str) -> str:
    return "; ".join(next(c for c in d.candidates if c.name == name).reasons)


def test_flashinfer_a2a_chosen_over_torch_collectives_for_decode_standard_on_nccl() -> None:
    """On SM90 and SM100 with flashinfer, decode mode with the standard layout on an NCCL group takes the FlashInfer
    all-to-all, and explain lists the torch all_to_all as eligible below it."""
    for arch in ("sm90", "sm100"):
        d = _decide(_case(), arch, flashinfer=FI)
        assert d.chosen.name == f"flashinfer_a2a_{arch}" and d.chosen.plugin == f"cuda_{arch}"
        assert "eligible torch_all_to_all" in d.explain()


def test_flashinfer_a2a_refused_with_reasons_where_it_cannot_run() -> None:
    """Without flashinfer, with a release before 0.6.16, on gloo, in normal mode, for the batched layout, with an
    unsupported top_k, a hidden not a multiple of 8 or over 64 ranks it is refused naming why, and the torch
    all_to_all serves; one rank takes the loop-back."""
    for libs, case, why in (({}, _case(), "missing flashinfer"),
                            ({"flashinfer": "0.6.3"}, _case(), "predates 0.6.16"),
                            ({"flashinfer": FI}, _case(backend="gloo", device="cpu"), "NCCL"),
                            ({"flashinfer": FI}, _case(mode="normal"), "normal mode"),
                            ({"flashinfer": FI}, _case(layout="batched"), "batched layout"),
                            ({"flashinfer": FI}, _case(top_k=3), "top_k 3"),
                            ({"flashinfer": FI}, _case(hidden=4100), "multiple of 8"),
                            ({"flashinfer": FI}, _case(world=128), "at most 64 ranks")):
        d = _decide(case, **libs)
        assert d.chosen.name == "torch_all_to_all", (why, d.chosen.name)
        assert why in _reasons(d, "flashinfer_a2a_sm90")
    assert _decide(_case(world=1), flashinfer=FI).chosen.name == "loopback"


def test_flashinfer_a2a_ranks_below_deepep_which_keeps_its_cases() -> None:
    """With deep_ep and flashinfer both installed, DeepEP (higher priority) keeps decode/batched and normal/standard,
    and the FlashInfer all-to-all takes decode/standard, which DeepEP refuses."""
    assert FLASHINFER_A2A_PRIORITY < DEEPEP_PRIORITY
    both = {"deep_ep": "1.2.1", "flashinfer": FI}
    assert _decide(_case(layout="batched"), **both).chosen.name == "deepep_sm90"
    assert _decide(_case(mode="normal"), **both).chosen.name == "deepep_sm90"
    d = _decide(_case(), **both)
    assert d.chosen.name == "flashinfer_a2a_sm90" and "batched layout" in _reasons(d, "deepep_sm90")


def test_flashinfer_a2a_registration_imports_neither_flashinfer_nor_torch() -> None:
    """Loading the CUDA plugins' registrations (which add the FlashInfer entry) imports no flashinfer; the binding
    module itself imports no torch."""
    code = ("import sys\n"
            "tried = []\n"
            "class Watch:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        tried.append(name) if name.split('.')[0] == 'flashinfer' else None\n"
            "sys.meta_path.insert(0, Watch())\n"
            "import dsv4hal\n"
            "from vendor_fakes import simulated_info\n"
            "p = dsv4hal.select_platform(info=simulated_info('sm90', flashinfer='0.6.16'))\n"
            "assert any(k.name == 'flashinfer_a2a_sm90' for k in p.registry.kernels_for('expert_parallel'))\n"
            "assert not tried, tried\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parents[2])
    assert run.returncode == 0, run.stderr
    bare = subprocess.run([sys.executable, "-c", "import sys; import dsv4hal.kernels.flashinfer_a2a; "
                           "assert 'torch' not in sys.modules"], capture_output=True, text=True)
    assert bare.returncode == 0, bare.stderr


class _FakeAllToAll:
    """One rank's view of flashinfer.comm.MoeAlltoAll: routes to this rank arrive in its own source row, every
    other row is stale (NaN rows, expert id 999) until sanitized."""

    recorder = Recorder()

    def __init__(self, mapping: Any, max_num_tokens: int, top_k: int, num_experts: int,
                 workspace_size_per_rank: int | None = None, hidden_size: int | None = None,
                 mnnvl_config: Any = None) -> None:
        self.rank, self.size, self.top_k, self.num_experts = mapping.rank, mapping.world_size, top_k, num_experts
        self.recorder.record("MoeAlltoAll", {"max_num_tokens": max_num_tokens, "top_k": top_k,
                                             "num_experts": num_experts, "workspace": workspace_size_per_rank,
                                             "comm": mnnvl_config.comm_backend}, ())

    def dispatch(self, token_selected_experts: torch.Tensor, input_payloads: list[torch.Tensor],
                 runtime_max_tokens_per_rank: int, invalid_token_expert_id: int | None = None,
                 expert_id_payload_index: int | None = None) -> list[torch.Tensor]:
        self.recorder.record("dispatch", {"token_selected_experts": token_selected_experts,
                                          **{f"payload{i}": p for i, p in enumerate(input_payloads)},
                                          "runtime_max_tokens_per_rank": runtime_max_tokens_per_rank,
                                          "invalid_token_expert_id": invalid_token_expert_id,
                                          "expert_id_payload_index": expert_id_payload_index}, ())
        per_rank = self.num_experts // self.size
        here = (token_selected_experts // per_rank == self.rank).any(dim=1).nonzero().flatten()
        out = []
        for i, p in enumerate(input_payloads):
            stale: float = float("nan")
            if i == expert_id_payload_index:  # sanitize writes the invalid id into every row past a source's count
                stale = 999 if invalid_token_expert_id is None else invalid_token_expert_id
            buf = torch.full((self.size, runtime_max_tokens_per_rank, *p.shape[1:]), stale).to(p.dtype)
            buf[self.rank, :len(here)] = p[here]
            out.append(buf)
        return out

    def combine(self, payload: torch.Tensor, runtime_max_tokens_per_rank: int) -> torch.Tensor:
        self.recorder.record("combine", {"payload": payload,
                                         "runtime_max_tokens_per_rank": runtime_max_tokens_per_rank}, ())
        return payload[self.rank, :3].clone()


class _NoWorkspace(_FakeAllToAll):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError("[MnnvlMemory] POSIX fd exchange via SCM_RIGHTS requires all ranks to share the same host")


def _install(monkeypatch: pytest.MonkeyPatch, cls: type = _FakeAllToAll) -> None:
    class Mapping:
        def __init__(self, world_size: int, rank: int, tp_size: int, moe_ep_size: int) -> None:
            self.world_size, self.rank = world_size, rank
            assert tp_size == moe_ep_size == world_size

    class MnnvlConfig:
        def __init__(self, comm_backend: Any) -> None:
            self.comm_backend = comm_backend

    def size(ep_size: int, max_num_tokens: int, dispatch_bytes: int, combine_bytes: int) -> int:
        return ep_size * max_num_tokens * (dispatch_bytes + combine_bytes)

    _FakeAllToAll.recorder = Recorder()
    comm = fake_module("flashinfer.comm", MoeAlltoAll=cls, Mapping=Mapping, MnnvlConfig=MnnvlConfig,
                       moe_a2a_get_workspace_size_per_rank=size)
    install_modules(monkeypatch, {"flashinfer": fake_module("flashinfer"), "flashinfer.comm": comm})


def _ctx(fp8: str | None = None, rank: int = 1) -> EPContext:
    return EPContext(object(), 2, rank, 16, 256, 6, RowCodec(256, 6, fp8), 4)


def test_flashinfer_a2a_dispatch_reroutes_minus_one_and_returns_local_ids(monkeypatch: pytest.MonkeyPatch) -> None:
    """Dispatch sends int32 routing ids with -1 (and ids past the experts) rerouted to this rank's first slot, -1 in
    the ids payload, the bf16 rows and fp32 weights, max_tokens_per_rank rows a rank; it returns the standard layout
    of world * max_tokens rows with local ids (-1 for another rank's experts and stale rows, whose weights are 0)
    and the counts."""
    _install(monkeypatch)
    x = torch.randn(3, 256).to(torch.bfloat16)
    ids = torch.tensor([[8, 9, 0, 1, 2, 3], [-1, 0, 1, 2, 3, 4], [15, 16, -1, 5, 6, 7]])
    w = torch.rand(3, 6)
    d = make().dispatch(_ctx(), x, ids, w, "standard", True).wait()
    call = _FakeAllToAll.recorder.only("dispatch")
    route = call.tensors["token_selected_experts"]
    assert route.dtype == torch.int32 and route.tolist() == [[8, 9, 0, 1, 2, 3], [8, 0, 1, 2, 3, 4],
                                                             [15, 8, 8, 5, 6, 7]]
    assert call.tensors["payload1"].tolist() == [[8, 9, 0, 1, 2, 3], [-1, 0, 1, 2, 3, 4], [15, -1, -1, 5, 6, 7]]
    assert torch.equal(call.tensors["payload0"], x) and torch.equal(call.tensors["payload2"], w)
    assert call.kwargs["runtime_max_tokens_per_rank"] == 4 and call.kwargs["expert_id_payload_index"] == 1
    assert call.kwargs["invalid_token_expert_id"] == -1
    init = _FakeAllToAll.recorder.only("MoeAlltoAll")
    assert init.kwargs["num_experts"] == 16 and init.kwargs["top_k"] == 6 and init.kwargs["max_num_tokens"] == 4
    assert init.kwargs["workspace"] == 2 * 4 * ((256 * 2 + 6 * 4 * 2) + 256 * 2)
    assert d.layout == "standard" and d.x.shape == (8, 256) and d.x.dtype == torch.bfloat16 and d.x_scale is None
    assert d.topk_ids is not None and d.topk_ids.dtype == torch.int32 and d.topk_ids.shape == (8, 6)
    # rank 1 holds physical experts 8..15: all three tokens reach it (token 1 only through its rerouted -1)
    assert d.topk_ids[4:7].tolist() == [[0, 1, -1, -1, -1, -1], [-1, -1, -1, -1, -1, -1], [7, -1, -1, -1, -1, -1]]
    assert (d.topk_ids[:4] == -1).all() and (d.topk_ids[7] == -1).all()
    assert torch.equal(d.x[4:7], x) and d.topk_weights is not None
    assert torch.equal(d.topk_weights[4:7], torch.where(d.topk_ids[4:7] >= 0, w, 0.0))
    assert (d.topk_weights[:4] == 0).all() and (d.topk_weights[7] == 0).all()  # stale (NaN) weights zeroed
    assert d.counts.dtype == torch.int32 and d.counts.tolist() == [1, 1, 0, 0, 0, 0, 0, 1]
    assert d.handle.out_rows == 8 and d.handle.decode and d.handle.num_tokens == 3


def test_flashinfer_a2a_fp8_dispatch_sends_rows_and_block_scales(monkeypatch: pytest.MonkeyPatch) -> None:
    """With dtype fp8 the rows go as e4m3 with fp32 1x128 scales (two payloads before the ids); the workspace is
    sized for them and the Dispatched carries both."""
    _install(monkeypatch)
    x = torch.randn(3, 256).to(torch.bfloat16)
    d = make().dispatch(_ctx("e4m3fn"), x, torch.full((3, 6), 9), torch.rand(3, 6), "standard", True).wait()
    call = _FakeAllToAll.recorder.only("dispatch")
    assert call.tensors["payload0"].dtype == torch.float8_e4m3fn and call.tensors["payload1"].shape == (3, 2)
    assert call.kwargs["expert_id_payload_index"] == 2
    assert _FakeAllToAll.recorder.only("MoeAlltoAll").kwargs["workspace"] == 2 * 4 * ((256 + 8 + 48) + 512)
    assert d.x.dtype == torch.float8_e4m3fn and d.x_scale is not None and d.x_scale.shape == (8, 2)
    assert torch.allclose(d.dequantized()[4:7].float(), x.float(), rtol=0.07, atol=0.02)


def test_flashinfer_a2a_combine_hands_rows_per_source_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    """Combine passes the experts' standard-layout rows as [world, max_tokens, H] bf16 with max_tokens_per_rank, to
    the same MoeAlltoAll that dispatched, and returns its [T, H] result."""
    _install(monkeypatch)
    backend, ctx = make(), _ctx()
    d = backend.dispatch(ctx, torch.zeros(3, 256, dtype=torch.bfloat16), torch.full((3, 6), 9), torch.rand(3, 6),
                         "standard", True).wait()
    rows = torch.randn(8, 256).to(torch.bfloat16)
    y = backend.combine(ctx, rows, d.handle).wait()
    call = _FakeAllToAll.recorder.only("combine")
    assert call.tensors["payload"].shape == (2, 4, 256) and call.tensors["payload"].dtype == torch.bfloat16
    assert call.kwargs["runtime_max_tokens_per_rank"] == 4
    assert torch.equal(y, rows[4:7]) and len(_FakeAllToAll.recorder.calls) == 3  # one MoeAlltoAll, reused


def test_flashinfer_a2a_receives_physical_ids_from_expert_parallel(monkeypatch: pytest.MonkeyPatch) -> None:
    """ExpertParallel maps logical ids through its ExpertMap before the backend: the routing ids FlashInfer gets are
    the physical slots (a redundant expert's replica included), -1 kept as dropped."""
    _install(monkeypatch)
    emap = ExpertMap.from_slots([0, 1, 2, 3, 0, 1, 2, 3], 4)
    ep = ExpertParallel(num_experts=4, hidden=256, top_k=2, expert_map=emap, max_tokens_per_rank=4,
                        platform=dsv4hal.select_platform("cpu"))
    backend = make()
    monkeypatch.setattr(ep, "_backend", lambda decode, layout, device: backend)
    logical = torch.tensor([[3, 1], [2, -1]], dtype=torch.int32)
    ep.dispatch(torch.zeros(2, 256, dtype=torch.bfloat16), logical, torch.rand(2, 2), decode=True)
    sent = _FakeAllToAll.recorder.only("dispatch").tensors["payload1"]
    expected = emap.physical(logical)
    assert torch.equal(sent, torch.where(expected >= 0, expected, -1).to(torch.int32))
    assert sent[1, 1] == -1 and set(sent[0].tolist()) <= {1, 3, 5, 7}


def test_flashinfer_a2a_old_release_or_failed_workspace_is_a_typed_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """A flashinfer.comm without MoeAlltoAll raises PluginFaultError naming the release to install; a workspace
    that cannot be shared (ranks on several hosts without FABRIC handles) raises UnsupportedCaseError naming the
    override that avoids it."""
    args = (_ctx(), torch.zeros(1, 256, dtype=torch.bfloat16), torch.zeros(1, 6), torch.rand(1, 6), "standard", True)
    install_modules(monkeypatch, {"flashinfer": fake_module("flashinfer"),
                                  "flashinfer.comm": fake_module("flashinfer.comm")})
    with pytest.raises(PluginFaultError, match="0.6.16"):
        make().dispatch(*args)
    _install(monkeypatch, _NoWorkspace)
    with pytest.raises(UnsupportedCaseError, match="expert_parallel=torch_all_to_all"):
        make().dispatch(*args)
