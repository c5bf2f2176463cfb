"""Every op is a torch custom op (dsv4hal::<op>) with an exact fake and declared mutations, checked with
torch.library.opcheck; torch.compile(fullgraph=True) of engine-shaped code calling platform.ops matches eager."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from conftest import fake, first_conformance_case

import dsv4hal
from dsv4hal import custom_ops
from dsv4hal.conformance.runner import load_catalog
from dsv4hal.ops.attention_metadata import AttentionMetadata
from dsv4hal.ops.catalog import OP_NAMES

# torch's SchemaCheckMode compares inputs with allclose, which has no CPU kernel for float8 tensors: indexer_logits'
# q and fp8_linear's and fp8_grouped_linear's weights are. Their inputs are checked unchanged below instead.
NO_SCHEMA_CHECK = {"indexer_logits", "fp8_linear", "fp8_grouped_linear"}


@pytest.fixture(scope="module")
def platform() -> dsv4hal.Platform:
    return dsv4hal.select_platform(info=fake("cpu"))


@pytest.mark.parametrize("op", OP_NAMES)
def test_opcheck(platform: dsv4hal.Platform, op: str) -> None:
    """Every op's torch.library custom op passes opcheck on its first conformance case."""
    args = first_conformance_case(platform, op)
    if op == "build_attention_metadata":
        args["out"] = None  # the functional form here; the in-place one below
    overload, flat = custom_ops.flatten(platform.ops[op], **args)
    assert overload is custom_ops.custom_op(platform.ops[op])
    utils = ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
    if op not in NO_SCHEMA_CHECK:
        utils = ("test_schema", *utils)
    before = [t.clone() for t in flat if isinstance(t, torch.Tensor)]
    torch.library.opcheck(overload, flat, test_utils=utils)
    if op in NO_SCHEMA_CHECK:
        after = [t for t in flat if isinstance(t, torch.Tensor)]
        assert all(torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in zip(before, after))


def test_opcheck_build_attention_metadata_into_out(platform: dsv4hal.Platform) -> None:
    """The out= form of build_attention_metadata is its own overload declaring out as written."""
    args = first_conformance_case(platform, "build_attention_metadata")
    args["out"] = AttentionMetadata.empty(args["positions"].shape[0], args["page_table"].shape[1])
    overload, flat = custom_ops.flatten(platform.ops.build_attention_metadata, **args)
    assert overload is custom_ops.custom_op(platform.ops.build_attention_metadata, "_out")
    schema = str(overload.default._schema)
    assert "Tensor(a4!)[] out" in schema  # the metadata's tensors, one list, written in place
    torch.library.opcheck(overload, flat)


def test_in_place_ops_declare_what_they_write(platform: dsv4hal.Platform) -> None:
    """The custom ops of the ops that write in place declare those arguments (and only those) as written."""
    def written(name: str) -> list[str]:
        schema = custom_ops.custom_op(platform.ops[name]).default._schema
        return [a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]

    mutated = {name: written(name)
               for name in ("pack_store", "indexer_store", "compress_decode", "sparse_attention_decode")}
    assert mutated == {"pack_store": ["cache"], "indexer_store": ["cache"], "compress_decode": ["state"],
                       "sparse_attention_decode": []}


def _decode_inputs(platform: dsv4hal.Platform) -> dict:
    g = torch.Generator().manual_seed(0)
    b, h, e, hidden, inter = 2, 64, 8, 256, 128
    w = dsv4hal.quantize_experts(torch.randn(e, 2 * inter, hidden, generator=g) * .05,
                                 torch.randn(e, hidden, inter, generator=g) * .05, "mxfp4")
    return dict(
        k=torch.randn(b, 512, generator=g).bfloat16(), loc=torch.tensor([5, 600]),
        swa_idx=(torch.arange(b)[:, None] * 512 + torch.arange(128)[None, :]).int(),
        swa_len=torch.full((b,), 100, dtype=torch.int32), c4_len=torch.full((b,), 40, dtype=torch.int32),
        q=torch.randn(b, h, 512, generator=g).bfloat16(), sink=torch.randn(h, generator=g),
        scores=torch.randn(b, 600, generator=g), lengths=torch.tensor([600, 50], dtype=torch.int32),
        page_table=torch.arange(b * 10, dtype=torch.int32).view(b, 10),
        weights=platform.ops.moe_experts.prepare_weights(w), x=torch.randn(b, hidden, generator=g).bfloat16(),
        logits=torch.randn(b, e, generator=g))


def _caches() -> tuple[dsv4hal.V4PagedCache, dsv4hal.V4PagedCache]:
    swa, c4 = dsv4hal.V4PagedCache.empty(4, 256), dsv4hal.V4PagedCache.empty(4, 64)
    for c in (swa, c4):  # arbitrary but identical bytes for both runs
        c.data.copy_(torch.randint(0, 120, c.data.shape, generator=torch.Generator().manual_seed(1),
                                   dtype=torch.uint8))
    return swa, c4


