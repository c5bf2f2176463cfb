"""select_platform() and the Platform it returns: ops bound to kernels at selection time, a choice
per case class decided once and cached, and every decision explainable."""

from __future__ import annotations

import itertools
import logging
import operator
import os
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar

from dsv4hal import hardware
from dsv4hal import override as ov
from dsv4hal.errors import (
    Dsv4HalError,
    InvalidArgumentError,
    PluginFaultError,
    PreparedWeightsMismatchError,
    UnknownOpError,
    UnsupportedCaseError,
    format_reasons,
)
from dsv4hal.hardware import PlatformInfo
from dsv4hal.lock import LockInForce, enforce
from dsv4hal.ops.catalog import OpSpec
from dsv4hal.plugins import build_registry, load_target
from dsv4hal.prepared import PreparedWeights
from dsv4hal.registry import PlatformSpec, Registry
from dsv4hal.selection import (
    Decision,
    PlatformDecision,
    case_summary,
    kernel_reasons,
    select_kernel,
    select_platform_spec,
)

if TYPE_CHECKING:  # the typed facade (Ops): a stub generated from the catalog (dsv4hal.ops.gen_stub)
    from dsv4hal.ops.typed_ops import TypedOps
    from dsv4hal.step import decode_step
else:
    TypedOps = object

log = logging.getLogger(__name__)
P = ParamSpec("P")
R = TypeVar("R")
# a platform's handle names its ops' custom ops under torch.compile (dsv4hal.custom_ops)
_handles = itertools.count(1)

_registries: dict[tuple[frozenset[str], bool], Registry] = {}
_registry_lock = threading.Lock()


def _registry_cached(disabled: frozenset[str], strict: bool) -> Registry:
    """Each plugin set is loaded once per process, even when many threads select a platform at once."""
    key = (disabled, strict)
    reg = _registries.get(key)
    if reg is None:
        with _registry_lock:
            reg = _registries.get(key)
            if reg is None:
                reg = _registries[key] = build_registry(disabled=disabled, strict=strict)
    return reg


_registry_cached.cache_clear = _registries.clear  # type: ignore[attr-defined]  # as functools.cache offered


def load_registry(overrides: ov.Overrides | None = None) -> Registry:
    o = overrides or ov.current()
    return _registry_cached(o.disabled_plugins, o.strict)


