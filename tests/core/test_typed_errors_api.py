"""Mistakes an engine author makes through the API, the format helpers and torch.ops.dsv4hal.<op> called directly
are typed dsv4hal errors naming the argument and carrying a remedy."""

from __future__ import annotations

import pytest
import torch

import dsv4hal
import dsv4hal.checks as checks
from dsv4hal.custom_ops import custom_op
from dsv4hal.errors import BadCallError, Dsv4HalError, InvalidArgumentError, UnknownNameError, UnknownOpError
from dsv4hal.formats.compressor_state import new_state
from dsv4hal.formats.experts import quantize_experts
from dsv4hal.formats.indexer_cache import IndexerPagedCache
from dsv4hal.formats.v4_cache import V4PagedCache, convert_cache


@pytest.fixture(scope="module")
def cpu() -> dsv4hal.Platform:
    return dsv4hal.select_platform("cpu")


@pytest.fixture(scope="module")
def cpu_checked() -> dsv4hal.Platform:
    return dsv4hal.select_platform("cpu", checked=True)


def _experts(fmt: str = "mxfp4", seed: int = 1):  # noqa: ANN202
    g = torch.Generator().manual_seed(seed)
    return quantize_experts(torch.randn(4, 128, 64, generator=g) * 0.1, torch.randn(4, 64, 64, generator=g) * 0.1, fmt)


def _moe_inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return (torch.randn(3, 64).bfloat16(), torch.tensor([[0, 1], [2, 3], [1, -1]], dtype=torch.int32),
            torch.rand(3, 2))


# ------------------------------------------------------------------ calls the signature does not take

def test_wrong_argument_count_names_the_op_and_its_signature(cpu: dsv4hal.Platform) -> None:
    """Too few or too many arguments raise BadCallError (a TypeError) naming the op and its parameters."""
    cache, loc = V4PagedCache.empty(1, 64), torch.zeros(1, dtype=torch.int64)
    with pytest.raises(BadCallError, match=r"dequant_gather\(cache, loc\): missing a required argument: 'loc'"):
        cpu.ops.dequant_gather(cache)
    with pytest.raises(TypeError, match=r"dequant_gather\(cache, loc\): too many positional arguments") as e:
        cpu.ops.dequant_gather(cache, loc, 3)
    assert e.value.remedy and "platform.ops.dequant_gather" in e.value.remedy


@pytest.mark.parametrize("checked", [False, True])
def test_checked_keyword_is_refused_with_the_platform_remedy(checked: bool) -> None:
    """checked= passed to an op names the op and says to select the platform with checked=True."""
    p = dsv4hal.select_platform("cpu", checked=checked)
    with pytest.raises(BadCallError, match="dequant_gather: 'checked' is not an argument") as e:
        p.ops.dequant_gather(V4PagedCache.empty(1, 64), torch.zeros(1, dtype=torch.int64), checked=True)
    assert "select_platform(checked=True)" in str(e.value)


def test_unknown_op_attribute_lists_the_ops_and_keeps_hasattr(cpu: dsv4hal.Platform) -> None:
    """platform.ops.<unknown> is an UnknownOpError listing the ops; hasattr() stays False, ops[...] a KeyError."""
    with pytest.raises(UnknownOpError, match="unknown op 'nosuch'") as e:
        cpu.ops.nosuch  # noqa: B018
    assert isinstance(e.value, AttributeError) and "pack_store" in str(e.value) and "moe_experts" in str(e.value)
    assert not hasattr(cpu.ops, "nosuch") and hasattr(cpu.ops, "pack_store")
    with pytest.raises(UnknownNameError):
        cpu.ops["nosuch"]


def test_calling_an_op_definition_is_a_typed_error() -> None:
    """The op definition (dsv4hal.ops.<module>.<op>) is not callable: BadCallError pointing at platform.ops."""
    from dsv4hal.ops.pack_store import dequant_gather

    with pytest.raises(BadCallError, match="op definition") as e:
        dequant_gather(V4PagedCache.empty(1, 64), torch.zeros(1, dtype=torch.int64))
    assert "select_platform().ops.dequant_gather" in str(e.value)


