"""Every bound op as a torch custom op, so that torch.compile(fullgraph=True) sees it as one opaque node whatever
kernel runs inside (vendor, Triton or the reference, whose data-dependent `.tolist()` Dynamo could not trace).

How an engine uses it: nothing changes. `platform.ops.X(...)` checks torch.compiler.is_compiling(); while Dynamo
traces, it validates the arguments as eager mode does (unchecked; dsv4hal.compile_validation), calls the custom op
with them flattened to tensors and scalars, and the custom op's eager implementation rebuilds them and calls the same
bound op, which validates and dispatches as in eager mode.

Everything here is derived from the op's definition (dsv4hal.ops.signatures): the schema and the flattening from its
type hints, the defaults from its signature, the fake from its declared `fake`, the mutated arguments from
`mutates`. Each bound op has its own custom op, `torch.ops.dsv4hal.<op>_p<platform handle>`, registered when Dynamo
first traces it; its eager body holds a weak reference to the bound op, so the compiled path needs no table of
platforms and a platform is freed with its last reference (a graph that outlives it raises a typed error).

The direct-call entry, `torch.ops.dsv4hal.<op>(<flat arguments>..., platform)`, is for callers that use the torch op
itself: the same flattening with the platform's int handle (Platform.handle) as last argument, registered when a
platform with that op is created (enroll). It finds the platform in DIRECT_CALL_PLATFORMS, a weak registry of live
platforms used by this entry only; a handle whose platform is gone raises a typed error.

Flattened arguments, by type hint:
    torch.Tensor (| None), str          as they are
    int, float, bool (| None)           Number (schema Scalar): the dispatcher would convert a bool passed for an
                                        int (True -> 1) and an int for a bool; a Scalar keeps its Python type, so
                                        the eager body's validation refuses what eager refuses
    a dataclass of tensors only (AttentionMetadata)
                                        one list of its tensors, named as the argument
    another dataclass (V4PagedCache, IndexerPagedCache; | None)
                                        its init fields in order: the first named as the argument, the others by
                                        the field, after the argument's name less a trailing "cache" (cache:
                                        page_size; swa_cache: swa_page_size)
    PreparedWeights                     its payload's tensors (the argument's name less a plural s, then _tensors:
                                        weights -> weight_tensors; the graph sees them) and an int handle naming
                                        the object
An optional argument of the op's return type (build_attention_metadata's `out`) is an output argument: given, the
call runs the variant `<name>_out`, which writes its tensors in place and returns nothing.

Imported when a platform binds its ops (it imports torch); `import dsv4hal` stays free of torch."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import itertools
import types
import typing
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch
from torch.types import Number

from dsv4hal.checks import check_materializable, describe
from dsv4hal.compile_validation import run_not_traced, validator
from dsv4hal.errors import Dsv4HalError, InvalidArgumentError
from dsv4hal.ops.signatures import OpDefinition
from dsv4hal.prepared import PreparedWeights

is_compiling: Callable[[], bool] = torch.compiler.is_compiling
NAMESPACE = "dsv4hal"

_weights: weakref.WeakValueDictionary[int, PreparedWeights] = weakref.WeakValueDictionary()
_weight_handles = itertools.count(1)


def remember_weights(prepared: PreparedWeights) -> None:
    """Give prepared weights a handle and the tuple of their payload's tensors: the compiled op with weights passes
    both (the object itself cannot be a custom op argument)."""
    payload = prepared.payload
    fields = dataclasses.fields(payload) if dataclasses.is_dataclass(payload) else ()
    names = tuple(f.name for f in fields if isinstance(getattr(payload, f.name), torch.Tensor))
    handle = next(_weight_handles)
    object.__setattr__(prepared, "_handle", handle)  # frozen dataclass: set once, here
    object.__setattr__(prepared, "_tensors", tuple(getattr(payload, n) for n in names))
    object.__setattr__(prepared, "_tensor_fields", names)
    _weights[handle] = prepared


# ---------------------------------------------------------------- one argument across the custom op boundary

def _optional(hint: Any) -> tuple[Any, bool]:
    """(T, True) for T | None, else (hint, False)."""
    args = typing.get_args(hint)
    if type(None) in args and typing.get_origin(hint) in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1:
            return rest[0], True
    return hint, False


def _flat_type(hint: Any, where: str) -> Any:
    """The custom op's annotation for a tensor, scalar or string argument."""
    inner, optional = _optional(hint)
    if typing.get_origin(inner) is typing.Literal and all(isinstance(v, str) for v in typing.get_args(inner)):
        inner = str
    if inner in (int, float, bool):
        inner = Number
    if inner not in (torch.Tensor, Number, str):
        raise TypeError(f"{where}: type {hint!r} cannot pass through a torch custom op (a tensor, an int, float, bool "
                        "or str, a dataclass of those, or PreparedWeights)")
    return inner | None if optional else inner


