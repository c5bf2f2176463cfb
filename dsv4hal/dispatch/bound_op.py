"""BoundOp: one op of a Platform. A call validates its arguments, then asks the op's Dispatcher for the kernel of its
case; `plan` does both once and hands back the kernel itself, for hot loops and graph capture."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar

from dsv4hal.dispatch.dispatcher import Dispatcher
from dsv4hal.errors import Dsv4HalError, UnsupportedCaseError
from dsv4hal.ops.catalog import OpSpec
from dsv4hal.prepared import PreparedWeights
from dsv4hal.selection import Decision

if TYPE_CHECKING:
    from dsv4hal.dispatch.fast_path import FastPath
    from dsv4hal.platform import Platform

P = ParamSpec("P")
R = TypeVar("R")


class BoundOp(Generic[P, R]):
    """One op of a Platform, typed as its definition (dsv4hal/ops/<module>.py): inspect.signature and
    typing.get_type_hints show the op's real parameters. Calling it validates the arguments (cheap checks, no
    device sync unless the platform is in checked mode), finds the case, and calls the kernel the dispatcher chose
    for it. Under torch.compile it calls the torch custom op dsv4hal::<op> instead (dsv4hal.custom_ops), one
    opaque node whose eager implementation is this same call."""

    def __init__(self, platform: Platform, spec: OpSpec) -> None:
        self.platform, self.spec = platform, spec
        d = spec.definition()
        self.definition = d
        self._validate: Callable[..., Any] = d.validate
        self._case: Callable[..., Mapping[str, object]] = d.case
        self._params = d.params  # to name positional arguments
        # the typed facade: what inspect, typing and help() read
        self.__signature__ = d.resolved_signature()
        self.__annotations__ = dict(d.type_hints())
        self.__doc__ = f"{spec.summary}\n\n{d.__doc__ or ''}"
        self.__name__ = self.__qualname__ = spec.name
        # torch-dependent parts, imported when ops are bound (import dsv4hal.platform stays free of torch)
        from dsv4hal import custom_ops
        from dsv4hal.checks import check_materializable
        from dsv4hal.dispatch.fast_path import FastPath

        self._materializable = check_materializable
        self._compiling: Callable[[], bool] = custom_ops.is_compiling
        # what a call runs while Dynamo traces: the op's custom op
        self._traced: Callable[..., Any] = custom_ops.traced(self)
        self.dispatcher = Dispatcher(platform, d)
        # validated argument metadata -> kernel; none in checked mode or for an op whose validation reads values
        self._fast: FastPath | None = FastPath() if d.memo and not platform.checked else None

    @property
    def name(self) -> str:
        return self.spec.name

    def decide(self, case: Mapping[str, object] | None = None) -> Decision:
        decision = self.dispatcher.choose(dict(self.spec.default_case if case is None else case)).decision
        assert decision is not None  # choose() always selects
        return decision

    def bind_check(self) -> Decision:
        """The default case's decision, or the first alternate case's when a forced kernel cannot run the
        default one (raises the default case's error when none resolves)."""
        try:
            return self.decide()
        except UnsupportedCaseError as first:
            for alt in self.spec.alternate_cases:
                try:
                    return self.decide(alt)
                except UnsupportedCaseError:
                    continue
            raise first

    def kernel(self, case: Mapping[str, object]) -> Callable[..., Any]:
        """The kernel callable for a case class (its Choice's kernel), for callers that hoist dispatch out of a hot
        loop; `plan` does the same from example arguments, validating them."""
        return self.dispatcher.choose(case).kernel

    def case_of(self, *args: P.args, **kwargs: P.kwargs) -> Mapping[str, object]:
        return self._case(*args, **kwargs)

    def plan(self, *args: P.args, **kwargs: P.kwargs) -> Callable[P, R]:
        """Validate these arguments once (also on a platform selected with validate=False) and return the kernel a
        call with them runs (the same object): calling it skips validation and dispatch. Use it in a hot loop or a
        CUDA graph capture whose arguments keep these shapes, dtypes and devices. In checked mode the values (index
        ranges, finiteness) are checked here, at plan time only: later calls of the plan are not checked. Under
        torch.compile call the op itself instead (its custom op)."""
        self._validate_call(args, kwargs, self.platform.checked)
        return self._kernel_for(args, kwargs)

    def prepare_weights(self, weights: Any, *, tokens: int | None = None) -> PreparedWeights:
        """Only an op with weights (dsv4hal.dispatch.weighted_op) prepares them."""
        raise Dsv4HalError(f"op {self.name} has no weights to prepare")

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        # The hot path of every op: the common cases come first and read as few attributes as they can.
        if self._compiling():  # Dynamo is tracing: one opaque custom op (its eager body comes back here)
            return self._traced(*args, **kwargs)
        p = self.platform
        if p.validate:
            fast = self._fast
            if fast is not None:
                kernel = fast.find(args, kwargs)
                if kernel is None:  # first call with this metadata: validate and choose, then remember the kernel
                    self._validate_call(args, kwargs, False)
                    kernel = self._kernel_for(args, kwargs)
                    fast.remember(args, kwargs, kernel)
                return kernel(*args, **kwargs)
            self._validate_call(args, kwargs, p.checked)
        return self._kernel_for(args, kwargs)(*args, **kwargs)

    def _validate_call(self, args: tuple, kwargs: dict[str, Any], checked: bool) -> None:
        """Validate a call (raising the typed error of its first bad argument)."""
        self._materializable(self.name, args, kwargs, self._params)  # expand views too large to copy
        try:
            self._validate(*args, **kwargs, checked=checked)
        except TypeError:
            self.definition.check_call(args, kwargs)  # arguments the signature does not take: typed
            raise

    def _kernel_for(self, args: tuple, kwargs: dict[str, Any]) -> Callable[..., Any]:
        """The kernel a call with these (valid) arguments runs: its case's Choice."""
        return self.dispatcher.choose_for_call(args, kwargs).kernel

    def __repr__(self) -> str:
        return f"<dsv4hal op {self.spec.name} on {self.platform.name}>"