# ------------------------------------------------------------------ prepared weights

def test_prepare_weights_refuses_a_list_field_before_reading_its_shape(cpu: dsv4hal.Platform) -> None:
    """An ExpertWeights field that is not a tensor is named by the typed error (its .shape is never read)."""
    ew = _experts()
    ew.w13 = ew.w13.tolist()
    with pytest.raises(InvalidArgumentError, match="'weights.w13' expected a torch.Tensor, got list"):
        cpu.ops.moe_experts.prepare_weights(ew)
    with pytest.raises(InvalidArgumentError, match="'weights' expected an ExpertWeights"):
        cpu.ops.moe_experts.prepare_weights([1, 2])


@pytest.mark.parametrize("checked", [False, True])
def test_meta_weights_are_refused_before_checked_mode_reads_them(checked: bool) -> None:
    """Weights without data (meta) are refused by a typed error in both modes; checked mode never reads them."""
    ew = _experts()
    for f in ("w13", "w13_scale", "w2", "w2_scale"):
        setattr(ew, f, getattr(ew, f).to("meta"))
    p = dsv4hal.select_platform("cpu", checked=checked)
    with pytest.raises(InvalidArgumentError, match="'weights.w13' expected a tensor with data"):
        p.ops.moe_experts.prepare_weights(ew)


# ------------------------------------------------------------------ format helpers

BAD_FORMAT_CALLS = [
    ("V4PagedCache.empty", "num_pages", lambda: V4PagedCache.empty(-1, 256)),
    ("V4PagedCache.empty", "num_pages", lambda: V4PagedCache.empty(True, 256)),
    ("V4PagedCache.empty", "page_size", lambda: V4PagedCache.empty(1, 0)),
    ("V4PagedCache.empty", "page_size", lambda: V4PagedCache.empty(1, 2.0)),
    ("V4PagedCache.empty", "fp8", lambda: V4PagedCache.empty(1, 256, "e5m2")),
    ("V4PagedCache.empty", "device", lambda: V4PagedCache.empty(1, 256, device="gpu0")),
    ("IndexerPagedCache.empty", "device", lambda: IndexerPagedCache.empty(1, device="cuda:0" if not
                                                                         torch.cuda.is_available() else "gpu")),
    ("IndexerPagedCache.empty", "fp8", lambda: IndexerPagedCache.empty(1, "e5m2")),
    ("IndexerPagedCache.empty", "num_pages", lambda: IndexerPagedCache.empty(-2)),
    ("convert_cache", "dst", lambda: convert_cache(V4PagedCache.empty(1, 64), "e5m2")),
    ("convert_cache", "cache", lambda: convert_cache(torch.zeros(1, 4), "e4m3fn")),
    ("quantize_experts", "format", lambda: quantize_experts(torch.zeros(1, 64, 64), torch.zeros(1, 64, 32), "int4")),
    ("quantize_experts", "fp8", lambda: quantize_experts(torch.zeros(1, 64, 64), torch.zeros(1, 64, 32), "fp8_block",
                                                         "e5m2")),
    ("quantize_experts", "w2", lambda: quantize_experts(torch.zeros(1, 64, 64), [0.0], "fp8_block")),
    ("new_state", "ratio", lambda: new_state(2, 5, 512)),
    ("new_state", "width", lambda: new_state(2, 4, 511)),
    ("new_state", "ring", lambda: new_state(2, 4, 512, ring=3)),
]


@pytest.mark.parametrize(("op", "arg", "call"), BAD_FORMAT_CALLS,
                         ids=[f"{o}:{a}:{i}" for i, (o, a, _) in enumerate(BAD_FORMAT_CALLS)])
