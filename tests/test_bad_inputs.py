"""Bad inputs every op must survive with a typed error or a defined result: strided views refused, non-finite
floats refused by checked mode, metadata kept inside its tables, references correct on empty inputs, expand views
refused before the allocator, plugin faults contained, typed errors instead of KeyError/ValueError, no unchecked
write outside the cache, and the one meaning of negative indices (-1 unused, any other negative refused in
checked mode). The conformance runner has no notion of an expected error (a typed
error there is a "blocked" cell), so the -2 / INT32_MIN cells live here."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import sys

import pytest
import torch
from conftest import plugin_module, registry_with

import dsv4hal
from dsv4hal import override as ov
from dsv4hal.errors import (
    Dsv4HalError,
    InvalidArgumentError,
    PluginFaultError,
    PluginLoadError,
    PreparedWeightsMismatchError,
    RegistryError,
    UnknownArchError,
    UnknownNameError,
)
from dsv4hal.formats.v4_cache import V4PagedCache, page_bytes
from dsv4hal.kernels.triton import attention_metadata as tri_meta
from dsv4hal.kernels.triton import sparse_attention as tri_attn
from dsv4hal.kernels.triton import v4_cache_kernels as tri_cache
from dsv4hal.plugins import PluginWarning
from dsv4hal.reference import attention_metadata as ref_meta
from dsv4hal.reference import indexer_topk as ref_topk
from dsv4hal.reference import pack_store as ref_cache
from dsv4hal.reference import sparse_attention as ref_attn
from dsv4hal.registry import KernelImpl

pytest.importorskip("triton")

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")
I32_MIN = -(2**31)
TRITON = {"pack_store": "triton_pack_store", "dequant_gather": "triton_dequant_gather",
          "indexer_topk": "triton_radix_topk", "sparse_attention_decode": "triton_sparse_decode",
          "sparse_attention_prefill": "triton_sparse_prefill",
          "build_attention_metadata": "triton_attention_metadata"}


# the references, forced, so that a GPU machine runs the same comparisons (reference vs Triton) as the CPU
REFERENCE = {op: "torch_reference" for op in dsv4hal.OP_NAMES}


@pytest.fixture(scope="module")
def checked():  # noqa: ANN201
    with dsv4hal.overrides(kernels=REFERENCE):
        return dsv4hal.select_platform(checked=True)


@pytest.fixture(scope="module")
def unchecked():  # noqa: ANN201
    with dsv4hal.overrides(kernels=REFERENCE):
        return dsv4hal.select_platform()


@pytest.fixture(scope="module")
def triton_checked():  # noqa: ANN201
    with dsv4hal.overrides(kernels=TRITON):
        return dsv4hal.select_platform(checked=True)


def _cache(pages: int, page_size: int = 256, seed: int = 0) -> V4PagedCache:
    cache = V4PagedCache.empty(pages, page_size, device=DEV)
    n = pages * page_size
    if n:
        g = torch.Generator().manual_seed(seed)
        ref_cache.pack_store(torch.randn(n, 512, generator=g).bfloat16().to(DEV), torch.arange(n, device=DEV), cache)
    return cache


def _decode(t: int = 2, w: int = 64, pages: int = 1, extra: bool = False) -> dict:
    g = torch.Generator().manual_seed(1)
    args = dict(q=torch.randn(t, 64, 512, generator=g).bfloat16().to(DEV), swa_cache=_cache(pages),
                swa_indices=torch.randint(0, max(pages * 256, 1), (t, w), generator=g, dtype=torch.int32).to(DEV),
                swa_lengths=torch.full((t,), w, dtype=torch.int32, device=DEV),
                sink=torch.randn(64, generator=g).to(DEV), softmax_scale=512**-0.5)
    if extra:
        args.update(extra_cache=_cache(2, 64, seed=2),
                    extra_indices=torch.randint(0, 128, (t, 64), generator=g, dtype=torch.int32).to(DEV),
                    extra_lengths=torch.full((t,), 64, dtype=torch.int32, device=DEV))
    return args


def _prefill(t: int = 2, w: int = 64, s: int = 100) -> dict:
    g = torch.Generator().manual_seed(3)
    return dict(q=torch.randn(t, 64, 512, generator=g).bfloat16().to(DEV),
                kv=torch.randn(s, 512, generator=g).bfloat16().to(DEV),
                indices=torch.randint(0, max(s, 1), (t, w), generator=g, dtype=torch.int32).to(DEV),
                lengths=torch.full((t,), w, dtype=torch.int32, device=DEV),
                sink=torch.randn(64, generator=g).to(DEV), softmax_scale=512**-0.5)


def _topk(b: int = 2, s: int = 700) -> dict:
    g = torch.Generator().manual_seed(4)
    return dict(scores=torch.randn(b, s, generator=g).to(DEV),
                lengths=torch.full((b,), s, dtype=torch.int32, device=DEV), k=512,
                page_table=torch.randint(0, 64, (b, -(-s // 64)), generator=g, dtype=torch.int32).to(DEV),
                page_size=64)


def _meta(t: int = 3) -> dict:
    return dict(positions=torch.tensor([5, 300, 700][:t], dtype=torch.int32, device=DEV),
                page_table=torch.tensor([[2, 0, 1]] * t, dtype=torch.int32, device=DEV).reshape(t, 3),
                full_to_swa=torch.arange(3 * 256, dtype=torch.int32, device=DEV) % 512)


def _store(n: int = 4, pages: int = 1, page_size: int = 64) -> dict:
    return dict(k=torch.randn(n, 512).bfloat16().to(DEV), loc=torch.arange(n, device=DEV),
                cache=V4PagedCache.empty(pages, page_size, device=DEV))


def _strided(t: torch.Tensor, dim: int = 0) -> torch.Tensor:
    """Same values, every other element of a twice larger tensor along `dim`."""
    shape = list(t.shape)
    shape[dim] *= 2
    big = torch.zeros(shape, dtype=t.dtype, device=t.device)
    view = big.narrow(dim, 0, shape[dim]).unflatten(dim, (t.shape[dim], 2)).select(dim + 1, 0)
    view.copy_(t)
    return view


# ------------------------------------------------------------------ non-contiguous inputs

STRIDED = [
    ("pack_store", _store, "loc", 0), ("dequant_gather", lambda: {"cache": _cache(1, 64), "loc":
                                                                  torch.arange(4, device=DEV)}, "loc", 0),
    ("sparse_attention_decode", _decode, "q", 0), ("sparse_attention_decode", _decode, "swa_indices", 1),
    ("sparse_attention_decode", _decode, "swa_lengths", 0), ("sparse_attention_decode", _decode, "sink", 0),
    ("sparse_attention_decode", lambda: _decode(extra=True), "extra_indices", 1),
    ("sparse_attention_decode", lambda: _decode(extra=True), "extra_lengths", 0),
    ("sparse_attention_prefill", _prefill, "q", 1), ("sparse_attention_prefill", _prefill, "indices", 1),
    ("sparse_attention_prefill", _prefill, "lengths", 0), ("sparse_attention_prefill", _prefill, "sink", 0),
    ("indexer_topk", _topk, "lengths", 0), ("indexer_topk", _topk, "page_table", 1),
    ("indexer_topk", _topk, "scores", 1),
    ("build_attention_metadata", _meta, "positions", 0), ("build_attention_metadata", _meta, "page_table", 1),
    ("build_attention_metadata", _meta, "full_to_swa", 0),
]


@pytest.mark.parametrize(("op", "make", "arg", "dim"), STRIDED, ids=[f"{o}:{a}" for o, _, a, _ in STRIDED])
def test_strided_views_are_refused(unchecked, op, make, arg, dim) -> None:  # noqa: ANN001
    """The kernels index these as dense, so a strided view (loc 0,1,2,3 read as slots 0,1,100,101) is refused."""
    args = make()
    args[arg] = _strided(args[arg], dim)
    with pytest.raises(InvalidArgumentError) as e:
        unchecked.ops[op](**args)
    assert e.value.argument == arg


def test_row_strided_indices_are_taken(unchecked) -> None:  # noqa: ANN001
    """Only the last dimension must be dense: the kernels take the row stride of indices and page tables."""
    args = _decode(extra=True)
    args["swa_indices"] = _strided(args["swa_indices"], 0)
    want = ref_attn.sparse_attention_decode(**{**args, "swa_indices": args["swa_indices"].contiguous()})
    got = tri_attn.sparse_attention_decode(**args)
    assert torch.equal(got[1].isinf(), want[1].isinf())
    torch.testing.assert_close(got[0].float(), want[0].float(), atol=2e-2, rtol=2e-2)
    out = unchecked.ops.build_attention_metadata(**{**_meta(), "page_table": _strided(_meta()["page_table"], 0)})
    assert torch.equal(out.swa_indices, ref_meta.build_attention_metadata(**_meta()).swa_indices)


def test_metadata_out_must_be_contiguous(unchecked) -> None:  # noqa: ANN001
    """A strided out tensor passed to build_attention_metadata is refused by its field name."""
    args = _meta()
    out = ref_meta.build_attention_metadata(**args)
    out.swa_indices = _strided(out.swa_indices, 0)
    with pytest.raises(InvalidArgumentError, match="out.swa_indices"):
        unchecked.ops.build_attention_metadata(**args, out=out)


# ------------------------------------------------------------------ floats and flags

@pytest.mark.parametrize("op", ["sparse_attention_decode", "sparse_attention_prefill"])
def test_nan_sink_refused_in_checked_mode(checked, unchecked, op) -> None:  # noqa: ANN001
    """Checked mode refuses a NaN attention sink; unchecked mode runs without reading values."""
    args = _decode() if op.endswith("decode") else _prefill()
    args["sink"][3] = float("nan")
    with pytest.raises(InvalidArgumentError) as e:
        checked.ops[op](**args)
    assert e.value.argument == "sink"
    unchecked.ops[op](**args)  # unchecked mode reads no values


@pytest.mark.parametrize("scale", [float("inf"), float("nan"), True, 0.0, -0.1, "0.04", None])
@pytest.mark.parametrize("op", ["sparse_attention_decode", "sparse_attention_prefill"])
def test_softmax_scale_must_be_a_positive_finite_number(unchecked, op, scale) -> None:  # noqa: ANN001
    """Attention refuses a softmax_scale that is not a positive finite number, even unchecked."""
    args = _decode() if op.endswith("decode") else _prefill()
    with pytest.raises(InvalidArgumentError) as e:
        unchecked.ops[op](**{**args, "softmax_scale": scale})
    assert e.value.argument == "softmax_scale"


@pytest.mark.parametrize(("arg", "value"), [("k", 512.0), ("k", True), ("page_size", True), ("page_size", 64.0)])
def test_topk_ints_are_ints(unchecked, arg, value) -> None:  # noqa: ANN001
    """indexer_topk refuses a float or bool k or page_size, naming the argument."""
    with pytest.raises(InvalidArgumentError) as e:
        unchecked.ops.indexer_topk(**{**_topk(), arg: value})
    assert e.value.argument == arg


@pytest.mark.parametrize("value", ["no", "yes", 1, 0, None])
def test_select_platform_flags_are_bools(value) -> None:  # noqa: ANN001
    """select_platform refuses checked/validate values that are not bools."""
    for flag in ("checked", "validate"):
        with pytest.raises(InvalidArgumentError, match=flag):
            dsv4hal.select_platform(**{flag: value})


# ------------------------------------------------------------------ attention metadata tables

def test_metadata_empty_full_to_swa(triton_checked, checked) -> None:  # noqa: ANN001
    """An empty full_to_swa table is refused by name before any kernel reads it."""
    args = {**_meta(), "full_to_swa": torch.zeros(0, dtype=torch.int32, device=DEV)}
    for p in (checked, triton_checked):  # refused before the Triton kernel reads the empty table
        with pytest.raises(InvalidArgumentError) as e:
            p.ops.build_attention_metadata(**args)
        assert e.value.argument == "full_to_swa"
    # unchecked: no read outside the (empty) table; the window entries are -1, as the reference says
    got, want = tri_meta.build_attention_metadata(**args), ref_meta.build_attention_metadata(**args)
    for f in dataclasses.fields(want):
        assert torch.equal(getattr(got, f.name), getattr(want, f.name)), f.name
    assert bool((got.swa_indices == -1).all())


@pytest.mark.parametrize(("row", "col", "value"), [(1, 1, -1), (1, 1, -7), (2, 2, I32_MIN), (2, 2, 3)])
def test_metadata_bad_page_ids(checked, triton_checked, row, col, value) -> None:  # noqa: ANN001
    """Bad ids of pages in use (negative, past full_to_swa): a typed error when checked, the reference's rows if not."""
    args = _meta()
    args["page_table"][row, col] = value
    for p in (checked, triton_checked):
        with pytest.raises(InvalidArgumentError) as e:
            p.ops.build_attention_metadata(**args)
        assert e.value.argument in ("page_table", "full_to_swa")
    got, want = tri_meta.build_attention_metadata(**args), ref_meta.build_attention_metadata(**args)
    for f in dataclasses.fields(want):  # unchecked: bounded reads, and both say the same
        assert torch.equal(getattr(got, f.name), getattr(want, f.name)), f.name