class _Same:
    """A tensor, scalar or string: itself."""

    def __init__(self, name: str, hint: Any, where: str) -> None:
        self.fields = ((name, _flat_type(hint, where)),)

    def flat(self, value: Any) -> tuple:
        return (value,)

    def build(self, parts: Sequence[Any], eager: bool) -> Any:
        return parts[0]


class _Record:
    """A dataclass (a cache, the attention metadata): its init fields, or the list of them when all are tensors."""

    def __init__(self, name: str, cls: type, optional: bool, where: str) -> None:
        hints = typing.get_type_hints(cls)
        self.cls, self.optional = cls, optional
        self.names = tuple(f.name for f in dataclasses.fields(cls) if f.init)
        self.listed = all(hints[f] is torch.Tensor for f in self.names)
        if self.listed:
            self.fields: tuple[tuple[str, Any], ...] = (
                (name, list[torch.Tensor] | None if optional else list[torch.Tensor]),)
            return
        flat = [_flat_type(hints[f], f"{where}.{f}") for f in self.names]
        stem = name.removesuffix("cache").removesuffix("_")
        self.fields = tuple((name if i == 0 else f"{stem}_{f}" if stem else f, t | None if optional else t)
                            for i, (f, t) in enumerate(zip(self.names, flat)))

    def flat(self, value: Any) -> tuple:
        if value is None:
            return (None,) * len(self.fields)
        parts = [getattr(value, f) for f in self.names]
        return (parts,) if self.listed else tuple(parts)

    def build(self, parts: Sequence[Any], eager: bool) -> Any:
        if self.optional and parts[0] is None:
            return None
        return self.cls(*parts[0]) if self.listed else self.cls(*parts)


class _Weights:
    """PreparedWeights: the payload's tensors and the object's handle."""

    def __init__(self, name: str) -> None:
        self.fields = ((f"{name.removesuffix('s')}_tensors", list[torch.Tensor]), (name, int))

    def flat(self, value: Any) -> tuple:
        return list(value._tensors), value._handle

    def build(self, parts: Sequence[Any], eager: bool) -> Any:
        tensors, handle = parts
        prepared = _weights.get(handle)
        if prepared is None:
            raise Dsv4HalError(f"the prepared weights this graph was compiled with (handle {handle}) no longer exist",
                               remedy="keep the PreparedWeights alive as long as functions compiled with them run")
        return _passed(prepared, handle, tensors, self.fields[0][0]) if eager else prepared


def _passed(prepared: PreparedWeights, handle: int, tensors: Sequence[torch.Tensor], name: str) -> PreparedWeights:
    """The weights the op runs: the handle's, with the tensors the call passed. Tensors of other weights (other
    count, shapes, dtypes or devices) are refused; copies of the handle's (torch.library.opcheck passes copies, CUDA
    graph trees copy inputs into static buffers) are what the call computes with."""
    own = prepared._tensors  # type: ignore[attr-defined]
    if len(tensors) != len(own) or any(a.shape != b.shape or a.dtype != b.dtype or a.device != b.device
                                       for a, b in zip(tensors, own)):
        got = ", ".join(describe(t) for t in tensors) or "none"
        raise InvalidArgumentError(prepared.op, name, f"the {len(own)} tensors of the prepared weights with handle "
                                   f"{handle}", got,
                                   remedy="pass the tensors and the handle custom_ops.flatten gives for the weights")
    if all(a.data_ptr() == b.data_ptr() for a, b in zip(tensors, own)):
        return prepared
    fields = prepared._tensor_fields  # type: ignore[attr-defined]
    payload = dataclasses.replace(prepared.payload, **dict(zip(fields, tensors)))
    return dataclasses.replace(prepared, payload=payload)


