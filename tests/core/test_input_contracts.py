"""The argument rules every op shares, checked at dispatch whatever the kernel: the last dimension of each tensor
dense (a strided view refused by name), empty inputs giving the same result on the reference and Triton, the one
meaning of a negative index (-1 an unused entry; any other negative refused in checked mode), expand views refused
before an allocation sized from them, and typed errors for bad flags and unknown names. The conformance runner has
no notion of an expected error (a typed error there is a "blocked" cell), so these cells live here."""

from __future__ import annotations

import dataclasses

import op_args
import pytest
import torch
from op_args import DEV, I32_MIN

import dsv4hal
from dsv4hal.errors import (
    Dsv4HalError,
    InvalidArgumentError,
    PreparedWeightsMismatchError,
    UnknownArchError,
    UnknownNameError,
)

pytest.importorskip("triton")


STRIDED = [
    ("pack_store", op_args.store, "loc", 0), ("dequant_gather", op_args.gather, "loc", 0),
    ("sparse_attention_decode", op_args.decode, "q", 0),
    ("sparse_attention_decode", op_args.decode, "swa_indices", 1),
    ("sparse_attention_decode", op_args.decode, "swa_lengths", 0),
    ("sparse_attention_decode", op_args.decode, "sink", 0),
    ("sparse_attention_decode", lambda: op_args.decode(extra=True), "extra_indices", 1),
    ("sparse_attention_decode", lambda: op_args.decode(extra=True), "extra_lengths", 0),
    ("sparse_attention_prefill", op_args.prefill, "q", 1),
    ("sparse_attention_prefill", op_args.prefill, "indices", 1),
    ("sparse_attention_prefill", op_args.prefill, "lengths", 0),
    ("sparse_attention_prefill", op_args.prefill, "sink", 0),
    ("indexer_topk", op_args.topk, "lengths", 0), ("indexer_topk", op_args.topk, "page_table", 1),
    ("indexer_topk", op_args.topk, "scores", 1),
    ("build_attention_metadata", op_args.meta, "positions", 0),
    ("build_attention_metadata", op_args.meta, "page_table", 1),
    ("build_attention_metadata", op_args.meta, "full_to_swa", 0),
]


@pytest.mark.parametrize(("op", "make", "arg", "dim"), STRIDED, ids=[f"{o}:{a}" for o, _, a, _ in STRIDED])
def test_strided_views_are_refused(reference_unchecked, op, make, arg, dim) -> None:  # noqa: ANN001
    """The kernels index these as dense, so a strided view (loc 0,1,2,3 read as slots 0,1,100,101) is refused."""
    args = make()
    args[arg] = op_args.strided(args[arg], dim)
    with pytest.raises(InvalidArgumentError) as e:
        reference_unchecked.ops[op](**args)
    assert e.value.argument == arg


EMPTY = [
    ("sparse_attention_decode", lambda: op_args.decode(t=0)), ("sparse_attention_decode", lambda: op_args.decode(w=0)),
    ("sparse_attention_decode", lambda: op_args.decode(t=0, w=0, extra=True)),
    ("sparse_attention_decode", lambda: {**op_args.decode(pages=0), "swa_indices":
                                         torch.full((2, 64), -1, dtype=torch.int32, device=DEV)}),
    ("sparse_attention_prefill", lambda: op_args.prefill(t=0)),
    ("sparse_attention_prefill", lambda: op_args.prefill(w=0)),
    ("sparse_attention_prefill", lambda: {**op_args.prefill(s=0), "indices":
                                          torch.full((2, 64), -1, dtype=torch.int32, device=DEV)}),
    ("indexer_topk", lambda: op_args.topk(b=0)), ("indexer_topk", lambda: op_args.topk(s=0)),
    ("build_attention_metadata", lambda: op_args.meta(0)),
    ("pack_store", lambda: op_args.store(n=0)), ("pack_store", lambda: {**op_args.store(pages=0), "loc":
                                                                 torch.full((4,), -1, device=DEV)}),
    ("dequant_gather", lambda: {"cache": op_args.cache(0, 64), "loc": torch.full((3,), -1, device=DEV)}),
]


@pytest.mark.parametrize(("op", "make"), EMPTY, ids=[f"{o}:{i}" for i, (o, _) in enumerate(EMPTY)])
def test_empty_inputs_run_on_the_reference_and_triton(reference_checked, triton_checked, op, make) -> None:  # noqa: ANN001
    """Empty inputs (no tokens, no width, an empty cache or table) run on the reference and Triton alike."""
    results = []
    for p in (reference_checked, triton_checked):
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


NEGATIVE = [
    ("sparse_attention_decode", lambda: op_args.decode(extra=True), "swa_indices"),
    ("sparse_attention_decode", lambda: op_args.decode(extra=True), "extra_indices"),
    ("sparse_attention_prefill", op_args.prefill, "indices"),
    ("pack_store", op_args.store, "loc"),
    ("pack_store", lambda: {**op_args.store(), "loc": torch.arange(4, dtype=torch.int32, device=DEV)}, "loc"),
    ("dequant_gather", op_args.gather, "loc"),
    ("build_attention_metadata", op_args.meta, "full_to_swa"),
    ("indexer_topk", lambda: {**op_args.topk(), "lengths": torch.tensor([64, 700], dtype=torch.int32, device=DEV)},
     "page_table"),  # row 0 uses page 0 only: entry 1 is unused, so -1 is fine there and -2 is not
]