def test_metadata_unused_table_entries_may_be_minus_one(checked) -> None:  # noqa: ANN001
    """Checked build_attention_metadata accepts -1 in page-table entries past a row's pages."""
    args = _meta(2)  # positions 5 and 300: pages 0 and 0..1 are used; page 2 is not
    args["page_table"][:, 2] = -1
    checked.ops.build_attention_metadata(**args)


# ------------------------------------------------------------------ MoE devices

def test_moe_experts_weights_on_another_device(unchecked) -> None:  # noqa: ANN001
    """moe_experts refuses prepared weights on another device than the activations."""
    from dsv4hal.reference.moe import quantize_experts

    w = quantize_experts(torch.randn(2, 64, 64) * 0.1, torch.randn(2, 64, 32) * 0.1, "fp8_block")
    prepared = unchecked.ops.moe_experts.prepare_weights(
        dataclasses.replace(w, **{f: getattr(w, f).to(DEV) for f in ("w13", "w13_scale", "w2", "w2_scale")}))
    meta = dataclasses.replace(prepared, payload=dataclasses.replace(
        prepared.payload, **{f: torch.empty_like(getattr(prepared.payload, f), device="meta")
                             for f in ("w13", "w13_scale", "w2", "w2_scale")}))
    x = torch.randn(3, 64, device=DEV).bfloat16()
    ids = torch.zeros(3, 2, dtype=torch.int32, device=DEV)
    tw = torch.ones(3, 2, device=DEV)
    unchecked.ops.moe_experts(x, ids, tw, prepared)
    with pytest.raises(InvalidArgumentError, match="device"):
        unchecked.ops.moe_experts(x, ids, tw, meta)


