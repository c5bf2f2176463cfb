"""The direct-call entry: torch.ops.dsv4hal.<op>(<flat arguments>..., platform.handle) keeps the flat schema callers
pass positionally, validates as eager does, and names a freed platform's handle with a typed error."""

from __future__ import annotations

import gc

import pytest
import torch
from conftest import fake, first_conformance_case

import dsv4hal
from dsv4hal import custom_ops
from dsv4hal.errors import Dsv4HalError, InvalidArgumentError
from dsv4hal.formats.experts import quantize_experts
from dsv4hal.formats.v4_cache import V4PagedCache
from dsv4hal.ops.catalog import OP_NAMES

# SchemaCheckMode's allclose has no CPU float8 kernel (as test_custom_ops)
NO_SCHEMA_CHECK = {"indexer_logits", "fp8_linear", "fp8_grouped_linear"}


@pytest.fixture(scope="module")
def cpu() -> dsv4hal.Platform:
    return dsv4hal.select_platform(info=fake("cpu"))


@pytest.fixture(scope="module")
def checked() -> dsv4hal.Platform:
    return dsv4hal.select_platform(info=fake("cpu"), checked=True)


def _topk_inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    s, lengths = torch.randn(2, 700), torch.tensor([700, 300], dtype=torch.int32)
    return s, lengths, torch.arange(22, dtype=torch.int32).reshape(2, 11)


def _mhc_inputs() -> tuple[torch.Tensor, ...]:
    return torch.randn(3, 4, 16).bfloat16(), torch.randn(24, 64) * 0.1, torch.zeros(24), torch.ones(3)


def test_direct_op_schema_keeps_the_positional_arguments_callers_pass() -> None:
    """The direct ops' schemas name and order their arguments as callers pass them, the platform handle last."""
    dsv4hal.select_platform(info=fake("cpu"))

    def names(op: str) -> list[str]:
        return [a.name for a in getattr(torch.ops.dsv4hal, op).default._schema.arguments]

    assert names("moe_experts") == ["x", "topk_ids", "topk_weights", "weight_tensors", "weights", "swiglu_limit",
                                    "platform"]
    assert names("pack_store") == ["k", "loc", "cache", "page_size", "fp8", "platform"]
    assert names("sparse_attention_decode")[1:4] == ["swa_cache", "swa_page_size", "swa_fp8"]
    assert names("sparse_attention_decode")[8:11] == ["extra_cache", "extra_page_size", "extra_fp8"]
    assert names("indexer_logits") == ["q", "weights", "cache", "fp8", "context_lens", "block_table", "platform"]
    assert str(torch.ops.dsv4hal.build_attention_metadata_out.default._schema).endswith(
        "Scalar index_topk, Tensor(a4!)[] out, SymInt platform) -> ()")


def test_direct_op_refuses_a_bool_for_an_int(cpu: dsv4hal.Platform, checked: dsv4hal.Platform) -> None:
    """A bool passed for an int or float scalar reaches the eager validation as a bool and is refused, typed."""
    s, lengths, pt = _topk_inputs()
    with pytest.raises(InvalidArgumentError, match="'page_size'"):
        torch.ops.dsv4hal.indexer_topk(s, lengths, 512, pt, True, cpu.handle)
    x, fn, base, scale = _mhc_inputs()
    with pytest.raises(InvalidArgumentError, match="'sinkhorn_iters'"):
        torch.ops.dsv4hal.mhc_pre(x, fn, base, scale, 1e-6, 1e-6, True, checked.handle)
    with pytest.raises(InvalidArgumentError, match="'rms_eps'"):
        torch.ops.dsv4hal.mhc_pre(x, fn, base, scale, True, 1e-6, 20, checked.handle)
    y, post, comb = torch.ops.dsv4hal.mhc_pre(x, fn, base, scale, 1e-6, 1e-6, 20, checked.handle)
    assert y.shape == (3, 16) and torch.isfinite(comb).all()


