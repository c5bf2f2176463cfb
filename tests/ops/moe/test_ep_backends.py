"""Selection and explain of expert-parallel backends (KernelImpl entries of the collective op expert_parallel in the
main registry), and the DeepEP binding against a fake deep_ep (not installed here: its kernels are not run)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from vendor_fakes import Recorder, fake_module, install_modules, simulated_info

import dsv4hal
from dsv4hal.distributed.backends import EP_OP
from dsv4hal.distributed.backends.base import EPContext
from dsv4hal.distributed.packing import RowCodec
from dsv4hal.errors import UnknownOpError, UnsupportedCaseError
from dsv4hal.selection import Decision


def _case(world: int = 8, mode: str = "decode", layout: str = "batched", backend: str = "nccl",
          device: str = "cuda") -> dict[str, object]:
    return {"world_size": world, "group_backend": backend, "mode": mode, "layout": layout, "dtype": "fp8",
            "hidden": 4096, "top_k": 6, "experts_per_rank": 32, "device": device}


def _decide(case: dict[str, object], arch: str = "sm90", forced: str | None = None, **libs: str) -> Decision:
    return dsv4hal.select_platform(info=simulated_info(arch, **libs)).decide_collective(EP_OP, case, forced=forced)


def test_ep_selection_prefers_deepep_where_installed_and_explains_each_candidate() -> None:
    """On an SM90 or SM100 machine with deep_ep, DeepEP wins; explain lists the torch backends as eligible and the
    loop-back as refused for 8 ranks."""
    for arch in ("sm90", "sm100"):
        d = _decide(_case(), arch, deep_ep="1.2.1")
        assert d.chosen.name == f"deepep_{arch}" and d.chosen.plugin == f"cuda_{arch}"
        text = d.explain()
        assert "eligible torch_all_to_all" in text and "loop-back serves one rank" in text


def test_ep_selection_refuses_deepep_without_library_gloo_or_wrong_layout() -> None:
    """Without deep_ep, on a gloo group, or decode mode asking for the standard layout, DeepEP is refused with the
    reason and the torch all_to_all is chosen; one rank gets the loop-back."""
    for libs, case, why in (({}, _case(), "missing deep_ep"),
                            ({"deep_ep": "1"}, _case(backend="gloo", device="cpu"), "NCCL"),
                            ({"deep_ep": "1"}, _case(layout="standard"), "batched layout")):
        d = _decide(case, **libs)
        assert d.chosen.name == "torch_all_to_all"
        assert why in "; ".join(next(c for c in d.candidates if c.name == "deepep_sm90").reasons)
    assert _decide(_case(world=1)).chosen.name == "loopback"


def test_ep_forced_backend_that_cannot_run_is_a_typed_error() -> None:
    """Forcing the loop-back on 8 ranks raises UnsupportedCaseError naming its reason."""
    with pytest.raises(UnsupportedCaseError, match="loop-back serves one rank"):
        _decide(_case(), forced="loopback")


class _FakeBuffer:
    recorder = Recorder()

    def __init__(self, group: Any, num_nvl_bytes: int = 0, num_rdma_bytes: int = 0, low_latency_mode: bool = False,
                 num_qps_per_rank: int = 12) -> None:
        self.recorder.record("Buffer", {"num_rdma_bytes": num_rdma_bytes, "low_latency_mode": low_latency_mode,
                                        "num_qps_per_rank": num_qps_per_rank}, ())

    @staticmethod
    def get_low_latency_rdma_size_hint(max_tokens: int, hidden: int, ranks: int, experts: int) -> int:
        return max_tokens * hidden * ranks

    def low_latency_dispatch(self, x, topk_idx, num_max_dispatch_tokens_per_rank, num_experts,  # noqa: ANN001, ANN201
                             cumulative_local_expert_recv_stats=None, dispatch_wait_recv_cost_stats=None,  # noqa: ANN001
                             use_fp8=True, round_scale=False, use_ue8m0=False, async_finish=False,  # noqa: ANN001
                             return_recv_hook=False):  # noqa: ANN001
        self.recorder.record("low_latency_dispatch", {"x": x, "topk_idx": topk_idx,
                             "num_max_dispatch_tokens_per_rank": num_max_dispatch_tokens_per_rank,
                             "num_experts": num_experts, "use_fp8": use_fp8, "return_recv_hook": return_recv_hook}, ())
        e_local, rows, h = num_experts // 2, num_max_dispatch_tokens_per_rank * 2, x.shape[1]
        recv = (torch.zeros(e_local, rows, h, dtype=torch.float8_e4m3fn), torch.zeros(e_local, rows, h // 128))
        return recv, torch.zeros(e_local, dtype=torch.int32), ("h",), None, lambda: None


def test_deepep_low_latency_dispatch_gets_int64_ids_and_the_worst_case_sizes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Decode mode calls deep_ep.Buffer.low_latency_dispatch with int64 physical ids, max_tokens_per_rank, the
    physical expert count, FP8 on and a receive hook; the result is the batched layout of E_local experts."""
    _FakeBuffer.recorder = Recorder()
    install_modules(monkeypatch, {"deep_ep": fake_module("deep_ep", Buffer=_FakeBuffer)})
    from dsv4hal.kernels.deepep import make

    class Group:
        pass

    ctx = EPContext(Group(), 2, 0, 16, 256, 6, RowCodec(256, 6, "e4m3fn"), 8)
    ids = torch.randint(0, 16, (3, 6))
    d = make().dispatch(ctx, torch.zeros(3, 256, dtype=torch.bfloat16), ids, torch.rand(3, 6), "batched",
                        True).wait()
    call = _FakeBuffer.recorder.only("low_latency_dispatch")
    assert call.tensors["topk_idx"].dtype == torch.int64 and torch.equal(call.tensors["topk_idx"], ids)
    assert call.kwargs["num_max_dispatch_tokens_per_rank"] == 8 and call.kwargs["num_experts"] == 16
    assert call.kwargs["use_fp8"] is True and call.kwargs["return_recv_hook"] is True
    assert d.layout == "batched" and d.x.shape == (8, 16, 256) and d.handle.out_rows == 16
    assert _FakeBuffer.recorder.only("Buffer").kwargs["low_latency_mode"] is True


def test_ep_backends_are_kernels_of_the_main_registry_not_bound_as_ops() -> None:
    """The loop-back, both torch collectives, DeepEP and FlashInfer's all-to-all for SM90 and SM100 are
    expert_parallel entries of the main registry; expert_parallel is a collective op, not a platform.ops tensor
    call."""
    p = dsv4hal.select_platform("cpu")
    assert {k.name for k in p.registry.kernels_for(EP_OP)} == {
        "loopback", "torch_all_to_all", "torch_all_gather", "deepep_sm90", "deepep_sm100", "flashinfer_a2a_sm90",
        "flashinfer_a2a_sm100"}
    assert EP_OP in p.registry.collectives and EP_OP not in p.registry.op_names
    with pytest.raises(UnknownOpError):
        p.ops[EP_OP]
