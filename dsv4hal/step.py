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

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any

_plans: contextvars.ContextVar[dict[Any, Any] | None] = contextvars.ContextVar("dsv4hal_step_plans", default=None)


@contextlib.contextmanager
def decode_step() -> Iterator[dict[Any, Any]]:
    """Share kernel plans among the calls inside; a new step starts with no plans."""
    token = _plans.set({})
    try:
        yield _plans.get()  # type: ignore[misc]
    finally:
        _plans.reset(token)


def step_plans() -> dict[Any, Any] | None:
    """The current step's plan store, or None outside a declared step (then plan per call)."""
    return _plans.get()
