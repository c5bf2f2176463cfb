"""The FlashMLA decode glue calls sgl-flash-mla's torch op (flash_mla_legacy::sparse_decode_fwd) directly when the op
has the schema it was written against, and the Python entry otherwise. Here a real torch op with that schema, in a
test namespace, stands in for the vendor's: it records its arguments and returns outputs shaped as FlashMLA's.

Checked: the op gets what flash_mla_with_kvcache would hand it (the [T, 1, ...] views of q and the indices, the caches'
FlashMLA views, 512, the scale, no kv_format); outside a decode step it plans per call (no plan tensors passed in);
inside one, calls of one shape share the first call's plan and another shape gets its own; an op whose schema differs
is not called (the Python entry is)."""

from __future__ import annotations

import contextlib
import itertools
from typing import Any

import pytest
import torch
from vendor_fakes import FakeSchedMeta, fake_module, install_modules, simulated_info

import dsv4hal
from dsv4hal.kernels import flashmla_glue
from dsv4hal.step import decode_step

SCHEMA = ("(Tensor q, Tensor kv, Tensor indices, Tensor? topk_length, Tensor? attn_sink, "
          "Tensor(a!)? tile_scheduler_metadata, Tensor(b!)? num_splits, Tensor? extra_kv, Tensor? extra_indices, "
          "Tensor? extra_topk_length, int d_v, float sm_scale, str? kv_format=None) "
          "-> (Tensor, Tensor, Tensor(a)?, Tensor(b)?)")
_names = itertools.count()
CALLS: list[dict[str, Any]] = []


def _define(schema: str) -> Any:
    """A fresh op namespace holding sparse_decode_fwd with `schema`, implemented on the CPU by a recorder."""
    ns = f"dsv4hal_test_fmla{next(_names)}"
    lib = torch.library.Library(ns, "DEF")
    lib.define("sparse_decode_fwd" + schema)
    plans = itertools.count(1)

    def impl(q, kv, indices, topk_length, attn_sink, tile_scheduler_metadata, num_splits, extra_kv,  # noqa: ANN001, ANN202
             extra_indices, extra_topk_length, d_v, sm_scale, kv_format=None):
        CALLS.append(dict(locals()))
        b, s_q, h_q, _ = q.shape
        md = tile_scheduler_metadata if tile_scheduler_metadata is not None else torch.full((1, 8), next(plans))
        splits = num_splits if num_splits is not None else torch.zeros(b + 1, dtype=torch.int32)
        lse = torch.full((b, s_q, h_q), 2.0).transpose(1, 2)
        return torch.ones(b, s_q, h_q, d_v, dtype=torch.bfloat16), lse, md, splits

    lib.impl("sparse_decode_fwd", impl, "CPU")
    return lib, getattr(torch.ops, ns)


@pytest.fixture(scope="module")
def namespaces() -> dict[str, Any]:
    libs = {"expected": _define(SCHEMA), "other": _define(SCHEMA.replace("sm_scale", "softmax_scale"))}
    yield {k: ns for k, (_, ns) in libs.items()}
    for lib, _ in libs.values():
        lib._destroy()


