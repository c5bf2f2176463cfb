"""C++ glue for vendor ops whose Python call costs more host time than the launch itself: the sources in
dsv4hal/kernels/csrc/, built at first use with torch.utils.cpp_extension (a C++ compiler and ninja; 11 s on the
CI machine, 16 s on the H200's) and cached on disk where torch keeps its extensions (TORCH_EXTENSIONS_DIR), so later
processes load the built module. The glue never changes which kernel runs or its arguments, only how the call is
made: tests/ops/attention/test_flashmla_decode_op.py checks that the op gets the same arguments either way, and on
the H200 `dsv4hal bench attention` that the outputs are the same bytes.

DSV4HAL_NATIVE_GLUE chooses:
- `auto` (default): build the glue at first use; where that fails, the Python glue is used and `status()` (and
  `dsv4hal info`) says why.
- `0`: never (the Python glue).
- `1`: required: a glue that cannot be built raises NativeGlueError instead of falling back."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from dsv4hal.errors import Dsv4HalError

MODE_ENV = "DSV4HAL_NATIVE_GLUE"
MODES = ("auto", "0", "1")
SOURCES = Path(__file__).parent / "csrc"
FLASHMLA_DECODE = "flashmla_decode"  # csrc/flashmla_decode.cpp


class NativeGlueError(Dsv4HalError):
    """DSV4HAL_NATIVE_GLUE is not auto, 0 or 1 (refused when a platform is selected), or the C++ glue was required
    (DSV4HAL_NATIVE_GLUE=1) and could not be built or bound."""


def mode() -> str:
    raw = os.environ.get(MODE_ENV, "auto").strip().lower() or "auto"
    if raw not in MODES:
        raise NativeGlueError(f"{MODE_ENV}={raw!r} is not one of {', '.join(MODES)}",
                              remedy=f"set {MODE_ENV} to auto (default), 0 (Python glue) or 1 (C++ glue required)")
    return raw


_failures: dict[str, str] = {}  # source name -> why its module is not in use
_built: dict[str, str] = {}  # source name -> the loaded module's file
_build_failed: set[str] = set()  # not built again in this process


@functools.cache
def _build(name: str) -> ModuleType:
    from torch.utils import cpp_extension  # torch's build helpers: imported on first use only

    return cpp_extension.load(f"dsv4hal_{name}", [str(SOURCES / f"{name}.cpp")], extra_cflags=["-O2"],
                              verbose=False)


def module(name: str) -> ModuleType | None:
    """The built module of csrc/<name>.cpp, or None (mode 0, or mode auto and the build failed: status() says why)."""
    m = mode()
    if m == "0":
        _failures[name] = f"{MODE_ENV}=0"
        return None
    if name in _build_failed and m == "auto":
        return None
    try:
        mod = _build(name)
    except Exception as exc:  # noqa: BLE001  (no compiler, no ninja, no headers: any of them means no glue)
        last = (str(exc).strip().splitlines() or [""])[-1]
        why = f"building csrc/{name}.cpp failed: {type(exc).__name__}: {last}"
        if m == "1":
            raise NativeGlueError(f"{why} ({MODE_ENV}=1 requires it)",
                                  remedy=f"install a C++ compiler and ninja, or set {MODE_ENV}=auto or 0 to use the "
                                         "Python glue (the same kernels, more host time a call)") from exc
        _failures[name] = why
        _build_failed.add(name)
        return None
    _failures.pop(name, None)
    _built[name] = str(mod.__file__)
    return mod


def flashmla_decode_call(op: Any) -> Callable[..., Any] | None:
    """FlashMLA's decode op (a torch OpOverload whose schema the caller checked) called from C++: takes q [T, h, d]
    and the indices [T, k] as dsv4hal's contract does and returns (out [T, h, d_v], lse [T, h], metadata, splits).
    None where the glue is not in use."""
    mod = module(FLASHMLA_DECODE)
    if mod is None:
        return None
    schema = op._schema
    try:
        return mod.DecodeCall(schema.name, schema.overload_name)
    except Exception as exc:  # noqa: BLE001  (the op is not in the dispatcher the module was built against)
        why = f"binding {schema.name} failed: {type(exc).__name__}: {exc}"
        if mode() == "1":
            raise NativeGlueError(why, remedy=f"set {MODE_ENV}=auto or 0 to use the Python glue") from exc
        _failures[FLASHMLA_DECODE] = why
        return None


def status() -> dict[str, Any]:
    """What `dsv4hal info` shows: the mode, the modules loaded in this process, and why any other is not in use."""
    try:
        m = mode()
    except NativeGlueError as exc:
        m = str(exc)
    return {"mode": m, "built": dict(_built), "not_in_use": dict(_failures)}