def test_direct_op_refuses_meta_tensors_outside_fake_mode(cpu: dsv4hal.Platform) -> None:
    """A meta tensor sends a direct call to the fake, which refuses it outside tracing: nothing is returned or
    written."""
    c = V4PagedCache.empty(2, 64)
    cpu.ops.pack_store(torch.randn(128, 512).bfloat16(), torch.arange(128), c)
    with pytest.raises(InvalidArgumentError, match="'loc' expected a tensor with data"):
        torch.ops.dsv4hal.dequant_gather(c.data, 64, "e4m3fn", torch.tensor([3, 5], device="meta"), cpu.handle)
    before = c.data.clone()
    with pytest.raises(InvalidArgumentError, match="'k' expected a tensor with data"):
        torch.ops.dsv4hal.pack_store(torch.randn(2, 512, device="meta").bfloat16(), torch.tensor([0, 1]), c.data,
                                     64, "e4m3fn", cpu.handle)
    assert torch.equal(c.data, before)


def test_direct_moe_experts_refuses_tensors_of_other_weights(cpu: dsv4hal.Platform) -> None:
    """moe_experts' weight tensors must be those of the weights its handle names: other weights' or none are
    refused, typed, naming weight_tensors."""
    def experts(fmt: str, seed: int):  # noqa: ANN202
        g = torch.Generator().manual_seed(seed)
        return quantize_experts(torch.randn(4, 128, 64, generator=g) * 0.1, torch.randn(4, 64, 64, generator=g) * 0.1,
                                fmt)

    a = cpu.ops.moe_experts.prepare_weights(experts("mxfp4", 1))
    b = cpu.ops.moe_experts.prepare_weights(experts("fp8_block", 7))
    x, ids = torch.randn(3, 64).bfloat16(), torch.tensor([[0, 1], [2, 3], [1, -1]], dtype=torch.int32)
    tw = torch.rand(3, 2)
    y = torch.ops.dsv4hal.moe_experts(x, ids, tw, list(a._tensors), a._handle, 10.0, cpu.handle)
    assert torch.equal(y, cpu.ops.moe_experts(x, ids, tw, a))
    for tensors in (list(b._tensors), []):
        with pytest.raises(InvalidArgumentError, match="'weight_tensors' expected the"):
            torch.ops.dsv4hal.moe_experts(x, ids, tw, tensors, a._handle, 10.0, cpu.handle)


def test_direct_op_with_a_freed_platforms_handle_raises_typed_error_with_remedy() -> None:
    """The handle of a platform that was freed names no platform: a typed error saying to pass a live one."""
    p = dsv4hal.select_platform(info=fake("cpu"))
    handle = p.handle
    del p
    gc.collect()
    x, fn, base, scale = _mhc_inputs()
    with pytest.raises(Dsv4HalError, match=f"no live platform has handle {handle}") as e:
        torch.ops.dsv4hal.mhc_head(x, fn[:4], base[:4], scale[:1], 1e-6, 1e-6, handle)
    assert "select_platform" in (e.value.remedy or "")
    assert handle not in custom_ops.DIRECT_CALL_PLATFORMS


@pytest.mark.parametrize("op", OP_NAMES)
def test_direct_op_passes_opcheck_on_its_first_conformance_case(cpu: dsv4hal.Platform, op: str) -> None:
    """Each direct op passes torch.library.opcheck (schema, fake, autograd registration) on its first case."""
    args = first_conformance_case(cpu, op)
    overload, flat = custom_ops.flatten(cpu.ops[op], direct=True, **args)
    assert overload is getattr(torch.ops.dsv4hal, op + ("_out" if args.get("out") is not None else ""))
    assert flat[-1] == cpu.handle
    utils = ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
    torch.library.opcheck(overload, flat, test_utils=utils if op in NO_SCHEMA_CHECK else ("test_schema", *utils))
