"""select_platform() and the Platform it returns: its ops (dsv4hal.dispatch: BoundOp, WeightedOp) bound at
selection time, each with a dispatcher that decides a case once and keeps the choice, every decision explainable."""

from __future__ import annotations

import itertools
import logging
import os
import threading
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from dsv4hal import hardware
from dsv4hal import override as ov
from dsv4hal.dispatch.bound_op import BoundOp
from dsv4hal.dispatch.weighted_op import WeightedOp
from dsv4hal.errors import BadOverrideError, InvalidArgumentError, UnknownOpError
from dsv4hal.hardware import PlatformInfo
from dsv4hal.lock import LockInForce, enforce
from dsv4hal.ops.catalog import OpSpec
from dsv4hal.plugins import build_registry
from dsv4hal.registry import PlatformSpec, Registry
from dsv4hal.selection import Decision, PlatformDecision, select_kernel, select_platform_spec

if TYPE_CHECKING:  # the typed facade (Ops): a stub generated from the catalog (dsv4hal.ops.gen_stub)
    from dsv4hal.distributed.ep import ExpertParallel
    from dsv4hal.distributed.tp import TensorParallel
    from dsv4hal.ops.typed_ops import TypedOps
    from dsv4hal.step import decode_step
else:
    TypedOps = object

log = logging.getLogger(__name__)
P = ParamSpec("P")
R = TypeVar("R")
# A platform's handle names its custom ops (dsv4hal.custom_ops)
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


class Ops(TypedOps):
    """Attribute access to the bound ops: platform.ops.sparse_attention_decode(...), typed as each op's
    definition; platform.ops["name"] and iteration too."""

    def __init__(self, platform: Platform) -> None:
        ops = platform.registry.ops  # the built-in ops and those of the registry's plugins
        self._ops: dict[str, BoundOp[..., Any]] = {name: _bind(platform, spec) for name, spec in ops.items()}
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


def _bind(platform: Platform, spec: OpSpec) -> BoundOp[..., Any]:
    """An op with weights is a WeightedOp (its kernel is chosen when the weights are prepared)."""
    return (WeightedOp if spec.weights_arg else BoundOp)(platform, spec)


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
        self._check_collective_overrides()

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
        """Why `op` (an op or a collective op) gets its kernel for `case` (default: the op's default case)."""
        if op in self.registry.collectives:
            return self.decide_collective(op, case)
        return self.ops[op].decide(case)

    # ---------------------------------------------------------------- collective ops (dsv4hal.collectives)

    def collective_case(self, op: str, case: Mapping[str, object] | None = None) -> dict[str, object]:
        """`case` over the collective op's default case as this platform's device type sees it."""
        spec = self.registry.collectives.get(op)
        if spec is None:
            raise _unknown_op(op, self.registry.collectives)
        return {**spec.case_on(self.device_type), **(case or {})}

    def decide_collective(self, op: str, case: Mapping[str, object] | None = None, *,
                          forced: str | None = None) -> Decision:
        """The backend of collective op `op` for `case`, chosen with this platform's registry, machine, overrides
        and lock; `forced` names one (as an override: refused with UnsupportedCaseError if it cannot run)."""
        o = self.overrides if forced is None else ov.with_kernel(self.overrides, op, forced)
        return select_kernel(self.registry, op, self.collective_case(op, case), self.info, self.name, o, self.lock)

    @property
    def collective_decisions(self) -> dict[str, Decision]:
        """Each collective op's decision for its default case on this platform (dsv4hal info)."""
        return {op: self.decide_collective(op) for op in self.registry.collectives}

    def expert_parallel(self, group: Any = None, **kwargs: Any) -> ExpertParallel:
        """Dispatch/combine over `group` (a torch.distributed ProcessGroup; None: one rank), its backend chosen
        here per mode and layout; kwargs are ExpertParallel's (num_experts, hidden, top_k, max_tokens_per_rank,
        dtype, expert_map, backend, ...)."""
        from dsv4hal.distributed.ep import ExpertParallel

        return ExpertParallel(group=group, platform=self, **kwargs)

    def tensor_parallel(self, group: Any = None, **kwargs: Any) -> TensorParallel:
        """The tensor-parallel all-reduce over `group` (None: one rank), its backend chosen here; kwargs are
        TensorParallel's (hidden, max_tokens, dtype, backend, check_calls, ...)."""
        from dsv4hal.distributed.tp import TensorParallel

        return TensorParallel(group=group, platform=self, **kwargs)

    def _check_collective_overrides(self) -> None:
        """A collective op forced to a backend that is not registered: refused now, as a bad op override is."""
        for op in self.registry.collectives:
            forced = self.overrides.kernels.get(op)
            names = sorted(k.name for k in self.registry.kernels_for(op))
            if forced is not None and forced not in names:
                raise BadOverrideError(f"override {op}={forced}: no backend named {forced!r} for {op!r}",
                                       remedy="valid backends: " + (", ".join(names) or "none registered"))

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