def test_format_helpers_refuse_bad_arguments_by_name(op: str, arg: str, call) -> None:  # noqa: ANN001
    """Each format helper raises InvalidArgumentError naming itself and the argument, never a torch error."""
    with pytest.raises(InvalidArgumentError) as e:
        call()
    assert (e.value.op, e.value.argument) == (op, arg)


def test_unknown_flavour_message_lists_the_allowed_values() -> None:
    """The message of an unknown FP8 flavour or expert format names every allowed value."""
    with pytest.raises(InvalidArgumentError, match="'e4m3fn', 'e4m3fnuz', got 'e5m2'"):
        IndexerPagedCache.empty(1, "e5m2")
    with pytest.raises(InvalidArgumentError, match="'mxfp4', 'fp8_block', got 'int4'"):
        quantize_experts(torch.zeros(1, 64, 64), torch.zeros(1, 64, 32), "int4")


def test_a_cache_too_large_for_the_device_is_refused_before_allocating(monkeypatch: pytest.MonkeyPatch) -> None:
    """Sizes beyond the device's memory are refused by the size check, before torch.zeros is called."""
    monkeypatch.setattr(checks, "_memory_bytes", lambda *_: 1 << 20)

    def no_alloc(*a, **k):  # noqa: ANN002, ANN003, ANN202
        raise AssertionError("allocated before the size check")

    monkeypatch.setattr(torch, "zeros", no_alloc)
    for call, arg in ((lambda: V4PagedCache.empty(8, 256), "num_pages (cache size)"),
                      (lambda: IndexerPagedCache.empty(200), "num_pages (cache size)"),
                      (lambda: new_state(64, 4, 1024), "num_slots (state size)")):
        with pytest.raises(InvalidArgumentError) as e:
            call()
        assert e.value.argument == arg and e.value.remedy


def test_good_format_calls_still_build_valid_objects() -> None:
    """The checks accept what they should: the objects built validate and have the asked geometry."""
    c = V4PagedCache.empty(2, 64, "e4m3fnuz")
    c.validate("test", "cache")
    assert c.num_slots == 128 and c.fp8 == "e4m3fnuz"
    assert convert_cache(c, "e4m3fn").fp8 == "e4m3fn"
    assert IndexerPagedCache.empty(0).num_pages == 0
    s = new_state(2, 128, 256, ring=256)
    assert s.shape == (2, 256, 256) and bool((s[..., 128:] == float("-inf")).all())


# ------------------------------------------------------------------ expand views

