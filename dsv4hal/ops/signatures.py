"""One typed definition per op. Each contract module (dsv4hal/ops/<module>.py) defines its ops with `define`:

    @define(validate=validate_pack_store, case=case_pack_store)
    def pack_store(k: torch.Tensor, loc: torch.Tensor, cache: V4PagedCache) -> None:
        '''Arguments / Returns / Rejected (the op's one docstring).'''

The decorated function is only a signature: its parameters, types, defaults, return type and docstring are what
`platform.ops.<op>` shows (inspect.signature, typing.get_type_hints, IDEs), and what the op's torch custom op is
derived from (dsv4hal.custom_ops: schema, flattening, rebuilding). What the types cannot say is declared here too:
`fake` (the output shapes and dtypes under torch.compile), `mutates` (the arguments written in place) and
`none_outputs` (outputs that are None when an argument is). `define` checks at import that the validate, case and
fake functions take exactly those parameters, so they cannot drift apart. The catalog (dsv4hal.ops.catalog) finds a
definition by the op's name in its module.

This module imports nothing heavy: the catalog and `import dsv4hal.platform` stay free of torch."""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Mapping
from typing import Any, Generic, ParamSpec, TypeVar

from dsv4hal.errors import BadCallError

P = ParamSpec("P")
R = TypeVar("R")


class OpDefinition(Generic[P, R]):
    """An op's typed signature and docstring with its contract functions (validate, case, and for an op with
    weights the weights' validate and case, which decide the kernel when the weights are prepared)."""

    def __init__(self, signature_fn: Callable[P, R], validate: Callable[..., Any],
                 case: Callable[..., Mapping[str, object]], weights_arg: str | None = None,
                 weights_validate: Callable[..., Any] | None = None,
                 weights_case: Callable[..., Mapping[str, object]] | None = None, memo: bool = True,
                 key: Callable[..., tuple] | None = None, fake: Callable[..., Any] | None = None,
                 mutates: tuple[str, ...] = (), none_outputs: Mapping[int, str] | None = None) -> None:
        self.name: str = signature_fn.__name__
        self.signature_fn = signature_fn
        self.signature = inspect.signature(signature_fn)
        self.params: tuple[str, ...] = tuple(self.signature.parameters)
        self.validate, self.case = validate, case
        self.weights_arg, self.weights_validate, self.weights_case = weights_arg, weights_validate, weights_case
        # unchecked validation and case read only host metadata, so a bound call may skip them for arguments whose
        # metadata passed before (dsv4hal.dispatch.fast_path); False for an op whose unchecked validation reads values
        self.memo = memo
        # optional: a flat tuple of everything `case` reads, from which `case` is computed; a bound call without
        # validation finds its kernel by it instead of building the case (host time: see dsv4hal.dispatch.bound_op)
        self.key = key
        # under torch.compile (dsv4hal.custom_ops): the outputs' shapes and dtypes from the arguments (tensors
        # without data), the arguments written in place, and {output index: argument} for an output that is None
        # exactly when that argument is None
        self.fake, self.mutates = fake, tuple(mutates)
        self.none_outputs: Mapping[int, str] = dict(none_outputs or {})
        self.__doc__ = signature_fn.__doc__
        self._hints: dict[str, Any] | None = None
        self._check()

    def _check(self) -> None:
        """A contract function whose parameters differ from the signature would validate one call and select for
        another: refuse that at import, when the op is defined."""
        want = list(self.params)
        fns = [("validate", self.validate, ("checked",)), ("case", self.case, ())]
        fns += [(what, fn, ()) for what, fn in (("key", self.key), ("fake", self.fake)) if fn is not None]
        for what, fn, drop in fns:
            got = [p for p in inspect.signature(fn).parameters if p not in drop]
            if got != want:
                raise TypeError(f"op {self.name}: {what} function {fn.__name__} takes {got}, the definition {want}")
        named = [("weights argument", self.weights_arg)] if self.weights_arg is not None else []
        named += [("mutated argument", a) for a in self.mutates]
        named += [("none_outputs argument", a) for a in self.none_outputs.values()]
        for what, arg in named:
            if arg not in want:
                raise TypeError(f"op {self.name}: {what} {arg!r} is not a parameter")

    def check_call(self, args: tuple, kwargs: Mapping[str, object]) -> None:
        """Raise BadCallError when `args` and `kwargs` do not fit the op's signature (called after a TypeError, so
        a call that fits costs nothing)."""
        if "checked" in kwargs and "checked" not in self.params:
            raise BadCallError(f"{self.name}: 'checked' is not an argument of the op; checked mode belongs to the "
                               "platform",
                               remedy="select the platform with dsv4hal.select_platform(checked=True)") from None
        try:
            self.signature.bind(*args, **kwargs)
        except TypeError as e:
            plain = self.signature.replace(parameters=[p.replace(annotation=inspect.Parameter.empty)
                                                       for p in self.signature.parameters.values()],
                                           return_annotation=inspect.Signature.empty)
            raise BadCallError(f"{self.name}{plain}: {e}",
                               remedy=f"call platform.ops.{self.name} with the arguments of this signature") from None

    def type_hints(self) -> dict[str, Any]:
        """The resolved annotations (real types, not strings), computed once."""
        if self._hints is None:
            self._hints = typing.get_type_hints(self.signature_fn)
        return self._hints

    def resolved_signature(self) -> inspect.Signature:
        """The signature with real types in place of the annotation strings (what help() and IDEs show)."""
        hints = self.type_hints()
        params = [p.replace(annotation=hints.get(p.name, p.annotation)) for p in self.signature.parameters.values()]
        ret = hints.get("return", inspect.Signature.empty)
        return self.signature.replace(parameters=params, return_annotation=None if ret is type(None) else ret)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        raise BadCallError(f"{self.name} is an op definition, not an op",
                           remedy=f"call the op bound to a platform: dsv4hal.select_platform().ops.{self.name}(...)")

    def __repr__(self) -> str:
        return f"<dsv4hal op definition {self.name}{self.signature}>"


def define(*, validate: Callable[..., Any], case: Callable[..., Mapping[str, object]],
           weights: tuple[str, Callable[..., Any], Callable[..., Mapping[str, object]]] | None = None,
           memo: bool = True, key: Callable[..., tuple] | None = None, fake: Callable[..., Any] | None = None,
           mutates: tuple[str, ...] = (), none_outputs: Mapping[int, str] | None = None
           ) -> Callable[[Callable[P, R]], OpDefinition[P, R]]:
    """Decorate an op's typed signature (its body is never run). `weights`: (argument, validate, case) of the
    weights of an op that is decided when its weights are prepared. `memo=False` for an op whose unchecked
    validation reads tensor values (dsv4hal.dispatch.fast_path). `key`: a hashable tuple of what `case` reads,
    which `case` is computed from (so equal keys give equal cases), for an op whose unvalidated host time matters. Under
    torch.compile: `fake(<the op's parameters>)` returns outputs of the op's shapes and dtypes (new_empty of the
    arguments; None where the op returns None), needed unless the op returns None; `mutates` names the arguments
    the op writes in place; `none_outputs` maps an output's index to the argument whose None makes it None."""
    def wrap(fn: Callable[P, R]) -> OpDefinition[P, R]:
        w = weights or (None, None, None)
        return OpDefinition(fn, validate, case, *w, memo=memo, key=key, fake=fake, mutates=mutates,
                            none_outputs=none_outputs)
    return wrap