# ------------------------------------------------------------------ empty inputs in the references

EMPTY = [
    ("sparse_attention_decode", lambda: _decode(t=0)), ("sparse_attention_decode", lambda: _decode(w=0)),
    ("sparse_attention_decode", lambda: _decode(t=0, w=0, extra=True)),
    ("sparse_attention_decode", lambda: {**_decode(pages=0), "swa_indices":
                                         torch.full((2, 64), -1, dtype=torch.int32, device=DEV)}),
    ("sparse_attention_prefill", lambda: _prefill(t=0)), ("sparse_attention_prefill", lambda: _prefill(w=0)),
    ("sparse_attention_prefill", lambda: {**_prefill(s=0), "indices":
                                          torch.full((2, 64), -1, dtype=torch.int32, device=DEV)}),
    ("indexer_topk", lambda: _topk(b=0)), ("indexer_topk", lambda: _topk(s=0)),
    ("build_attention_metadata", lambda: _meta(0)),
    ("pack_store", lambda: _store(n=0)), ("pack_store", lambda: {**_store(pages=0), "loc":
                                                                 torch.full((4,), -1, device=DEV)}),
    ("dequant_gather", lambda: {"cache": _cache(0, 64), "loc": torch.full((3,), -1, device=DEV)}),
]


@pytest.mark.parametrize(("op", "make"), EMPTY, ids=[f"{o}:{i}" for i, (o, _) in enumerate(EMPTY)])
def test_empty_inputs_run_on_the_reference_and_triton(checked, triton_checked, op, make) -> None:  # noqa: ANN001
    """The references crashed (reshape of 0 elements, index into an empty cache) where Triton ran."""
    results = []
    for p in (checked, triton_checked):
        args = make()
        out = p.ops[op](**args)
        results.append((out, args))
    (a, a_args), (b, b_args) = results
    if op == "pack_store":
        assert torch.equal(a_args["cache"].data, b_args["cache"].data)
        return
    flat_a = [getattr(a, f.name) for f in dataclasses.fields(a)] if dataclasses.is_dataclass(a) else list(
        a if isinstance(a, tuple) else (a,))
    flat_b = [getattr(b, f.name) for f in dataclasses.fields(b)] if dataclasses.is_dataclass(b) else list(
        b if isinstance(b, tuple) else (b,))
    for x, y in zip(flat_a, flat_b, strict=True):
        if x is None:
            assert y is None
            continue
        assert x.shape == y.shape and x.dtype == y.dtype
        assert torch.equal(x.float().nan_to_num(posinf=1e30), y.float().nan_to_num(posinf=1e30))


