"""select_platform() and the Platform it returns: ops bound to kernels at selection time, a choice
per case class decided once and cached, and every decision explainable."""

from __future__ import annotations

import importlib
import inspect
import logging
import os
import threading
from collections.abc import Callable, Mapping
from typing import Any

from dsv4hal import hardware
from dsv4hal import override as ov
from dsv4hal.errors import (
    Dsv4HalError,
    InvalidArgumentError,
    PluginFaultError,
    PreparedWeightsMismatchError,
    UnknownNameError,
    UnsupportedCaseError,
    format_reasons,
)
from dsv4hal.hardware import PlatformInfo
from dsv4hal.lock import LockInForce, enforce
from dsv4hal.ops.catalog import OP_NAMES, OPS_BY_NAME, OpSpec
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

log = logging.getLogger(__name__)

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


class BoundOp:
    """One op of a Platform. Calling it validates the arguments (cheap checks, no device sync unless
    the platform is in checked mode), finds the case class, and calls the kernel chosen for it."""

    def __init__(self, platform: Platform, spec: OpSpec) -> None:
        self.platform, self.spec = platform, spec
        contract = importlib.import_module(spec.contract)
        self._validate: Callable[..., Any] = getattr(contract, spec.validate)
        self._case: Callable[..., Mapping[str, object]] = getattr(contract, spec.case)
        self._params = tuple(inspect.signature(self._case).parameters)  # to name positional arguments
        from dsv4hal.ops.checks import check_materializable  # torch: imported when ops are bound, not before

        self._materializable = check_materializable
        self._by_case: dict[tuple, tuple[Decision, Callable[..., Any]]] = {}
        self._weights_pos = -1
        if spec.weights_arg:
            params = list(inspect.signature(self._case).parameters)
            self._weights_pos = params.index(spec.weights_arg)
            self._validate_weights = getattr(contract, spec.weights_validate)
            self._weights_case = getattr(contract, spec.weights_case)
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

    def case_of(self, *args: Any, **kwargs: Any) -> Mapping[str, object]:
        return self._case(*args, **kwargs)

    def _resolve(self, case: Mapping[str, object]) -> tuple[Decision, Callable[..., Any]]:
        key = tuple(sorted(case.items()))
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

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.platform.validate:
            self._materializable(self.name, args, kwargs, self._params)  # expand views too large to copy
            self._validate(*args, **kwargs, checked=self.platform.checked)
        if self._weights_pos >= 0:
            return self._call_prepared(args, kwargs)
        return self._resolve(self._case(*args, **kwargs))[1](*args, **kwargs)

    def prepare_weights(self, weights: Any) -> PreparedWeights:
        """Choose this op's kernel for these weights and lay them out for it, once, before serving."""
        if self._weights_pos < 0:
            raise Dsv4HalError(f"op {self.name} has no weights to prepare")
        self._validate_weights(weights, checked=self.platform.checked)
        case = dict(self._weights_case(weights))
        p = self.platform
        while True:  # as _resolve: a kernel whose functions do not import is refused from then on
            impl = select_kernel(p.registry, self.name, case, p.info, p.name, p.overrides, p.lock).chosen
            prepare = load_target(p.registry, impl, "prepare") if impl.prepare else (lambda w: w)
            if prepare is not None and load_target(p.registry, impl) is not None:
                break
        log.info("%s on %s: weights prepared for %s for [%s]", self.name, p.name, impl.name, case_summary(case))
        payload = prepare(weights)
        return PreparedWeights(self.name, impl.name, impl.layout, p.name, case, payload)

    def _call_prepared(self, args: tuple, kwargs: dict[str, Any]) -> Any:
        """Run the implementation the weights were prepared for; never another one."""
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
        key = (prepared.implementation, tuple(sorted(case.items())))
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
        if name in kwargs:
            kwargs = {**kwargs, name: prepared.payload}
        else:
            args = (*args[:pos], prepared.payload, *args[pos + 1:])
        return fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<dsv4hal op {self.spec.name} on {self.platform.name}>"


class Ops:
    """Attribute access to the bound ops: platform.ops.sparse_attention_decode(...)."""

    def __init__(self, platform: Platform) -> None:
        self._ops = {name: BoundOp(platform, OPS_BY_NAME[name]) for name in OP_NAMES}
        for name, op in self._ops.items():
            setattr(self, name, op)

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self._ops.values())

    def __getitem__(self, name: str) -> BoundOp:
        op = self._ops.get(name) if isinstance(name, str) else None
        if op is None:
            raise UnknownNameError(f"unknown op {name!r}", remedy=f"valid ops: {', '.join(OP_NAMES)}")
        return op


class Platform:
    def __init__(self, spec: PlatformSpec, info: PlatformInfo, registry: Registry, overrides: ov.Overrides,
                 decision: PlatformDecision, *, validate: bool = True, checked: bool = False,
                 lock: LockInForce | None = None) -> None:
        self.spec, self.info, self.registry, self.overrides = spec, info, registry, overrides
        self.lock = lock  # a lock file in force (dsv4hal.lock), or None: static priorities
        self.platform_decision = decision
        self.validate, self.checked = validate, checked
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

    def decode_step(self):  # type: ignore[no-untyped-def]
        """Declare a decode step whose metadata is fixed: kernels may share plans inside (dsv4hal.step)."""
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
    log.info("platform %s (%s) on %s", decision.chosen.name, decision.source, inf.summary())
    lock_path = lock if lock is not None else o.lock
    in_force = None
    if lock_path:
        in_force = enforce(lock_path, decision.chosen.name, inf, reg, lock_mismatch or o.lock_mismatch)
    return Platform(decision.chosen, inf, reg, o, decision, validate=validate, checked=checked, lock=in_force)