class BoundOp(Generic[P, R]):
    """One op of a Platform, typed as its definition (dsv4hal/ops/<module>.py): inspect.signature and
    typing.get_type_hints show the op's real parameters. Calling it validates the arguments (cheap checks, no
    device sync unless the platform is in checked mode), finds the case class, and calls the kernel chosen for it.
    Under torch.compile it calls its torch custom op (dsv4hal.custom_ops) instead, one opaque node
    whose eager implementation is this same call."""

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
        from dsv4hal import custom_ops  # torch: imported when ops are bound, not before
        from dsv4hal.checks import check_materializable

        self._materializable = check_materializable
        self._compiling: Callable[[], bool] = custom_ops.is_compiling
        self._traced = custom_ops.traced(self)
        self._by_case: dict[tuple, tuple[Decision, Callable[..., Any]]] = {}
        # the op's case key (OpDefinition.key) -> kernel: an unvalidated call's lookup, without building the case
        self._case_key: Callable[..., tuple] | None = d.key
        self._by_key: dict[tuple, Callable[..., Any]] = {}
        # validated argument metadata -> kernel (dsv4hal.ops.memo): a repeat call costs a key and a lookup
        from dsv4hal.ops import memo

        self._memo: dict[tuple, Callable[..., Any]] | None = {} if d.memo else None
        self._memo_key = memo.metadata_key
        self._split_key = memo.split_key
        self._checks = memo.TensorChecks()  # the same verdicts, found by a C++ check of the tensors first
        self._memo_max = memo.MAX_ENTRIES
        self._weights_pos = -1
        if d.weights_arg:
            self._weights_pos = self._params.index(d.weights_arg)
            self._validate_weights: Callable[..., Any] = d.weights_validate  # type: ignore[assignment]
            self._weights_case: Callable[..., Mapping[str, object]] = d.weights_case  # type: ignore[assignment]
            self._by_impl: dict[tuple, Callable[..., Any]] = {}

    @property
    def name(self) -> str:
        return self.spec.name

    def decide(self, case: Mapping[str, object] | None = None) -> Decision:
        return self._resolve(dict(self.spec.default_case if case is None else case))[0]

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
        """The kernel callable for a case class, for callers that hoist dispatch out of a hot loop."""
        if self._weights_pos >= 0:
            raise Dsv4HalError(f"{self.name} runs the kernel its weights were prepared for; call the bound op",
                               remedy=f"platform.ops.{self.name}(..., prepared_weights)")
        return self._resolve(case)[1]

    def case_of(self, *args: P.args, **kwargs: P.kwargs) -> Mapping[str, object]:
        return self._case(*args, **kwargs)

    def _resolve(self, case: Mapping[str, object]) -> tuple[Decision, Callable[..., Any]]:
        # A case function builds its dict in one key order, so the items in order are the key: no sort per call.
        # A mapping given to decide() in another order only makes a second entry for the same decision.
        key = tuple(case.items())
        hit = self._by_case.get(key)
        if hit is None:
            p = self.platform
            while True:  # a kernel whose target does not import is marked broken; select again without it
                d = select_kernel(p.registry, self.spec.name, case, p.info, p.name, p.overrides, p.lock)
                fn = load_target(p.registry, d.chosen)
                if fn is not None:
                    break
            log.debug("%s on %s: %s (%s) for [%s]", d.op, d.platform, d.chosen.name, d.source,
                      case_summary(d.case))
            hit = (d, fn)
            self._by_case[key] = hit
        return hit

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        # The hot path of every op: the common cases come first and read as few attributes as they can.
        if self._compiling():  # Dynamo is tracing: one opaque custom op (its eager body comes back here)
            return self._traced(*args, **kwargs)
        p = self.platform
        if p.validate:
            memo = self._memo
            if memo is not None and not p.checked:
                split = self._split_key(args, kwargs)
                if split is not None:
                    fn = self._checks.find(*split)
                    if fn is not None:
                        return fn(*args, **kwargs)
                key = self._memo_key(args, kwargs)
                if key is not None:
                    fn = memo.get(key)
                    if fn is None:  # first call with this metadata: validate and select, then remember the kernel
                        fn = self._validate_and_select(memo, key, args, kwargs)
                    if split is not None:
                        self._checks.add(*split, fn)
                    return fn(*args, **kwargs)
            self._materializable(self.name, args, kwargs, self._params)  # expand views too large to copy
            try:
                self._validate(*args, **kwargs, checked=p.checked)
            except TypeError:
                self.definition.check_call(args, kwargs)  # arguments the signature does not take: typed
                raise
        if self._weights_pos >= 0:
            return self._call_prepared(args, kwargs)
        case_key = self._case_key
        if case_key is not None:
            fn = self._by_key.get(case_key(*args, **kwargs))
            if fn is None:
                fn = self._keyed(args, kwargs)
            return fn(*args, **kwargs)
        case = self._case(*args, **kwargs)
        hit = self._by_case.get(tuple(case.items()))
        if hit is None:
            hit = self._resolve(case)
        return hit[1](*args, **kwargs)

    def _keyed(self, args: tuple, kwargs: dict[str, Any]) -> Callable[..., Any]:
        """A case-key miss: the case (computed from the same key) and its kernel, remembered by the key."""
        fn = self._resolve(self._case(*args, **kwargs))[1]
        if len(self._by_key) >= self._memo_max:
            self._by_key.clear()
        self._by_key[self._case_key(*args, **kwargs)] = fn  # type: ignore[misc]
        return fn

    def _validate_and_select(self, memo: dict[tuple, Callable[..., Any]], key: tuple, args: tuple,
                             kwargs: dict[str, Any]) -> Callable[..., Any]:
        """A memo miss: validate unchecked (raising for a bad argument, which is never remembered), select, and
        remember the kernel for this metadata (for an op with weights: the kernel they were prepared for, called
        on their payload; the key holds the weights' token, so equal metadata means the same kernel)."""
        self._materializable(self.name, args, kwargs, self._params)
        try:
            self._validate(*args, **kwargs, checked=False)
        except TypeError:
            self.definition.check_call(args, kwargs)
            raise
        if self._weights_pos >= 0:
            fn = self._on_payload(self._prepared_kernel(args, kwargs))
        else:
            fn = self._resolve(self._case(*args, **kwargs))[1]
        if len(memo) >= self._memo_max:
            memo.clear()
        memo[key] = fn
        return fn

    def prepare_weights(self, weights: Any, *, tokens: int | None = None) -> PreparedWeights:
        """Choose this op's kernel for these weights and lay them out for it, once, before serving.

        tokens: how many tokens a call is expected to carry (a decode server's batch, a prefill server's chunk).
        Its class joins the case that picks the kernel, and so the layout, which every later call then uses
        whatever its size (e.g. moe_experts on the H200: the portable fused MoE up to 64 tokens, triton_kernels
        above).
        None: the op's default class (one token a call)."""
        if self._weights_pos < 0:
            raise Dsv4HalError(f"op {self.name} has no weights to prepare")
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
        while True:  # as _resolve: a kernel whose functions do not import is refused from then on
            impl = select_kernel(p.registry, self.name, case, p.info, p.name, p.overrides, p.lock).chosen
            prepare = load_target(p.registry, impl, "prepare") if impl.prepare else (lambda w: w)
            if prepare is not None and load_target(p.registry, impl) is not None:
                break
        log.info("%s on %s: weights prepared for %s for [%s]", self.name, p.name, impl.name, case_summary(case))
        payload = prepare(weights)
        prepared = PreparedWeights(self.name, impl.name, impl.layout, p.name, case, payload)
        from dsv4hal import custom_ops

        custom_ops.remember_weights(prepared)  # a handle for the compiled path
        return prepared

    def _call_prepared(self, args: tuple, kwargs: dict[str, Any]) -> Any:
        """Run the implementation the weights were prepared for; never another one."""
        kernel = self._prepared_kernel(args, kwargs)
        args, kwargs = self._with_payload(args, kwargs)
        return kernel(*args, **kwargs)

    def _with_payload(self, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
        """The arguments with the PreparedWeights replaced by its payload (what the kernel takes)."""
        name, pos = self.spec.weights_arg, self._weights_pos
        if name in kwargs:
            return args, {**kwargs, name: kwargs[name].payload}
        return (*args[:pos], args[pos].payload, *args[pos + 1:]), kwargs

    def _on_payload(self, kernel: Callable[..., Any]) -> Callable[..., Any]:
        """kernel, called on the payload: what the memo keeps for an op with weights."""
        with_payload = self._with_payload

        def call(*args: Any, **kwargs: Any) -> Any:
            args, kwargs = with_payload(args, kwargs)
            return kernel(*args, **kwargs)

        return call

    def _prepared_kernel(self, args: tuple, kwargs: dict[str, Any]) -> Callable[..., Any]:
        """The kernel of the implementation the weights were prepared for, if it runs this call's case on this
        platform (raises otherwise)."""
        name, pos = self.spec.weights_arg, self._weights_pos
        prepared = kwargs[name] if name in kwargs else args[pos]
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
        key = (prepared.implementation, tuple(case.items()))
        fn = self._by_impl.get(key)
        if fn is None:
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
            self._by_impl[key] = fn
        return fn

    def __repr__(self) -> str:
        return f"<dsv4hal op {self.spec.name} on {self.platform.name}>"


class Ops(TypedOps):
    """Attribute access to the bound ops: platform.ops.sparse_attention_decode(...), typed as each op's
    definition (dsv4hal/ops/typed_ops.py); platform.ops["name"] and iteration too."""

    def __init__(self, platform: Platform) -> None:
        ops = platform.registry.ops  # the built-in ops and those of the registry's plugins
        self._ops: dict[str, BoundOp[..., Any]] = {name: BoundOp(platform, spec) for name, spec in ops.items()}
        for name, op in self._ops.items():
            setattr(self, name, op)
        from dsv4hal import custom_ops  # torch: imported when ops are bound

        custom_ops.enroll(platform, self._ops.values())  # torch.ops.dsv4hal.<op>(..., platform.handle)

    def __iter__(self) -> Iterator[BoundOp[..., Any]]:
        return iter(self._ops.values())

    def __getitem__(self, name: str) -> BoundOp[..., Any]:
        op = self._ops.get(name) if isinstance(name, str) else None
        if op is None:
            raise _unknown_op(name, self._ops)
        return op

    def __getattr__(self, name: str) -> BoundOp[..., Any]:
        # only for names __init__ did not set: every op is an attribute, so this is always a miss
        raise _unknown_op(name, self.__dict__.get("_ops", {}))


def _unknown_op(name: object, ops: Mapping[str, object]) -> UnknownOpError:
    return UnknownOpError(f"unknown op {name!r}", remedy=f"valid ops: {', '.join(ops)}")


class Platform:
    def __init__(self, spec: PlatformSpec, info: PlatformInfo, registry: Registry, overrides: ov.Overrides,
                 decision: PlatformDecision, *, validate: bool = True, checked: bool = False,
                 lock: LockInForce | None = None, host_info: PlatformInfo | None = None) -> None:
        # info: the device the ops run on, which kernels are judged by; host_info: the machine as detected (they
        # differ for the CPU platform on a host with a GPU: hardware.cpu_view)
        self.spec, self.info, self.registry, self.overrides = spec, info, registry, overrides
        self.host_info = host_info or info
        self.lock = lock  # a lock file in force (dsv4hal.lock), or None: static priorities
        self.platform_decision = decision
        self.validate, self.checked = validate, checked
        self.handle = next(_handles)
        self.ops = Ops(self)
        # Bind now: each op's default case is decided at selection time, so a missing kernel or a bad
        # override surfaces here rather than at the first call in the middle of a forward pass.
        self.default_decisions = {op.name: op.bind_check() for op in self.ops}

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def device_type(self) -> str:
        return self.spec.device_type

    def decode_step(self) -> decode_step:
        """Declare a decode step whose metadata is fixed: kernels may share plans inside (dsv4hal.step). A no-op
        while torch.compile traces (enter it around the compiled call to share plans there)."""
        from dsv4hal.step import decode_step

        return decode_step()

    def explain(self, op: str, case: Mapping[str, object] | None = None) -> Decision:
        return self.ops[op].decide(case)

    def __repr__(self) -> str:
        return f"<dsv4hal Platform {self.name} on {self.info.summary()}>"


def detect_info(registry: Registry) -> PlatformInfo:
    return hardware.detect(registry.requirements())


def select_platform(name: str | None = None, *, info: PlatformInfo | None = None,
                    overrides: ov.Overrides | None = None, registry: Registry | None = None,
                    validate: bool = True, checked: bool = False, lock: str | os.PathLike[str] | None = None,
                    lock_mismatch: str | None = None) -> Platform:
    """Detect the hardware (unless `info` is given) and return the best fitting platform with its ops
    bound. `name` (or DSV4HAL_PLATFORM) forces a platform; if it does not fit, PlatformNotFoundError.
    `checked=True` validates index ranges and finiteness on the device before each kernel (a host sync).
    `lock` (or DSV4HAL_LOCK) makes every op follow a lock file from `dsv4hal tune`; a lock that does not match
    raises LockMismatchError naming the differences, unless `lock_mismatch="reselect"` (DSV4HAL_LOCK_MISMATCH)
    accepts static selection, which explain then reports."""
    for flag, value in (("validate", validate), ("checked", checked)):
        if not isinstance(value, bool):  # "no" is truthy: it must not turn a mode on
            raise InvalidArgumentError("select_platform", flag, "True or False", repr(value))
    if name is not None and not isinstance(name, str):
        raise InvalidArgumentError("select_platform", "name", "a platform name (str) or None", repr(name))
    o = overrides or ov.current()
    reg = registry or load_registry(o)
    inf = info or detect_info(reg)
    decision = select_platform_spec(reg, inf, o, name)
    host = inf
    if decision.chosen.device_type == "cpu":  # its ops run on the CPU, whatever else the host has
        inf = hardware.cpu_view(inf)
    log.info("platform %s (%s) on %s", decision.chosen.name, decision.source, host.summary())
    lock_path = lock if lock is not None else o.lock
    in_force = None
    if lock_path:
        in_force = enforce(lock_path, decision.chosen.name, inf, reg, lock_mismatch or o.lock_mismatch)
    return Platform(decision.chosen, inf, reg, o, decision, validate=validate, checked=checked, lock=in_force,
                    host_info=host)