def _part(name: str, hint: Any, where: str) -> _Same | _Record | _Weights:
    inner, optional = _optional(hint)
    if inner is PreparedWeights:
        return _Weights(name)
    if isinstance(inner, type) and dataclasses.is_dataclass(inner):
        return _Record(name, inner, optional, where)
    return _Same(name, hint, where)


# ---------------------------------------------------------------- outputs

class _Outputs:
    """The op's return value as the custom op returns it: None, a tensor, a tuple of tensors (an output that may be
    None travels as an empty stand-in) or, for a dataclass, the list of its tensors."""

    def __init__(self, hint: Any, none_outputs: Mapping[int, str], params: tuple[str, ...], where: str) -> None:
        self.record: type | None = None
        self.none_when = {i: params.index(arg) for i, arg in none_outputs.items()}
        if hint is None or hint is type(None):
            self.annotation: Any = None
        elif isinstance(hint, type) and dataclasses.is_dataclass(hint):
            self.record = hint  # its tensors, as a list (as a dataclass of tensors passed in)
            self.annotation = list[torch.Tensor]
        elif typing.get_origin(hint) is tuple:
            self.annotation = tuple.__class_getitem__((torch.Tensor,) * len(typing.get_args(hint)))
        elif hint is torch.Tensor:
            self.annotation = torch.Tensor
        else:
            raise TypeError(f"{where}: return type {hint!r} cannot pass through a torch custom op")

    def to_flat(self, out: Any) -> Any:
        """The eager body's (and the fake's) outputs, contiguous: a kernel may return a strided view (DeepGEMM's
        logits are a view of a 256-aligned buffer), and compiled code reads outputs with the fake's strides (Inductor
        asserts them). A copy only under torch.compile, only for such an output; eager calls are untouched."""
        if self.annotation is None:
            return None
        if isinstance(out, torch.Tensor):
            return out.contiguous()
        if self.record is not None:  # astuple would copy
            return [getattr(out, f.name).contiguous() for f in dataclasses.fields(out) if f.init]
        stand_in = next(t for t in out if t is not None)
        return tuple(stand_in.new_empty(0) if t is None else t.contiguous() for t in out)

    def result(self, out: Any, values: Sequence[Any]) -> Any:
        """The op's return value from the custom op's (while Dynamo traces)."""
        if self.record is not None:
            return self.record(*out)
        if self.none_when:
            return tuple(None if self.none_when.get(i) is not None and values[self.none_when[i]] is None else o
                         for i, o in enumerate(out))
        return out


# ---------------------------------------------------------------- an op's custom op (and its out variant)

class _Variant:
    """One custom op of an op: the parameters it takes (all of them, or all but the output argument), their flat
    fields, what it writes in place and what it returns."""

    def __init__(self, d: OpDefinition[..., Any], hints: Mapping[str, Any], positions: tuple[int, ...],
                 mutates: tuple[str, ...], outputs: _Outputs, suffix: str) -> None:
        self.definition, self.positions, self.outputs, self.suffix = d, positions, outputs, suffix
        self.parts = tuple(_part(d.params[i], hints[d.params[i]], f"op {d.name}, argument {d.params[i]}")
                           for i in positions)
        self.names = tuple(n for p in self.parts for n, _ in p.fields)
        self.mutates = tuple(n for p, i in zip(self.parts, positions) if d.params[i] in mutates
                             for n, t in p.fields if _optional(t)[0] in (torch.Tensor, list[torch.Tensor]))
        self.signature = inspect.Signature(
            [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=t)
             for p in self.parts for n, t in p.fields], return_annotation=outputs.annotation)

    def flat(self, values: Sequence[Any]) -> tuple:
        out: list[Any] = []
        for i, part in zip(self.positions, self.parts):
            out.extend(part.flat(values[i]))
        return tuple(out)

    def rebuild(self, flat: Sequence[Any], eager: bool) -> list[Any]:
        """The op's arguments (all of them, positionally) from the custom op's."""
        values: list[Any] = [None] * len(self.definition.params)
        at = 0
        for i, part in zip(self.positions, self.parts):
            n = len(part.fields)
            values[i] = part.build(flat[at:at + n], eager)
            at += n
        return values

    def register(self, name: str, find: Callable[[Sequence[Any]], Callable[..., Any]], handle: bool) -> None:
        """Register the custom op `name`: its eager body calls find(flat arguments), the bound op to run; with
        `handle`, its schema ends with the platform's int handle (the direct-call entry)."""
        qualified = f"{NAMESPACE}::{name}{self.suffix}"
        outputs, rebuild = self.outputs, self.rebuild
        names = (*self.names, "platform") if handle else self.names
        params = [inspect.Parameter("platform", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=int)]

        def eager(*flat: Any) -> Any:
            return outputs.to_flat(find(flat)(*rebuild(flat, True)))  # rebuild reads only the op's own arguments

        eager.__signature__ = self.signature.replace(  # type: ignore[attr-defined]  # what the schema is inferred from
            parameters=[*self.signature.parameters.values(), *(params if handle else ())])
        op = torch.library.custom_op(qualified, eager, mutates_args=self.mutates)
        declared = self.definition.fake if outputs.annotation is not None else None

        def fake(*flat: Any) -> Any:
            # A meta tensor among a custom op's arguments sends the call here, which computes nothing. Outside
            # fake-tensor tracing (no fake mode active) it is the caller's, refused as eager refuses it.
            if torch._guards.detect_fake_mode() is None:
                listed = [(f"{names[i]}[{j}]", t) for i, a in enumerate(flat) if isinstance(a, (list, tuple))
                          for j, t in enumerate(a)]
                check_materializable(qualified, [*flat, *(t for _, t in listed)], {},
                                     [*names, *(n for n, _ in listed)])
            return None if declared is None else outputs.to_flat(declared(*rebuild(flat, False)))

        op.register_fake(fake)