def test_indexer_logits_refuses_an_expanded_block_table_before_allocating(cpu: dsv4hal.Platform,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A block table expanded (stride 0) to many pages is refused by its output size, as the other ops do."""
    monkeypatch.setattr(checks, "_memory_bytes", lambda *_: 1 << 24)
    q = torch.zeros(3, 64, 128).to(torch.float8_e4m3fn)
    bt = torch.zeros(3, 1, dtype=torch.int32).expand(3, 2**16)
    with pytest.raises(InvalidArgumentError, match="block_table \\(output size\\)"):
        cpu.ops.indexer_logits(q, torch.zeros(3, 64), IndexerPagedCache.empty(4),
                               torch.tensor([100, 0, 256], dtype=torch.int32), bt)


# ------------------------------------------------------------------ a bound op's custom op called directly

def test_custom_op_direct_call_refuses_bool_scalars(cpu: dsv4hal.Platform, cpu_checked: dsv4hal.Platform) -> None:
    """Bools passed for the ops' int or float scalars reach the eager body as bools, which refuses them."""
    s, lengths = torch.randn(2, 700), torch.tensor([700, 300], dtype=torch.int32)
    pt = torch.arange(22, dtype=torch.int32).reshape(2, 11)
    with pytest.raises(InvalidArgumentError, match="'page_size'.*got True"):
        custom_op(cpu.ops.indexer_topk)(s, lengths, 512, pt, True)
    x, fn, base, scale = torch.randn(3, 4, 16).bfloat16(), torch.randn(24, 64) * 0.1, torch.zeros(24), torch.ones(3)
    with pytest.raises(InvalidArgumentError, match="'sinkhorn_iters'.*got True"):
        custom_op(cpu_checked.ops.mhc_pre)(x, fn, base, scale, 1e-6, 1e-6, True)
    with pytest.raises(InvalidArgumentError, match="'rms_eps'.*got True"):
        custom_op(cpu_checked.ops.mhc_pre)(x, fn, base, scale, True, 1e-6, 20)
    y = custom_op(cpu_checked.ops.mhc_pre)(x, fn, base, scale, 1e-6, 1e-6, 20)
    ref = cpu_checked.ops.mhc_pre(x, fn, base, scale, 1e-6, 1e-6, 20)
    assert all(torch.equal(a, b) for a, b in zip(y, ref))


def test_custom_op_refuses_real_meta_tensors_outside_tracing(cpu: dsv4hal.Platform) -> None:
    """A meta tensor passed to an op's custom op outside fake-tensor tracing is refused, cache untouched."""
    c = V4PagedCache.empty(2, 64)
    cpu.ops.pack_store(torch.randn(128, 512).bfloat16(), torch.arange(128), c)
    before = c.data.clone()
    with pytest.raises(InvalidArgumentError, match="'loc' expected a tensor with data"):
        custom_op(cpu.ops.dequant_gather)(c.data, 64, "e4m3fn", torch.tensor([3, 5], device="meta"))
    with pytest.raises(InvalidArgumentError, match="'k' expected a tensor with data"):
        custom_op(cpu.ops.pack_store)(torch.randn(2, 512, device="meta").bfloat16(), torch.tensor([0, 1]), c.data, 64,
                                      "e4m3fn")
    assert torch.equal(c.data, before)


def test_custom_op_fake_still_runs_under_fake_tensor_mode(cpu: dsv4hal.Platform) -> None:
    """Under FakeTensorMode (tracing) the fake gives the output shape as before."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        cache = mode.from_tensor(V4PagedCache.empty(1, 64).data)
        out = custom_op(cpu.ops.dequant_gather)(cache, 64, "e4m3fn", torch.zeros(5, dtype=torch.int64))
    assert out.shape == (5, 512) and out.dtype == torch.bfloat16


def test_custom_op_moe_experts_refuses_other_weights_tensors(cpu: dsv4hal.Platform) -> None:
    """The tensors passed with a weights handle must be that handle's (copies compute the same); others raise."""
    a = cpu.ops.moe_experts.prepare_weights(_experts("mxfp4", 1))
    b = cpu.ops.moe_experts.prepare_weights(_experts("fp8_block", 7))
    x, ids, tw = _moe_inputs()
    ref = cpu.ops.moe_experts(x, ids, tw, a)
    experts = custom_op(cpu.ops.moe_experts)
    assert torch.equal(experts(x, ids, tw, list(a._tensors), a._handle, 10.0), ref)
    copies = [t.clone() for t in a._tensors]
    assert torch.equal(experts(x, ids, tw, copies, a._handle, 10.0), ref)
    for other in (list(b._tensors), [], list(a._tensors)[:2]):
        with pytest.raises(InvalidArgumentError, match="'weight_tensors' expected the 4 tensors"):
            experts(x, ids, tw, other, a._handle, 10.0)


def test_format_errors_keep_their_fields_and_base_class(cpu: dsv4hal.Platform) -> None:
    """A format helper's error is a Dsv4HalError keeping op, argument and got as attributes."""
    with pytest.raises(Dsv4HalError) as e:
        V4PagedCache.empty(1, 256, "e5m2")
    err = e.value
    assert isinstance(err, InvalidArgumentError) and err.op == "V4PagedCache.empty" and err.got == "'e5m2'"