@pytest.fixture(params=["1", "0"], ids=["c++ glue", "python glue"], autouse=True)
def glue(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test runs with the C++ glue required (native_glue: its build failing fails the test) and without it."""
    monkeypatch.setenv("DSV4HAL_NATIVE_GLUE", request.param)
    return request.param


def _install(monkeypatch: pytest.MonkeyPatch, namespace: Any) -> list[str]:
    entry_calls: list[str] = []

    def flash_mla_with_kvcache(q, *args: Any, **kwargs: Any):  # noqa: ANN001, ANN202
        entry_calls.append("flash_mla_with_kvcache")
        b, s_q, h_q, _ = q.shape
        return torch.zeros(b, s_q, h_q, 512, dtype=torch.bfloat16), torch.zeros(b, h_q, s_q)

    iface = fake_module("flash_mla.flash_mla_interface", get_mla_metadata=lambda *a, **k: (FakeSchedMeta(), None),
                        flash_mla_with_kvcache=flash_mla_with_kvcache, FlashMLASchedMeta=FakeSchedMeta,
                        get_ops=lambda use_legacy: namespace)
    pkg = fake_module("flash_mla", __version__="1.0.0", __path__=[], has_legacy=lambda: True)
    install_modules(monkeypatch, {"flash_mla": pkg, "flash_mla.flash_mla_interface": iface})
    return entry_calls


def _args(t: int, ratio: int) -> dict[str, Any]:
    i32 = dict(dtype=torch.int32)
    swa = dsv4hal.V4PagedCache.empty(2, 256)
    args: dict[str, Any] = dict(q=torch.randn(t, 64, 512).bfloat16(), swa_cache=swa,
                                swa_indices=torch.zeros(t, 128, **i32), swa_lengths=torch.full((t,), 128, **i32),
                                sink=torch.zeros(64), softmax_scale=0.0625)
    if ratio:
        x = dsv4hal.V4PagedCache.empty(4, 64 if ratio == 4 else 2)
        args.update(extra_cache=x, extra_indices=torch.zeros(t, 64, **i32), extra_lengths=torch.full((t,), 64, **i32))
    return args


@pytest.mark.parametrize("ratio", [0, 4])
def test_the_op_gets_what_the_python_entry_would_pass(monkeypatch: pytest.MonkeyPatch, namespaces: dict[str, Any],
                                                      ratio: int, glue: str) -> None:
    """The native FlashMLA decode op receives the same arguments as the Python entry would."""
    entry_calls = _install(monkeypatch, namespaces["expected"])
    assert (flashmla_glue.native_decode("sgl") is not None) == (glue == "1")
    op = dsv4hal.select_platform(info=simulated_info("sm90", flash_mla="1.0.0")).ops.sparse_attention_decode
    args = _args(3, ratio)
    CALLS.clear()
    out, lse = op(**args)
    assert entry_calls == [] and len(CALLS) == 1
    c = CALLS[0]
    assert c["q"].shape == (3, 1, 64, 512) and c["q"].data_ptr() == args["q"].data_ptr()
    assert c["indices"].shape == (3, 1, 128) and c["kv"].shape == args["swa_cache"].flashmla_view().shape
    assert torch.equal(c["topk_length"], args["swa_lengths"]) and c["attn_sink"] is args["sink"]
    assert c["tile_scheduler_metadata"] is None and c["num_splits"] is None  # no step: the op plans this call
    assert (c["d_v"], c["sm_scale"], c["kv_format"]) == (512, 0.0625, None)
    if ratio:
        assert c["extra_kv"].shape == args["extra_cache"].flashmla_view().shape
        assert c["extra_indices"].shape == (3, 1, 64) and torch.equal(c["extra_topk_length"], args["extra_lengths"])
    else:
        assert c["extra_kv"] is None and c["extra_indices"] is None and c["extra_topk_length"] is None
    assert out.shape == (3, 64, 512) and out.dtype == torch.bfloat16 and bool((out == 1).all())
    assert lse.shape == (3, 64) and bool((lse == 2).all())


def test_a_step_shares_one_plan_per_shape(monkeypatch: pytest.MonkeyPatch, namespaces: dict[str, Any]) -> None:
    """Within a decode step FlashMLA plans once per shape and reuses the plan."""
    _install(monkeypatch, namespaces["expected"])
    op = dsv4hal.select_platform(info=simulated_info("sm90", flash_mla="1.0.0")).ops.sparse_attention_decode
    small, large = _args(2, 4), _args(5, 4)
    CALLS.clear()
    with decode_step():
        for args in (small, small, large, small, large):
            op(**args)
    md = [c["tile_scheduler_metadata"] for c in CALLS]
    assert md[0] is None and md[2] is None  # the first call of each shape plans
    assert md[1] is not None and md[1] is md[3] and md[4] is not None and md[4] is not md[1]
    assert int(md[1][0, 0]) != int(md[4][0, 0])  # two plans, one per shape
    CALLS.clear()
    op(**small)  # after the step: planned per call again
    assert CALLS[0]["tile_scheduler_metadata"] is None


def test_an_op_with_another_schema_is_not_called(monkeypatch: pytest.MonkeyPatch,
                                                 namespaces: dict[str, Any]) -> None:
    """A FlashMLA op with an unexpected schema is not called; the Python entry is used."""
    entry_calls = _install(monkeypatch, namespaces["other"])
    assert flashmla_glue.decode_op("sgl") is None and flashmla_glue.decode_op("vllm") is None
    op = dsv4hal.select_platform(info=simulated_info("sm90", flash_mla="1.0.0")).ops.sparse_attention_decode
    CALLS.clear()
    op(**_args(1, 0))
    assert CALLS == [] and entry_calls == ["flash_mla_with_kvcache"]


def _stand_in_planner(monkeypatch: pytest.MonkeyPatch) -> tuple[tuple, list[tuple]]:
    """flashmla_sched.plan replaced: (the plan it hands out, for 3 requests; the arguments of each call to it)."""
    from dsv4hal.kernels import flashmla_sched

    made = (torch.full((132, 8), 7, dtype=torch.int32), torch.zeros(4, dtype=torch.int32),
            torch.full((3,), 5, dtype=torch.int32), torch.full((3,), 6, dtype=torch.int32))
    asked: list[tuple] = []

    def plan(q, lengths, width, extra_lengths, extra_width):  # noqa: ANN001, ANN202
        asked.append((q.shape, lengths, width, extra_lengths, extra_width))
        return made

    monkeypatch.setattr(flashmla_sched, "plan", plan)
    return made, asked


def _handed(calls: list[dict[str, Any]], made: tuple) -> bool:
    """Whether every call's op got the stand-in plan and the lengths it was made for (clamped by the planner), not
    the engine's buffers."""
    return all(c["tile_scheduler_metadata"] is made[0] and c["num_splits"] is made[1] and c["topk_length"] is made[2]
               and c["extra_topk_length"] is made[3] for c in calls)


@pytest.mark.parametrize("mode", ["in a step", "captured"])
def test_the_parallel_plan_is_handed_to_the_op(monkeypatch: pytest.MonkeyPatch, namespaces: dict[str, Any],
                                               mode: str) -> None:
    """Inside a step the first call of a shape asks flashmla_sched for the plan (on SM90 it makes one; here a
    stand-in) with the call's lengths and widths; outside a step, a call made while its stream is captured into a
    CUDA graph asks for one each call (host time is paid once, at capture); an eager call outside a step asks
    for none (the op plans). The op gets the plan."""
    _install(monkeypatch, namespaces["expected"])
    made, asked = _stand_in_planner(monkeypatch)
    op = dsv4hal.select_platform(info=simulated_info("sm90", flash_mla="1.0.0")).ops.sparse_attention_decode
    args = _args(3, 4)
    CALLS.clear()
    op(**args)
    assert asked == [] and CALLS[0]["tile_scheduler_metadata"] is None
    if mode == "captured":
        monkeypatch.setattr(flashmla_glue, "capturing", lambda q: True)
    with decode_step() if mode == "in a step" else contextlib.nullcontext():
        op(**args)
        op(**args)
    assert len(asked) == (1 if mode == "in a step" else 2)
    shape, lengths, width, extra_lengths, extra_width = asked[0]
    assert shape == (3, 64, 512) and lengths is args["swa_lengths"] and width == 128
    assert extra_lengths is args["extra_lengths"] and extra_width == 64
    assert _handed(CALLS[1:], made)


def test_a_plan_each_call_is_the_parallel_programs_outside_a_step(monkeypatch: pytest.MonkeyPatch,
                                                                 namespaces: dict[str, Any]) -> None:
    """The benchmarks' variant plan_each_call: outside a step each call asks flashmla_sched for the plan and hands
    it, with the lengths it clamped, to the op (the bound glue leaves the plan to the op there)."""
    _install(monkeypatch, namespaces["expected"])
    made, asked = _stand_in_planner(monkeypatch)
    decode = flashmla_glue._decoder("sgl", plan_each_call=True)
    args = _args(3, 4)
    CALLS.clear()
    decode(**args)
    decode(**args)
    assert [width for _, _, width, _, _ in asked] == [128, 128] and len(CALLS) == 2
    assert _handed(CALLS, made)


def test_capturing_is_false_for_cpu_tensors() -> None:
    """A CPU tensor's stream is never captured (and a CPU build of torch has no capture state to ask)."""
    assert flashmla_glue.capturing(torch.zeros(1)) is False


@pytest.mark.parametrize("mode", ["per call", "in a step", "captured"])
def test_flashmla_never_gets_lengths_outside_its_index_rows(monkeypatch: pytest.MonkeyPatch,
                                                            namespaces: dict[str, Any], mode: str) -> None:
    """Garbage lengths in an unchecked call (negative, past the widths) reach FlashMLA clamped into [0, width]: its
    scheduler asserts on them (ending the CUDA context) and its decode would read past the index rows. Captured
    here: the planner declines (CPU tensors), and the glue clamps them itself."""
    _install(monkeypatch, namespaces["expected"])
    if mode == "captured":
        monkeypatch.setattr(flashmla_glue, "capturing", lambda q: True)
    in_step = mode == "in a step"
    op = dsv4hal.select_platform(info=simulated_info("sm90", flash_mla="1.0.0")).ops.sparse_attention_decode
    args = _args(3, 4)
    args["swa_lengths"] = torch.tensor([-5, 129, 2**31 - 1], dtype=torch.int32)
    args["extra_lengths"] = torch.tensor([65, -2**31, 7], dtype=torch.int32)
    CALLS.clear()
    if in_step:
        with decode_step():
            op(**args)
            op(**args)
    else:
        op(**args)
    for c in CALLS:
        assert c["topk_length"].tolist() == [0, 128, 128]
        assert c["extra_topk_length"].tolist() == [64, 0, 7]


def test_without_triton_the_op_plans_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    """FlashMLA needs no Triton: where dsv4hal's planner cannot be imported, the glue asks for none."""
    import sys

    import dsv4hal.kernels

    monkeypatch.setitem(sys.modules, "dsv4hal.kernels.flashmla_sched", None)  # an import of it raises ImportError
    monkeypatch.delattr(dsv4hal.kernels, "flashmla_sched", raising=False)
    assert flashmla_glue.parallel_planner() is None
