"""The moe_route binding to vLLM's topk_softplus_sqrt, checked by recording the call against the op's
0.24.0 schema (a fake registered through torch.library; its outputs are never checked numerically)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from dsv4hal_cuda_sm90 import vllm_moe_lib, vllm_router
from vendor_fakes import define_fake_op

import dsv4hal
from dsv4hal.hardware import simulated

SCHEMA = ("topk_softplus_sqrt(Tensor! topk_weights, Tensor! topk_indices, Tensor! token_expert_indices, "
          "Tensor gating_output, bool renormalize, float routed_scaling_factor, Tensor? bias, Tensor? input_ids, "
          "Tensor? tid2eid) -> ()")
CALLS: list[dict] = []


def _fake(topk_weights, topk_indices, token_expert_indices, gating_output, renormalize, routed_scaling_factor,  # noqa: ANN001, ANN202
          bias, input_ids, tid2eid):
    CALLS.append(dict(w=topk_weights, ids=topk_indices, tei=token_expert_indices, logits=gating_output,
                      renormalize=renormalize, scale=routed_scaling_factor, bias=bias, input_ids=input_ids,
                      tid2eid=tid2eid))


@pytest.fixture(scope="module")
def fake_op() -> None:
    if not vllm_moe_lib.op_registered(vllm_router.OP_NAME):  # the real library may be loaded on a GPU machine
        define_fake_op(vllm_moe_lib.NAMESPACE, SCHEMA, _fake)


def test_marshalling_non_hash(fake_op) -> None:  # noqa: ANN001
    """The vLLM router binding passes the op int32 ids and fp32 weights it returns."""
    CALLS.clear()
    logits, bias = torch.randn(5, 256), torch.randn(256)
    ids, w = vllm_router.moe_route(logits, bias, 6, 1.5)
    (c,) = CALLS
    assert c["w"] is w and c["ids"] is ids and w.dtype == torch.float32 and ids.dtype == torch.int32
    assert c["tei"].shape == (5, 6) and c["tei"].dtype == torch.int32
    assert c["renormalize"] is True and c["scale"] == 1.5 and c["bias"] is bias and c["tid2eid"] is None


def test_marshalling_hash_uses_index_dtype(fake_op) -> None:  # noqa: ANN001
    """Hash routing passes the table and input ids as int32 with the scale."""
    CALLS.clear()
    table = torch.randint(0, 256, (100, 6), dtype=torch.int64)
    vllm_router.moe_route(torch.randn(3, 256), None, 6, 2.5, table, torch.tensor([1, 2, 99]))
    (c,) = CALLS
    assert c["tid2eid"].dtype == torch.int32 and c["input_ids"].dtype == torch.int32  # same as topk_indices
    assert torch.equal(c["tid2eid"], table.int()) and c["scale"] == 2.5


def test_selection() -> None:
    """The vLLM router is chosen for its supported case and rejected otherwise, with reasons."""
    info = simulated("sm90", libraries={"torch": "2", "vllm_moe": "0.24"})
    p = dsv4hal.select_platform(info=info)
    d = p.explain("moe_route", {"hash": False, "bias": True, "E": 256, "top_k": 6, "tokens": "decode"})
    cand = {c.name: c for c in d.candidates}
    assert cand[vllm_router.NAME].status == "chosen"
    d = p.explain("moe_route", {"hash": False, "bias": True, "E": 100, "top_k": 6, "tokens": "decode"})
    cand = {c.name: c for c in d.candidates}
    assert any("not 100" in r for r in cand[vllm_router.NAME].reasons)
    assert cand["triton_moe_route"].status == "rejected"  # no triton on this simulated machine
    assert d.chosen.name == "torch_reference"
    detected = dataclasses.replace(info, detected_by="nvidia-smi", libraries={"torch": "2"})
    assert vllm_router.supports({"E": 256}, detected) or vllm_moe_lib.op_registered(vllm_router.OP_NAME)
