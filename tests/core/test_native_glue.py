"""dsv4hal.kernels.native_glue: the C++ call glue's modes and what each does when the glue cannot be built or bound.
(tests/ops/attention/test_flashmla_decode_op.py runs the FlashMLA decode glue's checks with the built module and
without it.)"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from dsv4hal.cli import main
from dsv4hal.kernels import flashmla_glue, native_glue
from dsv4hal.kernels.native_glue import NativeGlueError

SCHEMA = ("(Tensor q, Tensor kv, Tensor indices, Tensor? topk_length, Tensor? attn_sink, "
          "Tensor(a!)? tile_scheduler_metadata, Tensor(b!)? num_splits, Tensor? extra_kv, Tensor? extra_indices, "
          "Tensor? extra_topk_length, int d_v, float sm_scale, str? kv_format=None) "
          "-> (Tensor, Tensor, Tensor(a)?, Tensor(b)?)")


@pytest.fixture(autouse=True)
def fresh_state(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(native_glue, "_failures", {})
    monkeypatch.setattr(native_glue, "_built", {})
    monkeypatch.setattr(native_glue, "_build_failed", set())


@pytest.fixture
def no_compiler(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    tried: list[str] = []

    def build(name: str) -> Any:
        tried.append(name)
        raise RuntimeError("Error building extension\nc++: command not found")

    monkeypatch.setattr(native_glue, "_build", build)
    return tried


def _plain(q, kv, indices, *rest):  # noqa: ANN001, ANN202
    return q.clone(), torch.zeros(q.shape[0], q.shape[2], q.shape[1]), None, None


def _op(name: str, schema: str = SCHEMA, impl: Any = _plain) -> tuple[Any, Any]:
    """A torch op `name::sparse_decode_fwd` with `schema`, implemented on the CPU by impl."""
    lib = torch.library.Library(name, "DEF")
    lib.define("sparse_decode_fwd" + schema)
    lib.impl("sparse_decode_fwd", impl, "CPU")
    return lib, getattr(torch.ops, name).sparse_decode_fwd.default


def test_an_unknown_mode_is_an_error_with_the_choices(monkeypatch: pytest.MonkeyPatch) -> None:
    """An unknown DSV4HAL_NATIVE_GLUE value is a NativeGlueError listing the choices."""
    monkeypatch.setenv(native_glue.MODE_ENV, "yes")
    with pytest.raises(NativeGlueError, match="auto.*0.*1") as err:
        native_glue.module(native_glue.FLASHMLA_DECODE)
    assert err.value.remedy and native_glue.MODE_ENV in err.value.remedy
    assert "yes" in native_glue.status()["mode"]


def test_mode_0_never_builds(monkeypatch: pytest.MonkeyPatch, no_compiler: list[str]) -> None:
    """DSV4HAL_NATIVE_GLUE=0 never builds the glue and says so in status."""
    monkeypatch.setenv(native_glue.MODE_ENV, "0")
    assert native_glue.module(native_glue.FLASHMLA_DECODE) is None and no_compiler == []
    assert native_glue.status()["not_in_use"] == {native_glue.FLASHMLA_DECODE: "DSV4HAL_NATIVE_GLUE=0"}
    monkeypatch.setenv(native_glue.MODE_ENV, "auto")  # mode 0 earlier in the process does not stop a later build
    assert native_glue.module(native_glue.FLASHMLA_DECODE) is None and no_compiler == [native_glue.FLASHMLA_DECODE]


def test_auto_falls_back_once_and_says_why(monkeypatch: pytest.MonkeyPatch, no_compiler: list[str]) -> None:
    """In auto mode a failed build falls back once, is not retried, and status says why."""
    monkeypatch.delenv(native_glue.MODE_ENV, raising=False)
    assert native_glue.module(native_glue.FLASHMLA_DECODE) is None
    assert native_glue.module(native_glue.FLASHMLA_DECODE) is None
    assert no_compiler == [native_glue.FLASHMLA_DECODE]  # not rebuilt per call
    why = native_glue.status()["not_in_use"][native_glue.FLASHMLA_DECODE]
    assert "RuntimeError" in why and "command not found" in why
    assert native_glue.status()["built"] == {}


def test_required_glue_that_cannot_be_built_is_an_error(monkeypatch: pytest.MonkeyPatch,
                                                        no_compiler: list[str]) -> None:
    """DSV4HAL_NATIVE_GLUE=1 with a failing build raises NativeGlueError with a remedy."""
    monkeypatch.setenv(native_glue.MODE_ENV, "1")
    with pytest.raises(NativeGlueError, match="command not found") as err:
        native_glue.module(native_glue.FLASHMLA_DECODE)
    assert "auto or 0" in (err.value.remedy or "")


def test_info_shows_the_mode_and_why_a_glue_is_not_in_use(monkeypatch: pytest.MonkeyPatch, no_compiler: list[str],
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """dsv4hal info shows the native-glue mode and why a glue is not in use."""
    monkeypatch.delenv(native_glue.MODE_ENV, raising=False)
    native_glue.module(native_glue.FLASHMLA_DECODE)
    assert main(["info", "--platform", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "native glue: DSV4HAL_NATIVE_GLUE=auto" in out
    assert "not in use: flashmla_decode: building csrc/flashmla_decode.cpp failed" in out


@pytest.mark.parametrize("mode", ["auto", "1"])
def test_the_built_module_calls_the_op_with_the_views(monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    """The C++ call of a real op (this test's): q and the indices go in as [T, 1, ...] views of the caller's tensors
    (no copies), the outputs come back with the s_q axis squeezed, None plans stay None."""
    monkeypatch.setenv(native_glue.MODE_ENV, mode)
    seen: list[tuple] = []

    def impl(q, kv, indices, topk_length, attn_sink, md, splits, extra_kv, extra_indices, extra_lengths,  # noqa: ANN001, ANN202
             d_v, sm_scale, kv_format=None):
        seen.append((tuple(q.shape), q.data_ptr(), tuple(indices.shape), tuple(extra_indices.shape), d_v, sm_scale,
                     kv_format, md))
        b, _, h, _ = q.shape
        return q[..., :d_v] * 2, torch.arange(b * h, dtype=torch.float32).view(b, h, 1), torch.ones(2), None

    lib, op = _op(f"dsv4hal_test_native_{mode}", impl=impl)
    try:
        call = native_glue.flashmla_decode_call(op)
        assert call is not None
        assert native_glue.status()["built"].keys() == {native_glue.FLASHMLA_DECODE}
        q = torch.randn(3, 4, 8)
        idx = torch.zeros(3, 16, dtype=torch.int32)
        out, lse, md, splits = call(q, torch.zeros(2, 3), idx, torch.ones(3), torch.zeros(4), None, None, None, idx,
                                    None, 8, 0.25)
        assert seen == [((3, 1, 4, 8), q.data_ptr(), (3, 1, 16), (3, 1, 16), 8, 0.25, None, None)]
        assert out.shape == (3, 4, 8) and torch.equal(out, q * 2)
        assert lse.shape == (3, 4) and torch.equal(lse.flatten(), torch.arange(12, dtype=torch.float32))
        assert torch.equal(md, torch.ones(2)) and splits is None
    finally:
        lib._destroy()


def test_an_op_the_dispatcher_does_not_hold_is_not_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """An op no longer registered with the dispatcher is not bound, and status says so."""
    lib, op = _op("dsv4hal_test_native_b")
    lib._destroy()  # the OpOverload object outlives the op's registration
    monkeypatch.setenv(native_glue.MODE_ENV, "auto")
    assert native_glue.flashmla_decode_call(op) is None
    assert "binding dsv4hal_test_native_b::sparse_decode_fwd failed" in native_glue.status()["not_in_use"][
        native_glue.FLASHMLA_DECODE]
    monkeypatch.setattr(native_glue, "_failures", {})
    monkeypatch.setenv(native_glue.MODE_ENV, "1")
    with pytest.raises(NativeGlueError, match="binding"):
        native_glue.flashmla_decode_call(op)


def test_an_op_with_other_argument_types_keeps_the_python_glue(monkeypatch: pytest.MonkeyPatch) -> None:
    """Same argument names, a type the C++ glue does not push (d_v optional): the op is called from Python, where torch
    checks its arguments against the schema."""
    lib, op = _op("dsv4hal_test_native_c", SCHEMA.replace("int d_v", "int? d_v"))
    try:
        monkeypatch.setattr(flashmla_glue, "decode_op", lambda flavour: op)
        monkeypatch.setattr(flashmla_glue, "native_decode", flashmla_glue.native_decode.__wrapped__)
        monkeypatch.setenv(native_glue.MODE_ENV, "1")
        assert flashmla_glue.native_decode("sgl") is None
    finally:
        lib._destroy()


def test_an_error_inside_the_op_reaches_the_caller(monkeypatch: pytest.MonkeyPatch) -> None:
    """A vendor's check failing inside the op (FlashMLA's TORCH_CHECKs) comes out of the C++ call as a Python
    exception with the op's message, not as a crash or a swallowed error."""
    monkeypatch.setenv(native_glue.MODE_ENV, "1")

    def impl(q, *rest):  # noqa: ANN001, ANN002, ANN202
        raise ValueError("topk_length must be int32")

    lib, op = _op("dsv4hal_test_native_err", impl=impl)
    try:
        call = native_glue.flashmla_decode_call(op)
        q = torch.randn(1, 4, 8)
        idx = torch.zeros(1, 16, dtype=torch.int32)
        with pytest.raises(Exception, match="topk_length must be int32"):
            call(q, torch.zeros(2, 3), idx, torch.ones(1), torch.zeros(4), None, None, None, None, None, 8, 0.25)
    finally:
        lib._destroy()