@pytest.mark.slow
def test_compiled_fullgraph_decode_matches_eager(platform: dsv4hal.Platform) -> None:
    """A fullgraph torch.compile of a decode step matches eager results."""
    inp = _decode_inputs(platform)

    def step(swa: dsv4hal.V4PagedCache, c4: dsv4hal.V4PagedCache, q: torch.Tensor, x: torch.Tensor) -> tuple:
        ops = platform.ops
        with platform.decode_step():  # a no-op while Dynamo traces
            ops.pack_store(inp["k"], inp["loc"], swa)
            raw, pages = ops.indexer_topk(inp["scores"], inp["lengths"], 512, inp["page_table"], 64)
            out, lse = ops.sparse_attention_decode(q, swa, inp["swa_idx"], inp["swa_len"], inp["sink"], 512 ** -0.5,
                                                   extra_cache=c4, extra_indices=raw[:, :64].contiguous(),
                                                   extra_lengths=inp["c4_len"])
            ids, w = ops.moe_route(inp["logits"], top_k=2)
            y = ops.moe_experts(x, ids, w, inp["weights"])
        return out, lse, raw, pages, ids, w, y

    (swa1, c41), (swa2, c42) = _caches(), _caches()
    eager = step(swa1, c41, inp["q"], inp["x"])
    compiled = torch.compile(step, fullgraph=True)(swa2, c42, inp["q"], inp["x"])
    for a, b in zip(eager, compiled, strict=True):
        assert torch.equal(a, b)
    assert torch.equal(swa1.data, swa2.data)  # pack_store wrote the same bytes in place


def test_compiled_in_place_ops_write_their_buffers(platform: dsv4hal.Platform) -> None:
    """Under torch.compile in-place ops still write the caller's buffers."""
    args = first_conformance_case(platform, "build_attention_metadata")
    t, p = args["positions"].shape[0], args["page_table"].shape[1]
    out_e, out_c = AttentionMetadata.empty(t, p), AttentionMetadata.empty(t, p)

    def meta(out: AttentionMetadata) -> AttentionMetadata:
        return platform.ops.build_attention_metadata(args["positions"], args["page_table"], args["full_to_swa"],
                                                     args["index_topk"], out)

    assert meta(out_e) is out_e
    assert torch.compile(meta, fullgraph=True, backend="aot_eager")(out_c) is out_c
    for name in (f.name for f in dataclasses.fields(AttentionMetadata)):
        assert torch.equal(getattr(out_e, name), getattr(out_c, name)), name


def test_a_strided_kernel_output_gets_the_fakes_layout(platform: dsv4hal.Platform,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A kernel may return a view of a padded buffer (DeepGEMM's logits rows are 256-aligned); compiled code reads
    a custom op's output with its fake's strides (Inductor asserts them: the H200 demo with --compile failed so).
    The eager body returns the fake's contiguous layout, with the kernel's values."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    args = first_conformance_case(platform, "indexer_logits")
    rows = 3  # more than one: the row stride is read (a size-1 dimension's stride never is)
    args.update(q=args["q"].view(torch.uint8).repeat(rows, 1, 1).view(args["q"].dtype),
                weights=args["weights"].repeat(rows, 1), context_lens=args["context_lens"].repeat(rows),
                block_table=args["block_table"].repeat(rows, 1))
    bound = platform.ops.indexer_logits
    overload, flat = custom_ops.flatten(bound, **args)
    want = bound(**args)
    call = type(bound).__call__

    def padded(self: object, *a: object, **k: object) -> torch.Tensor:
        out = call(self, *a, **k)
        buf = out.new_full((out.shape[0], out.shape[1] + 64), float("nan"))
        buf[:, : out.shape[1]] = out
        return buf[:, : out.shape[1]]

    assert not padded(bound, **args).is_contiguous()
    monkeypatch.setattr(type(bound), "__call__", padded)  # the eager body calls the bound op
    got = overload(*flat)
    assert got.shape == (rows, want.shape[1]) and got.is_contiguous() and torch.equal(got, want)
    with FakeTensorMode() as mode:
        fake_out = overload(*[mode.from_tensor(t) if isinstance(t, torch.Tensor) else t for t in flat])
    assert fake_out.shape == got.shape and fake_out.stride() == got.stride()


def test_compress_with_num_groups_is_static(platform: dsv4hal.Platform) -> None:
    """compress given num_groups: the fake's row count is that int (no data-dependent size), opcheck passes, and a
    fullgraph compile of a call matches eager."""
    spec, build = next((s, b) for s, b in load_catalog(["compress"]) if s.params.get("num_groups") and not s.gpu_only)
    args = build(spec, torch.device("cpu"), torch.Generator().manual_seed(0)).args
    overload, flat = custom_ops.flatten(platform.ops.compress, **args)
    torch.library.opcheck(overload, flat, test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"))
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fake = [mode.from_tensor(t) if isinstance(t, torch.Tensor) else t for t in flat]
        assert overload(*fake).shape == (args["num_groups"], args["norm_weight"].shape[0])
    eager = platform.ops.compress(**args)
    compiled = torch.compile(lambda a: platform.ops.compress(**a), fullgraph=True, backend="aot_eager")(args)
    assert torch.equal(compiled, eager)


def test_a_custom_op_is_derived_only_from_what_the_definition_declares() -> None:
    """An op that returns tensors without a declared fake, or takes a type that cannot cross a custom op, is refused
    when its custom op is derived, naming the op (and the argument)."""
    from dsv4hal.ops.signatures import define

    def validate(x, n=1, *, checked=False):  # noqa: ANN001, ANN202
        pass

    @define(validate=validate, case=lambda x, n=1: {})
    def no_fake(x: torch.Tensor, n: int = 1) -> torch.Tensor:
        """doc"""

    with pytest.raises(TypeError, match="op no_fake returns .* fake="):
        custom_ops.plan_of(no_fake)

    @define(validate=validate, case=lambda x, n=1: {}, fake=lambda x, n=1: x)
    def odd_type(x: torch.Tensor, n: dict = 1) -> torch.Tensor:  # type: ignore[assignment]
        """doc"""

    with pytest.raises(TypeError, match="op odd_type, argument n: type"):
        custom_ops.plan_of(odd_type)
    with pytest.raises(TypeError, match="fake function"):
        define(validate=validate, case=lambda x, n=1: {}, fake=lambda x: x)(no_fake.signature_fn)
