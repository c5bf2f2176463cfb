"""Selection: pure functions of (registry, op, case, PlatformInfo, overrides). No imports of kernels,
no device access; every decision records why each candidate was taken or refused."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Literal

from dsv4hal.errors import (
    AmbiguousPlatformError,
    BadOverrideError,
    NoKernelError,
    PlatformNotFoundError,
    UnsupportedCaseError,
    format_reasons,
)
from dsv4hal.hardware import PlatformInfo
from dsv4hal.override import Overrides
from dsv4hal.registry import KernelImpl, PlatformSpec, Registry

if TYPE_CHECKING:
    from dsv4hal.lock import LockInForce

Source = Literal["auto", "env", "api", "lock"]
Status = Literal["chosen", "eligible", "rejected"]


def case_summary(case: Mapping[str, object]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(case.items())) or "(any case)"


@dataclass(frozen=True)
class Candidate:
    name: str
    priority: int
    tier: str
    plugin: str
    status: Status
    reasons: tuple[str, ...] = ()
    priority_note: str = ""  # a case-conditional priority's condition (KernelImpl.priority_note); '' for its own


@dataclass(frozen=True)
class Decision:
    op: str
    platform: str
    case: Mapping[str, object]
    chosen: KernelImpl
    source: Source
    candidates: tuple[Candidate, ...] = field(default_factory=tuple)
    # with a lock in force: what it said (or why it was not followed) and the microseconds it measured
    notes: tuple[str, ...] = ()
    measured: Mapping[str, float | None] = field(default_factory=dict)

    def explain(self) -> str:
        lines = [f"{self.op} on {self.platform} for {case_summary(self.case)}: "
                 f"{self.chosen.name} ({self.chosen.tier}, from {self.chosen.plugin}, source {self.source})"]
        lines += [f"  note: {n}" for n in self.notes]
        if not self.chosen.bounds_checked:
            lines.append(f"  note: {self.chosen.name} is not bounds-checked ({self.chosen.bounds_note}): unchecked "
                         "mode does not keep a bad index inside the buffers; select_platform(checked=True) refuses "
                         "such indices")
        for c in self.candidates:
            why = f": {'; '.join(c.reasons)}" if c.reasons else ""
            us = self.measured.get(c.name)
            timed = f", measured {us:.1f} us" if us is not None else (", not measured" if c.name in self.measured
                                                                        else "")
            prio = f"{c.priority} {c.priority_note}" if c.priority_note else c.priority
            lines.append(f"  {c.status:8s} {c.name} (priority {prio}, {c.tier}{timed}){why}")
        return "\n".join(lines)

    def to_json(self) -> dict[str, object]:
        return {"op": self.op, "platform": self.platform, "case": dict(self.case), "chosen": self.chosen.name,
                "bounds_checked": self.chosen.bounds_checked, "layout": self.chosen.layout, "source": self.source,
                "notes": list(self.notes),
                "measured_us": dict(self.measured),
                "candidates": [{"name": c.name, "priority": c.priority, "priority_note": c.priority_note,
                                "tier": c.tier, "plugin": c.plugin, "status": c.status, "reasons": list(c.reasons)}
                               for c in self.candidates]}


def kernel_reasons(impl: KernelImpl, case: Mapping[str, object], info: PlatformInfo, platform: str,
                   overrides: Overrides) -> list[str]:
    """Why `impl` cannot run this case here (empty: it can)."""
    reasons = [impl.fault] if impl.fault else []  # a broken plugin kernel (dsv4hal.plugins.load_target)
    if not impl.applies_to(platform):
        reasons.append(f"not built for platform {platform} (only {', '.join(impl.platforms)})")
    missing = [r for r in impl.requires if not info.has(r)]
    if missing:
        reasons.append("missing " + ", ".join(missing))
    if not missing:
        for minimum in impl.min_versions:
            reasons.extend(minimum.reasons(info))
    if impl.supports is not None and not missing:
        reasons.extend(impl.supports(case, info))
    if overrides.strict and impl.tier == "reference" and info.is_gpu:
        reasons.append("strict mode refuses the PyTorch reference on a GPU platform")
    return reasons


def select_kernel(registry: Registry, op: str, case: Mapping[str, object], info: PlatformInfo, platform: str,
                  overrides: Overrides, lock: LockInForce | None = None) -> Decision:
    """Choose the implementation of `op` for `case` on `platform`, or raise a typed error naming every
    candidate's reasons. A forced implementation is used only if it can run; otherwise error. A lock in
    force (dsv4hal.lock) replaces the static priority by the measured choice, or raises LockMismatchError;
    a forced implementation still wins over it."""
    impls = sorted(registry.kernels_for(op), key=lambda k: (-k.priority_for(platform, case), k.name))
    verdicts = [(k, kernel_reasons(k, case, info, platform, overrides)) for k in impls]
    forced = overrides.kernels.get(op)
    if forced is not None:
        by_name = {k.name: (k, r) for k, r in verdicts}
        if forced not in by_name:
            raise BadOverrideError(
                f"override {op}={forced}: no implementation named {forced!r} for op {op!r}",
                remedy="valid implementations: " + (", ".join(sorted(by_name)) or "none registered"))
        impl, reasons = by_name[forced]
        if reasons:
            raise UnsupportedCaseError(
                f"{op}: forced implementation {forced!r} cannot run case [{case_summary(case)}] on platform "
                f"{platform} ({info.summary()}):\n" + format_reasons({forced: reasons}),
                remedy="remove the override (DSV4HAL_KERNELS or overrides(kernels=...)) or change the case")
        chosen, source = impl, overrides.kernel_source(op)
        pick = None if lock is None else lock.pick(op, case, {k.name: r for k, r in verdicts}, advisory=True)
        if pick is not None:
            pick = replace(pick, notes=(*pick.notes, f"the override {op}={forced} wins over the lock"))
    else:
        eligible = [k for k, r in verdicts if not r]
        if not eligible:
            raise NoKernelError(
                f"{op}: no implementation can run case [{case_summary(case)}] on platform {platform} "
                f"({info.summary()}); candidates:\n"
                + format_reasons({k.name: r for k, r in verdicts if k.applies_to(platform)}),
                remedy="install the library a candidate is missing, or use a platform whose kernels take this case")
        chosen, source = eligible[0], "auto"
        pick = None if lock is None else lock.pick(op, case, {k.name: r for k, r in verdicts})
        if pick is not None and pick.name is not None:
            chosen, source = next(k for k in impls if k.name == pick.name), "lock"
    cands = tuple(  # kernels of other platforms are left out: they are not candidates here
        Candidate(k.name, k.priority_for(platform, case), k.tier, k.plugin,
                  "chosen" if k is chosen else ("rejected" if r else "eligible"), tuple(r),
                  k.priority_note(platform, case))
        for k, r in verdicts if k.applies_to(platform))
    return Decision(op=op, platform=platform, case=dict(case), chosen=chosen, source=source, candidates=cands,
                    notes=pick.notes if pick else (), measured=dict(pick.measured) if pick else {})


@dataclass(frozen=True)
class PlatformDecision:
    chosen: PlatformSpec
    source: Source
    reasons: Mapping[str, tuple[str, ...]]  # platform -> reasons it does not fit (empty: fits)


def select_platform_spec(registry: Registry, info: PlatformInfo, overrides: Overrides,
                         name: str | None = None) -> PlatformDecision:
    reasons = {n: tuple(p.claims(info)) for n, p in sorted(registry.platforms.items())}
    wanted, source = (name, "api") if name else (overrides.platform, overrides.sources.get("platform", "env"))
    if wanted:
        if wanted not in registry.platforms:
            failed = "".join(f"\n  plugin {k!r} failed: {v}" for k, v in registry.plugin_errors.items())
            raise PlatformNotFoundError(
                f"no platform named {wanted!r}{failed}",
                remedy=f"valid platforms: {', '.join(sorted(registry.platforms)) or 'none'}")
        if reasons[wanted]:
            raise PlatformNotFoundError(
                f"platform {wanted!r} was requested but does not fit this machine ({info.summary()}):\n"
                + format_reasons({wanted: reasons[wanted]}),
                remedy="run on matching hardware, or unset DSV4HAL_PLATFORM to let detection choose; fitting: "
                + (", ".join(n for n, r in reasons.items() if not r) or "none"))
        return PlatformDecision(registry.platforms[wanted], source, reasons)  # type: ignore[arg-type]
    fitting = sorted((p for n, p in registry.platforms.items() if not reasons[n]), key=lambda p: -p.priority)
    if not fitting:
        raise PlatformNotFoundError(f"no platform fits this machine ({info.summary()}):\n"
                                    + format_reasons({n: r for n, r in reasons.items()}),
                                    remedy="install the plugin for this hardware")
    top = [p for p in fitting if p.priority == fitting[0].priority]
    if len(top) > 1:
        raise AmbiguousPlatformError(
            f"platforms {', '.join(p.name for p in top)} (plugins {', '.join(p.plugin for p in top)}) all claim "
            f"this machine ({info.summary()}) at priority {top[0].priority}",
            remedy="choose one with DSV4HAL_PLATFORM or select_platform(name=...), or disable a plugin with "
                   "DSV4HAL_DISABLE_PLUGINS")
    return PlatformDecision(fitting[0], "auto", reasons)
