"""Per-step plan sharing. Some vendor kernels plan work from the lengths of a batch (FlashMLA's
scheduler metadata). A plan is only valid while shapes and lengths are unchanged, which a kernel
cannot see without a host sync, so by default every call plans afresh. An engine that knows a
decode step's metadata is fixed declares it:

    with platform.decode_step():
        for layer in layers:
            platform.ops.sparse_attention_decode(...)   # one plan per (ratio, shapes), shared by layers

Under CUDA-graph capture the planning kernels are captured too, so each replay re-plans from the
lengths written in place before it."""

from __future__ import annotations

import contextvars
import sys
from types import TracebackType
from typing import Any

_plans: contextvars.ContextVar[dict[Any, Any] | None] = contextvars.ContextVar("dsv4hal_step_plans", default=None)


def _compiling() -> bool:
    """Dynamo is tracing. torch is never imported here: without it nothing can be compiling."""
    torch = sys.modules.get("torch")
    return torch is not None and torch.compiler.is_compiling()


class decode_step:  # noqa: N801  (used as a function: `with decode_step():`)
    """Share kernel plans among the calls inside; a new step starts with no plans.

    Under torch.compile this is a no-op that Dynamo traces through (it cannot trace ContextVar.set): every op is
    an opaque custom op there (dsv4hal.custom_ops) that plans when it runs. To share plans in a compiled step,
    enter the step around the compiled function's call instead: `with platform.decode_step(): step_fn(...)`."""

    def __init__(self) -> None:
        self._token: contextvars.Token[dict[Any, Any] | None] | None = None

    def __enter__(self) -> dict[Any, Any] | None:
        if _compiling():
            return None
        self._token = _plans.set({})
        return _plans.get()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._token is not None:
            _plans.reset(self._token)
            self._token = None


def step_plans() -> dict[Any, Any] | None:
    """The current step's plan store, or None outside a declared step (then plan per call)."""
    return _plans.get()