@pytest.mark.parametrize("value", [-2, I32_MIN])
@pytest.mark.parametrize(("op", "make", "arg"), NEGATIVE, ids=[f"{o}:{a}:{i}" for i, (o, _, a) in enumerate(NEGATIVE)])
def test_negative_indices_other_than_minus_one_are_refused(reference_checked, triton_checked, op, make, arg,
                                                           value) -> None:  # noqa: ANN001
    """Checked mode accepts -1 index entries and refuses any other negative, naming the argument."""
    for p in (reference_checked, triton_checked):
        # -1 is an unused entry (a -1 page past the row's pages: unused)
        p.ops[op](**op_args.with_entry(make(), arg, -1))
        with pytest.raises(InvalidArgumentError) as e:
            p.ops[op](**op_args.with_entry(make(), arg, value))
        assert e.value.argument == arg and isinstance(e.value, Dsv4HalError)


def test_expand_views_never_reach_the_allocator(reference_unchecked, monkeypatch: pytest.MonkeyPatch) -> None:
    """Huge expanded (stride-0) views are refused by name before any allocation sized from them."""
    huge = 2**40
    q = torch.zeros(1, 64, 512, dtype=torch.bfloat16, device=DEV).expand(huge, 64, 512)
    args = op_args.decode()
    with pytest.raises(InvalidArgumentError, match="q"):
        reference_unchecked.ops.sparse_attention_decode(**{**args, "q": q})
    with pytest.raises(InvalidArgumentError, match="loc"):
        reference_unchecked.ops.dequant_gather(op_args.cache(1, 64),
                                               torch.zeros(1, dtype=torch.int64, device=DEV).expand(huge))
    with pytest.raises(InvalidArgumentError, match="router_logits"):  # strided logits are copied dense
        reference_unchecked.ops.moe_route(torch.zeros(1, 16, device=DEV).expand(huge, 16), top_k=2)
    # the same bound guards every op at dispatch, before its own validation (which may copy): mhc_pre here
    x = torch.zeros(1, 4, 64, dtype=torch.bfloat16, device=DEV).expand(huge, 4, 64)
    with pytest.raises(InvalidArgumentError, match="expand view"):
        reference_unchecked.ops.mhc_pre(x, None, None, None)
    from dsv4hal.ops.moe import validate_moe_route

    with pytest.raises(InvalidArgumentError, match="output size"):  # the op's own bound, without dispatch
        validate_moe_route(torch.zeros(1, 16, device=DEV).expand(2**36, 16), top_k=2)
    # row stride 0 is legal for scores; the outputs are what cannot be allocated (bound lowered here)
    import dsv4hal.checks as checks

    monkeypatch.setattr(checks, "_memory_bytes", lambda *_: 1 << 20)
    b = 1024
    scores = torch.zeros(1, 4, device=DEV).expand(b, 4)
    with pytest.raises(InvalidArgumentError, match="output size"):
        reference_unchecked.ops.indexer_topk(scores, torch.zeros(b, dtype=torch.int32, device=DEV), 512)


@pytest.mark.parametrize("value", ["no", "yes", 1, 0, None])
def test_select_platform_flags_are_bools(value) -> None:  # noqa: ANN001
    """select_platform refuses checked/validate values that are not bools."""
    for flag in ("checked", "validate"):
        with pytest.raises(InvalidArgumentError, match=flag):
            dsv4hal.select_platform(**{flag: value})


def test_lookups_raise_typed_errors(reference_unchecked) -> None:  # noqa: ANN001
    """Unknown op and arch lookups raise typed errors that are still KeyErrors."""
    with pytest.raises(UnknownNameError, match="valid ops"):
        reference_unchecked.explain("nope")
    with pytest.raises(KeyError):  # still a KeyError for callers that catch lookups
        reference_unchecked.ops["nope"]
    with pytest.raises(UnknownArchError, match="sm90"):
        dsv4hal.simulated("sm75")
    with pytest.raises(ValueError):
        dsv4hal.PlatformInfo(vendor=dsv4hal.Vendor.CPU, arch="sm75")
    from dsv4hal.reference.moe import quantize_experts

    w = quantize_experts(torch.randn(2, 64, 64) * 0.1, torch.randn(2, 64, 32) * 0.1, "fp8_block")
    prepared = reference_unchecked.ops.moe_experts.prepare_weights(
        dataclasses.replace(w, **{f: getattr(w, f).to(DEV) for f in ("w13", "w13_scale", "w2", "w2_scale")}))
    renamed = dataclasses.replace(prepared, implementation="no_such_kernel")
    x = torch.randn(3, 64, device=DEV).bfloat16()
    with pytest.raises(PreparedWeightsMismatchError, match="no_such_kernel"):
        reference_unchecked.ops.moe_experts(x, torch.zeros(3, 2, dtype=torch.int32, device=DEV),
                                            torch.ones(3, 2, device=DEV), renamed)