# ------------------------------------------------------------------ sizes that cannot be allocated

def test_expand_views_never_reach_the_allocator(unchecked, monkeypatch: pytest.MonkeyPatch) -> None:
    """Huge expanded (stride-0) views are refused by name before any allocation sized from them."""
    huge = 2**40
    q = torch.zeros(1, 64, 512, dtype=torch.bfloat16, device=DEV).expand(huge, 64, 512)
    args = _decode()
    with pytest.raises(InvalidArgumentError, match="q"):
        unchecked.ops.sparse_attention_decode(**{**args, "q": q})
    with pytest.raises(InvalidArgumentError, match="loc"):
        unchecked.ops.dequant_gather(_cache(1, 64), torch.zeros(1, dtype=torch.int64, device=DEV).expand(huge))
    with pytest.raises(InvalidArgumentError, match="router_logits"):  # strided logits are copied dense
        unchecked.ops.moe_route(torch.zeros(1, 16, device=DEV).expand(huge, 16), top_k=2)
    # the same bound guards every op at dispatch, before its own validation (which may copy): mhc_pre here
    x = torch.zeros(1, 4, 64, dtype=torch.bfloat16, device=DEV).expand(huge, 4, 64)
    with pytest.raises(InvalidArgumentError, match="expand view"):
        unchecked.ops.mhc_pre(x, None, None, None)
    from dsv4hal.ops.moe import validate_moe_route

    with pytest.raises(InvalidArgumentError, match="output size"):  # the op's own bound, without dispatch
        validate_moe_route(torch.zeros(1, 16, device=DEV).expand(2**36, 16), top_k=2)
    # row stride 0 is legal for scores; the outputs are what cannot be allocated (bound lowered here)
    import dsv4hal.checks as checks

    monkeypatch.setattr(checks, "_memory_bytes", lambda *_: 1 << 20)
    b = 1024
    scores = torch.zeros(1, 4, device=DEV).expand(b, 4)
    with pytest.raises(InvalidArgumentError, match="output size"):
        unchecked.ops.indexer_topk(scores, torch.zeros(b, dtype=torch.int32, device=DEV), 512)


