"""WeightedOp: a bound op with prepared weights (moe_experts). Kernel choice fixes the weight layout, so the kernel
is chosen when the weights are prepared (prepare_weights) and every call runs that implementation, on the weights'
payload, or is refused with a typed error."""

from __future__ import annotations

import logging
import operator
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from dsv4hal.dispatch.bound_op import BoundOp
from dsv4hal.dispatch.dispatcher import Choice
from dsv4hal.errors import (
    Dsv4HalError,
    InvalidArgumentError,
    PluginFaultError,
    PreparedWeightsMismatchError,
    UnsupportedCaseError,
    format_reasons,
)
from dsv4hal.ops.catalog import OpSpec
from dsv4hal.plugins import load_target
from dsv4hal.prepared import PreparedWeights
from dsv4hal.selection import case_summary, kernel_reasons, select_kernel

if TYPE_CHECKING:
    from dsv4hal.platform import Platform

log = logging.getLogger(__name__)
P = ParamSpec("P")
R = TypeVar("R")


class WeightedOp(BoundOp[P, R]):
    """An op whose kernel is chosen by its weights: prepare_weights chooses and lays them out once; a call runs
    the implementation they were prepared for (the dispatcher's fixed Choice), never another one."""

    def __init__(self, platform: Platform, spec: OpSpec) -> None:
        super().__init__(platform, spec)
        d = self.definition
        assert d.weights_arg is not None and d.weights_validate is not None and d.weights_case is not None
        self._weights_arg: str = d.weights_arg
        self._weights_pos = self._params.index(d.weights_arg)
        self._validate_weights: Callable[..., Any] = d.weights_validate
        self._weights_case: Callable[..., Mapping[str, object]] = d.weights_case

    def kernel(self, case: Mapping[str, object]) -> Callable[..., Any]:
        raise Dsv4HalError(f"{self.name} runs the kernel its weights were prepared for; call the bound op",
                           remedy=f"platform.ops.{self.name}(..., prepared_weights), or "
                                  f"platform.ops.{self.name}.plan(..., prepared_weights)")

    def prepare_weights(self, weights: Any, *, tokens: int | None = None) -> PreparedWeights:
        """Choose this op's kernel for these weights and lay them out for it, once, before serving.

        tokens: how many tokens a call is expected to carry (a decode server's batch, a prefill server's chunk).
        Its class joins the case that picks the kernel, and so the layout, which every later call then uses
        whatever its size (e.g. moe_experts on the H200: the portable fused MoE up to 64 tokens, triton_kernels
        above).
        None: the op's default class (one token a call)."""
        if tokens is not None:
            try:  # any integer (a numpy or torch scalar too), never a bool or a float
                count = -1 if isinstance(tokens, bool) else operator.index(tokens)
            except TypeError:
                count = -1
            if count < 1:
                raise InvalidArgumentError(self.name, "tokens", "an integer >= 1 (or None: one token a call)",
                                           repr(tokens))
            tokens = count
        self._validate_weights(weights, checked=self.platform.checked)
        case = dict(self._weights_case(weights, tokens))
        p = self.platform
        while True:  # as the dispatcher: a kernel whose functions do not import is refused from then on
            impl = select_kernel(p.registry, self.name, case, p.info, p.name, p.overrides, p.lock).chosen
            prepare = load_target(p.registry, impl, "prepare") if impl.prepare else _unchanged
            if prepare is not None and load_target(p.registry, impl) is not None:
                break
        log.info("%s on %s: weights prepared for %s for [%s]", self.name, p.name, impl.name, case_summary(case))
        prepared = PreparedWeights(self.name, impl.name, impl.layout, p.name, case, prepare(weights))
        self._remember_weights(prepared)
        return prepared

    @staticmethod
    def _remember_weights(prepared: PreparedWeights) -> None:
        """Give the weights a handle for the compiled path (dsv4hal.custom_ops)."""
        from dsv4hal import custom_ops

        custom_ops.remember_weights(prepared)

    def _kernel_for(self, args: tuple, kwargs: dict[str, Any]) -> Callable[..., Any]:
        """The kernel of the implementation the weights were prepared for, on their payload, if it runs this
        call's case on this platform (raises otherwise)."""
        name = self._weights_arg
        prepared = kwargs[name] if name in kwargs else args[self._weights_pos]
        p = self.platform
        if not isinstance(prepared, PreparedWeights) or prepared.op != self.name:
            self._validate(*args, **kwargs, checked=False)  # raises the typed error for unprepared weights
        forced = p.overrides.kernels.get(self.name)
        if prepared.platform != p.name or (forced is not None and forced != prepared.implementation):
            why = f"platform {p.name}" if prepared.platform != p.name else f"the forced implementation {forced}"
            raise PreparedWeightsMismatchError(
                f"{self.name}: {prepared.describe()}, but this call would run {why}",
                remedy="prepare the weights again with this platform's prepare_weights (kernel choice fixes the "
                       "layout), or drop the override")
        case = self._case(*args, **kwargs)
        return self.dispatcher.choose_fixed(prepared.implementation, case,
                                            lambda c: self._resolve_prepared(prepared, c)).kernel

    def _resolve_prepared(self, prepared: PreparedWeights, case: Mapping[str, object]) -> Choice:
        """The prepared implementation's Choice for a case it can run here; typed errors otherwise."""
        p = self.platform
        impl = p.registry.kernels.get(self.name, {}).get(prepared.implementation)
        if impl is None:
            raise PreparedWeightsMismatchError(
                f"{self.name}: {prepared.describe()}, but platform {p.name} has no implementation named "
                f"{prepared.implementation!r}", remedy="prepare the weights with this platform's prepare_weights")
        reasons = kernel_reasons(impl, case, p.info, p.name, p.overrides)
        if reasons:
            raise UnsupportedCaseError(
                f"{self.name}: {prepared.describe()}; that implementation cannot run case "
                f"[{case_summary(case)}]:\n" + format_reasons({impl.name: reasons}),
                remedy="prepare the weights for a kernel that takes this case (force one with overrides)")
        fn = load_target(p.registry, impl)
        if fn is None:
            raise PluginFaultError(f"{self.name}: {prepared.describe()}, but that kernel does not load: "
                                   f"{p.registry.kernels[self.name][impl.name].fault}",
                                   remedy="prepare the weights again: another kernel will be chosen")
        return Choice(impl, self._on_payload(fn), None)

    def _on_payload(self, kernel: Callable[..., Any]) -> Callable[..., Any]:
        """kernel, called with the PreparedWeights replaced by its payload (what the kernel takes)."""
        name, pos = self._weights_arg, self._weights_pos

        def on_payload(*args: Any, **kwargs: Any) -> Any:
            if name in kwargs:
                return kernel(*args, **{**kwargs, name: kwargs[name].payload})
            return kernel(*args[:pos], args[pos].payload, *args[pos + 1:], **kwargs)

        on_payload.__wrapped__ = kernel  # type: ignore[attr-defined]
        on_payload.__qualname__ = f"{getattr(kernel, '__qualname__', 'kernel')} on prepared payload"
        return on_payload


def _unchanged(weights: Any) -> Any:
    """The prepare step of a kernel that takes the logical weights as they are."""
    return weights