class Plan:
    """An op's custom op(s), derived once from its definition."""

    def __init__(self, d: OpDefinition[..., Any]) -> None:
        hints = d.type_hints()
        where = f"op {d.name}"
        ret = hints.get("return")
        outputs = _Outputs(ret, d.none_outputs, d.params, where)
        if outputs.annotation is not None and d.fake is None:
            raise TypeError(f"{where} returns {ret!r}: define it with fake= (its outputs' shapes and dtypes)")
        self.params = d.params
        self.defaults = {n: p.default for n, p in d.signature.parameters.items()
                         if p.default is not inspect.Parameter.empty}
        # an optional argument of the return type is an output argument: a second custom op writes into it
        self.out = next((i for i, n in enumerate(d.params) if outputs.record is not None
                         and _optional(hints[n]) == (outputs.record, True)), -1)
        everything = tuple(range(len(d.params)))
        self.main = _Variant(d, hints, tuple(i for i in everything if i != self.out), d.mutates, outputs, "")
        given = {**hints, d.params[self.out]: outputs.record}  # the output argument, given
        self.into = None if self.out < 0 else _Variant(
            d, given, everything, (*d.mutates, d.params[self.out]), _Outputs(None, {}, d.params, where), "_out")
        self._registered: set[str] = set()

    def values(self, args: tuple, kwargs: Mapping[str, Any]) -> list[Any]:
        """Every argument of a call, positionally, defaults filled in (the call has been checked to bind)."""
        rest = self.params[len(args):]
        return [*args, *[kwargs[n] if n in kwargs else self.defaults[n] for n in rest]]

    def variant(self, values: Sequence[Any]) -> _Variant:
        return self.main if self.into is None or values[self.out] is None else self.into  # type: ignore[return-value]

    def register(self, name: str, find: Callable[[Sequence[Any]], Callable[..., Any]], handle: bool = False) -> None:
        if name not in self._registered:
            for v in (self.main, self.into):
                if v is not None:
                    v.register(name, find, handle)
            self._registered.add(name)


@functools.cache
def plan_of(d: OpDefinition[..., Any]) -> Plan:
    return Plan(d)


def custom_op_name(bound: Any) -> str:
    """The name, in torch.ops.dsv4hal, of the custom op of a bound op (platform.ops.<op>)."""
    return f"{bound.definition.name}_p{bound.platform.handle}"


def _bound_finder(bound: Any) -> Callable[[Sequence[Any]], Callable[..., Any]]:
    """The eager body's bound op, held weakly: a graph that outlives its platform raises a typed error."""
    ref, op = weakref.ref(bound), bound.definition.name

    def find(flat: Sequence[Any]) -> Callable[..., Any]:
        fn = ref()
        if fn is None:
            raise Dsv4HalError(f"{op}: the platform this graph was compiled for no longer exists",
                               remedy="keep the Platform alive as long as functions compiled with its ops run")
        return fn

    return find