# ------------------------------------------------------------------ plugin faults

MHC = "mhc_post"


def _ref_priority() -> int:
    reg = registry_with()
    return reg.kernels[MHC]["torch_reference"].priority_on("cpu")


def _cpu(reg, **kw):  # noqa: ANN001, ANN003, ANN202
    return dsv4hal.select_platform("cpu", info=dsv4hal.simulated("cpu", libraries={"torch": "2"}), registry=reg,
                                   **kw)


def test_priority_tie_with_a_builtin_is_contained() -> None:
    """A plugin kernel tying a built-in's priority warns and selection stays deterministic."""
    prio = _ref_priority()

    def tie(registry):  # noqa: ANN001, ANN202
        registry.add_kernel(KernelImpl(op=MHC, name="tied", target="m:f", platforms=("cpu",), priority=prio))

    with pytest.warns(PluginWarning, match="priority"):
        reg = registry_with(("tie", plugin_module("tie", tie)))
    assert "tied" not in reg.kernels[MHC] and "priority" in reg.plugin_errors["tie"]
    assert _cpu(reg).explain(MHC).chosen.name == "torch_reference"  # select_platform() still works
    with pytest.raises(RegistryError, match="priority"):
        registry_with(("tie", plugin_module("tie", tie)), strict=True)


