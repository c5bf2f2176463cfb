"""Validation while Dynamo traces: a refused call reaches the caller of a compiled function as the same typed
error as in eager (dsv4hal.custom_ops calls it before flattening an op's arguments).

The traced call validates the op's arguments before flattening them, as eager does: Dynamo traces the validation
(it reads types, dtypes, shapes, strides, devices and scalar values, never tensor contents), so a call that passes
leaves guards and no graph node, and costs nothing when the compiled code runs. A call that fails must reach the
caller as the same typed error as in eager. An exception raised in traced code reaches the caller of a
fullgraph=True compile only as Dynamo's own "Observed exception" error, so the error Dynamo caught is raised again
from a function Dynamo runs rather than traces (refuse, run_not_traced), as an instance of its class that
is also Dynamo's Unsupported: Dynamo lets an Unsupported through unchanged (fullgraph=True), or breaks the graph
there and runs the call eagerly (fullgraph=False), which raises the plain typed error.
What the validation reads becomes Dynamo guards, checked on every call of the compiled function unless the engine
skips guard evaluation or replays a CUDA graph: on the CI machine 5 to 10 us for each op the function uses (most
guards are on the validation's own functions and constants, shared by every call site of the op)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from dsv4hal import checks
from dsv4hal.checks import check_materializable
from dsv4hal.errors import Dsv4HalError, InvalidArgumentError

if TYPE_CHECKING:
    from dsv4hal.ops.signatures import OpDefinition

def run_not_traced(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Mark fn as torch._dynamo.assume_constant_result does: Dynamo calls it rather than traces it, and takes what it
    returns as a constant. The mark is set here rather than by that function, whose import (torch._dynamo) would load
    Triton when a CPU platform binds its ops; the compile tests fail if Dynamo stops reading it."""
    fn._dynamo_marked_constant = True  # type: ignore[attr-defined]
    return fn


# The device's memory size, which validation compares sizes with (dsv4hal.checks.check_alloc), is a host query Dynamo
# cannot trace (os.sysconf, a CUDA property): it runs it and takes the result as a constant.
run_not_traced(checks._memory_bytes)

_refusals: dict[type, type] = {}


def _refusal_type(cls: type[Dsv4HalError]) -> type[Dsv4HalError]:
    """cls, also a torch._dynamo.exc.Unsupported (cls when this torch has no such class)."""
    sub = _refusals.get(cls)
    if sub is None:
        try:
            from torch._dynamo.exc import Unsupported
        except ImportError:  # pragma: no cover  (another torch: the plain class, which Dynamo then reports)
            return cls
        sub = _refusals[cls] = type(cls.__name__, (cls, Unsupported), {"__module__": cls.__module__,
                                                                       "__qualname__": cls.__qualname__})
    return sub


def refusal(cls: type[Dsv4HalError], message: str, remedy: str | None,
            fields: tuple[tuple[str, object], ...] = ()) -> Dsv4HalError:
    """The error `cls(...)` with this message, remedy and attributes, as refuse raises it while Dynamo traces."""
    sub = _refusal_type(cls)
    err = sub.__new__(sub)
    if sub is not cls:
        from torch._dynamo.exc import Unsupported

        try:  # what Dynamo reads of an Unsupported it lets through or breaks the graph at
            Unsupported.__init__(err, message, "dsv4hal argument validation")  # type: ignore[arg-type]
        except Exception:  # noqa: BLE001  (another torch's Unsupported: its message alone)
            pass
    for name, value in fields:
        setattr(err, name, value)
    Dsv4HalError.__init__(err, message, remedy=remedy)
    return err


@run_not_traced
def refuse(cls: type[Dsv4HalError], message: str, remedy: str | None,
           fields: tuple[tuple[str, object], ...]) -> None:
    # run by Dynamo, not traced: the exception leaves the tracer as raised
    raise refusal(cls, message, remedy, fields)


def _fields_of(e: Dsv4HalError) -> tuple[tuple[str, object], ...]:
    if isinstance(e, InvalidArgumentError):
        return (("op", e.op), ("argument", e.argument), ("expected", e.expected), ("got", e.got))
    return ()


def validator(definition: OpDefinition[..., Any]) -> Callable[[tuple, dict[str, Any]], None]:
    """validate(args, kwargs) for the traced call of this op: eager's unchecked validation (values are not known
    while tracing), its errors raised so that they leave Dynamo as raised."""
    op, params = definition.name, definition.params

    @run_not_traced
    def check_call(count: int, names: tuple[str, ...]) -> bool:
        # run, not traced: a call that does not bind would fail inside Dynamo's inlining, before validation
        try:
            definition.check_call((None,) * count, dict.fromkeys(names))
        except Dsv4HalError as e:
            raise refusal(type(e), e.message, e.remedy) from None
        return True

    def validate(args: tuple, kwargs: dict[str, Any]) -> None:
        check_call(len(args), tuple(kwargs))
        try:
            check_materializable(op, args, kwargs, params)
            definition.validate(*args, **kwargs, checked=False)
        except Dsv4HalError as e:
            refuse(type(e), e.message, e.remedy, _fields_of(e))

    return validate