def custom_op(bound: Any, suffix: str = "") -> Any:
    """The custom op (an OpOverloadPacket) of a bound op, registered if it was not; suffix "_out": the variant
    that writes into the op's output argument."""
    name = custom_op_name(bound)
    plan_of(bound.definition).register(name, _bound_finder(bound))
    return getattr(torch.ops.dsv4hal, name + suffix)


def flatten(bound: Any, *args: Any, direct: bool = False, **kwargs: Any) -> tuple[Any, tuple[Any, ...]]:
    """The custom op and its flattened arguments for a call bound(*args, **kwargs) of a bound op (for
    torch.library.opcheck and tests); `direct`: the direct-call entry's op, the platform's handle last."""
    plan = plan_of(bound.definition)
    values = plan.values(args, kwargs)
    variant = plan.variant(values)
    if direct:
        op = getattr(torch.ops.dsv4hal, bound.definition.name + variant.suffix)
        return op, (*variant.flat(values), bound.platform.handle)
    return custom_op(bound, variant.suffix), variant.flat(values)


def traced(bound: Any) -> Callable[..., Any]:
    """What the bound op calls while Dynamo traces, with the op's own arguments: with the platform's `validate`,
    the arguments are validated first (unchecked: values are not known while tracing), then the bound op's custom
    op runs on them flattened. Given an op's name instead: the same, called as (platform handle, the op's
    arguments), the platform found as the direct-call entry finds it."""
    if isinstance(bound, str):
        find = _direct_finder(bound)
        return lambda handle, *args, **kwargs: traced(find((handle,)))(*args, **kwargs)
    plan, name = plan_of(bound.definition), custom_op_name(bound)
    validate = validator(bound.definition) if bound.platform.validate else None
    find = _bound_finder(bound)

    @run_not_traced
    def register() -> bool:  # run, not traced: registering a custom op is no part of the graph
        plan.register(name, find)
        return True

    def call(*args: Any, **kwargs: Any) -> Any:
        if validate is not None:
            validate(args, kwargs)
        register()
        values = plan.values(args, kwargs)
        variant = plan.variant(values)
        out = getattr(torch.ops.dsv4hal, name + variant.suffix)(*variant.flat(values))
        return variant.outputs.result(out, values) if variant is plan.main else values[plan.out]

    call.__name__ = f"traced_{bound.definition.name}"
    return call


# ---------------------------------------------------------------- the direct-call entry
# torch.ops.dsv4hal.<op>(<flat arguments>..., platform handle), for callers of the torch op itself. Only this entry
# reads DIRECT_CALL_PLATFORMS, the live platforms by handle (held weakly: a platform leaves it when freed); the
# compiled path of platform.ops holds its own bound op instead.
DIRECT_CALL_PLATFORMS: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()


def _direct_finder(op: str) -> Callable[[Sequence[Any]], Callable[..., Any]]:
    """The bound op of the platform whose handle is the last flat argument."""
    def find(flat: Sequence[Any]) -> Callable[..., Any]:
        handle = flat[-1]
        platform = DIRECT_CALL_PLATFORMS.get(handle) if type(handle) is int else None
        if platform is None:
            raise Dsv4HalError(f"torch.ops.dsv4hal.{op}: no live platform has handle {handle!r} (the last argument)",
                               remedy="pass the `handle` of a Platform that is still referenced "
                                      "(dsv4hal.select_platform().handle)")
        return platform.ops[op]

    return find


def enroll(platform: Any, bound_ops: Iterable[Any]) -> None:
    """Make a platform reachable by its handle through the direct-call entry, and register the entry's custom op
    `torch.ops.dsv4hal.<op>` (and `<op>_out`) of each of its ops that has none yet (the first definition of a name
    keeps it)."""
    DIRECT_CALL_PLATFORMS[platform.handle] = platform
    for bound in bound_ops:
        d = bound.definition
        if _direct_ops.setdefault(d.name, d) is d:
            plan_of(d).register(d.name, _direct_finder(d.name), handle=True)


_direct_ops: dict[str, OpDefinition[..., Any]] = {}