def _bad_kernel(**kw):  # noqa: ANN003, ANN202
    def register(registry):  # noqa: ANN001, ANN202
        registry.add_kernel(KernelImpl(op=MHC, name="bad", platforms=("cpu",), priority=10**6, **kw))
    return plugin_module("bad", register)


def _raise(case, info):  # noqa: ANN001, ANN202
    raise RuntimeError("supports exploded")


@pytest.mark.parametrize(("kw", "needle"), [
    ({"target": "dsv4hal_no_such_module:f"}, "did not import"),
    ({"target": "dsv4hal.errors:no_such_function"}, "did not import"),
    ({"target": "builtins:len", "supports": _raise}, "supports exploded"),
    ({"target": "builtins:len", "supports": lambda case, info: None}, "not a list"),
])
def test_kernel_faults_are_contained_and_shown(kw, needle, monkeypatch, capsys) -> None:  # noqa: ANN001
    """A plugin kernel that fails to import or whose supports() misbehaves is rejected with the reason shown."""
    reg = registry_with(("bad", _bad_kernel(**kw)))
    with pytest.warns(PluginWarning, match=needle):
        p = _cpu(reg)
    d = p.explain(MHC)
    assert d.chosen.name == "torch_reference"
    assert any(c.name == "bad" and needle in "; ".join(c.reasons) for c in d.candidates)
    assert needle in reg.plugin_errors["bad"]
    # dsv4hal info shows it instead of a traceback
    import dsv4hal.platform as platform_mod
    from dsv4hal.cli import main

    monkeypatch.setattr(platform_mod, "load_registry", lambda *a, **k: reg)
    assert main(["info"]) == 0
    assert needle in capsys.readouterr().out
    strict = registry_with(("bad", _bad_kernel(**kw)), strict=True)
    with pytest.raises(PluginFaultError, match=needle):
        _cpu(strict)


def test_sys_exit_in_a_plugin_is_contained(tmp_path, monkeypatch) -> None:  # noqa: ANN001
    """A plugin calling sys.exit at import is contained as a warning, not a process exit."""
    (tmp_path / "dsv4hal_exiting_plugin.py").write_text("import sys\nsys.exit(3)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    ep = importlib.metadata.EntryPoint("exiting", "dsv4hal_exiting_plugin", "dsv4hal.platforms")
    import dsv4hal.plugins as plugins

    real = plugins._entry_points
    monkeypatch.setattr(plugins, "_entry_points", lambda: [*real(), ep])
    with pytest.warns(PluginWarning, match="SystemExit"):
        reg = plugins.build_registry()
    assert "exiting" in reg.plugin_errors and "cpu" in reg.platforms
    with pytest.raises(PluginLoadError, match="SystemExit"):
        plugins.build_registry(strict=True)

    def exits(registry):  # noqa: ANN001, ANN202
        sys.exit(1)

    with pytest.warns(PluginWarning, match="SystemExit"):
        reg = registry_with(("exits", plugin_module("exits", exits)))
    assert "exits" in reg.plugin_errors


# ------------------------------------------------------------------ typed errors instead of KeyError/ValueError

def test_lookups_raise_typed_errors(unchecked) -> None:  # noqa: ANN001
    """Unknown op and arch lookups raise typed errors that are still KeyErrors."""
    with pytest.raises(UnknownNameError, match="valid ops"):
        unchecked.explain("nope")
    with pytest.raises(KeyError):  # still a KeyError for callers that catch lookups
        unchecked.ops["nope"]
    with pytest.raises(UnknownArchError, match="sm90"):
        dsv4hal.simulated("sm75")
    with pytest.raises(ValueError):
        dsv4hal.PlatformInfo(vendor=dsv4hal.Vendor.CPU, arch="sm75")
    from dsv4hal.reference.moe import quantize_experts

    w = quantize_experts(torch.randn(2, 64, 64) * 0.1, torch.randn(2, 64, 32) * 0.1, "fp8_block")
    prepared = unchecked.ops.moe_experts.prepare_weights(
        dataclasses.replace(w, **{f: getattr(w, f).to(DEV) for f in ("w13", "w13_scale", "w2", "w2_scale")}))
    renamed = dataclasses.replace(prepared, implementation="no_such_kernel")
    x = torch.randn(3, 64, device=DEV).bfloat16()
    with pytest.raises(PreparedWeightsMismatchError, match="no_such_kernel"):
        unchecked.ops.moe_experts(x, torch.zeros(3, 2, dtype=torch.int32, device=DEV), torch.ones(3, 2, device=DEV),
                                  renamed)


# ------------------------------------------------------------------ unchecked stores stay inside the cache

@pytest.mark.parametrize("impl", ["reference", "triton"])
def test_unchecked_pack_store_never_writes_outside(impl) -> None:  # noqa: ANN001
    """The reference raised after writing part of the cache; the Triton kernel wrote past the buffer."""
    p = 64
    big = torch.zeros(3, page_bytes(p), dtype=torch.uint8, device=DEV)
    cache = V4PagedCache(big[:2], p)
    k = torch.randn(6, 512).bfloat16().to(DEV)
    loc = torch.tensor([0, 2 * p + 5, 1, -2, I32_MIN, 3 * p], device=DEV)
    store = ref_cache.pack_store if impl == "reference" else tri_cache.pack_store
    store(k, loc, cache)
    assert bool((big[2] == 0).all())  # the page past the cache is untouched
    want = V4PagedCache.empty(2, p, device=DEV)
    ref_cache.pack_store(k, torch.tensor([0, -1, 1, -1, -1, -1], device=DEV), want)
    assert torch.equal(cache.data, want.data)
    gather = ref_cache.dequant_gather if impl == "reference" else tri_cache.dequant_gather
    rows = gather(cache, loc)
    assert bool((rows[[1, 3, 4, 5]] == 0).all())
    assert torch.equal(rows[[0, 2]], ref_cache.dequant_gather(want, torch.tensor([0, 1], device=DEV)))


# ------------------------------------------------------------------ negative indices: -1 unused, others invalid

def _set(args: dict, name: str, value: int) -> dict:
    t = args[name].clone()
    t.view(-1)[1] = value
    return {**args, name: t}


NEGATIVE = [
    ("sparse_attention_decode", lambda: _decode(extra=True), "swa_indices"),
    ("sparse_attention_decode", lambda: _decode(extra=True), "extra_indices"),
    ("sparse_attention_prefill", _prefill, "indices"),
    ("pack_store", _store, "loc"),
    ("pack_store", lambda: {**_store(), "loc": torch.arange(4, dtype=torch.int32, device=DEV)}, "loc"),
    ("dequant_gather", lambda: {"cache": _cache(1, 64), "loc": torch.arange(4, device=DEV)}, "loc"),
    ("build_attention_metadata", _meta, "full_to_swa"),
    ("indexer_topk", lambda: {**_topk(), "lengths": torch.tensor([64, 700], dtype=torch.int32, device=DEV)},
     "page_table"),  # row 0 uses page 0 only: entry 1 is unused, so -1 is fine there and -2 is not
]


@pytest.mark.parametrize("value", [-2, I32_MIN])
@pytest.mark.parametrize(("op", "make", "arg"), NEGATIVE, ids=[f"{o}:{a}:{i}" for i, (o, _, a) in enumerate(NEGATIVE)])
def test_negative_indices_other_than_minus_one_are_refused(checked, triton_checked, op, make, arg, value) -> None:  # noqa: ANN001
    """Checked mode accepts -1 index entries and refuses any other negative, naming the argument."""
    for p in (checked, triton_checked):
        p.ops[op](**_set(make(), arg, -1))  # -1 is an unused entry (a -1 page past the row's pages: unused)
        with pytest.raises(InvalidArgumentError) as e:
            p.ops[op](**_set(make(), arg, value))
        assert e.value.argument == arg and isinstance(e.value, Dsv4HalError)


@pytest.mark.parametrize("value", [-2, I32_MIN])
def test_unchecked_invalid_negatives_stay_inside(value) -> None:  # noqa: ANN001
    """Unchecked, an invalid negative's contribution is unspecified; the reference and Triton both skip it."""
    args = _set(_decode(extra=True), "swa_indices", value)
    args = _set(args, "extra_indices", value)
    want, got = ref_attn.sparse_attention_decode(**args), tri_attn.sparse_attention_decode(**args)
    torch.testing.assert_close(got[0].float(), want[0].float(), atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(got[1], want[1], atol=1e-3, rtol=1e-3)
    skip = _set(_set(_decode(extra=True), "swa_indices", -1), "extra_indices", -1)
    torch.testing.assert_close(want[1], ref_attn.sparse_attention_decode(**skip)[1])


def test_overrides_keep_working_with_fault_free_registry() -> None:
    """Sanity: containment does not hide ordinary override errors."""
    from dsv4hal.errors import BadOverrideError

    with pytest.raises(BadOverrideError):
        with ov.overrides(kernels={"pack_store": "nope"}):
            dsv4hal.select_platform()


def test_reference_page_transform_with_an_empty_table() -> None:
    """The reference page_transform maps every index to -1 against an empty page table."""
    raw = torch.tensor([[0, 5, -1]], dtype=torch.int32)
    assert ref_topk.page_transform(raw, torch.zeros(1, 0, dtype=torch.int32)).tolist() == [[-1, -1, -1]]


def test_checked_topk_ignores_scores_past_each_length_and_refuses_them_within(checked, triton_checked) -> None:  # noqa: ANN001
    """indexer_logits leaves -inf past a row's length, and top-k ignores whatever lies there (spec 4.3): checked
    mode accepts -inf and NaN past the length, and refuses either within it."""
    args = {**_topk(), "lengths": torch.tensor([600, 650], dtype=torch.int32, device=DEV)}
    scores = args["scores"].clone()
    scores[0, 600:] = float("-inf")
    scores[1, 650:] = float("nan")
    want = ref_topk.indexer_topk(**{**args, "scores": scores})
    for p in (checked, triton_checked):
        raw, pages = p.ops.indexer_topk(**{**args, "scores": scores})
        assert torch.equal(raw.sort(1).values.cpu(), want[0].sort(1).values.cpu())
        for bad in (float("-inf"), float("nan")):
            inside = scores.clone()
            inside[1, 10] = bad
            with pytest.raises(InvalidArgumentError, match="within each row's length") as e:
                p.ops.indexer_topk(**{**args, "scores": inside})
            assert e.value.argument.startswith("scores")
