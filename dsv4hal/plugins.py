"""Plugin loading: every module in the `dsv4hal.platforms` entry-point group is registered with
pluggy and its `dsv4hal_register` hook is called through pluggy, one plugin at a time, inside the
registry's scope for that plugin (which records what it registered and rolls it back if it fails). The
built-in platforms use the same path as a third party.

A faulty plugin is contained, never fatal (unless strict mode asks for that): an import or registration
that raises (SystemExit included), a registration that makes a priority tie with kernels already
registered, a `supports`/`claims` that raises or answers something other than a list of reasons, or a kernel
target that does not import. Each is recorded in `registry.plugin_errors` (shown by `dsv4hal info`) and
warned about; the plugin's entries are dropped (load-time faults) or the faulty entry is refused with the
fault as its reason (later faults). Strict mode raises PluginLoadError / PluginFaultError / RegistryError."""

from __future__ import annotations

import importlib
import importlib.metadata
import threading
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import pluggy

from dsv4hal import hookspecs
from dsv4hal.errors import BadOverrideError, PluginFaultError, PluginLoadError, RegistryError
from dsv4hal.registry import KernelImpl, Registry

# Loaded first, so that a third-party plugin that ties with a built-in kernel is the one refused.
BUILTIN_PLUGINS = ("cpu", "portable_triton", "cuda_sm90", "cuda_sm100", "rocm")
# What a plugin may raise that must not escape into the host (sys.exit() raises SystemExit).
_CONTAINED = (Exception, SystemExit)
_fault_lock = threading.Lock()


class PluginWarning(UserWarning):
    """A plugin failed to load or misbehaved; its platforms and kernels (or the faulty one) are missing
    (an error in strict mode)."""


def _entry_points() -> list[importlib.metadata.EntryPoint]:
    eps = importlib.metadata.entry_points(group=hookspecs.ENTRY_POINT_GROUP)
    return sorted(eps, key=lambda e: (e.name not in BUILTIN_PLUGINS, BUILTIN_PLUGINS.index(e.name)
                                      if e.name in BUILTIN_PLUGINS else 0, e.name))


def _dist_version(ep: importlib.metadata.EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    return f"{dist.name} {dist.version}" if dist is not None else "unknown"


def _remedy(name: str) -> str:
    return f"fix or uninstall the plugin, or disable it with DSV4HAL_DISABLE_PLUGINS={name}"


def record_fault(registry: Registry, plugin: str, why: str, cause: BaseException | None = None) -> None:
    """A plugin misbehaved after loading: raise in strict mode, else record it once and warn."""
    msg = f"dsv4hal plugin {plugin!r} faulted: {why}"
    if registry.strict:
        raise PluginFaultError(msg, remedy=_remedy(plugin)) from cause
    with _fault_lock:
        known = registry.plugin_errors.get(plugin, "")
        if why in known:
            return
        registry.plugin_errors[plugin] = f"{known}; {why}" if known else why
    warnings.warn(f"{msg}. {_remedy(plugin)}", PluginWarning, stacklevel=4)


@dataclass(frozen=True)
class _Guarded:
    """A plugin's supports(case, info) or claims(info): a raise or a malformed answer becomes a reason the
    entry cannot be used, plus a recorded fault, instead of an exception in the host's selection."""

    fn: Callable[..., Any]
    what: str
    plugin: str
    registry: Registry = field(repr=False, compare=False)

    def __call__(self, *args: Any) -> list[str]:
        try:
            got = self.fn(*args)
        except _CONTAINED as exc:
            why = f"{self.what} raised {type(exc).__name__}: {exc}"
            record_fault(self.registry, self.plugin, why, exc)
            return [f"plugin fault: {why}"]
        if not isinstance(got, (list, tuple)) or not all(isinstance(r, str) for r in got):
            why = f"{self.what} returned {type(got).__name__}, not a list of reason strings"
            record_fault(self.registry, self.plugin, why)
            return [f"plugin fault: {why}"]
        return list(got)


def _guard(registry: Registry, name: str) -> None:
    """Wrap the callables the plugin `name` registered (registry.registered[name])."""
    entries = registry.registered[name]
    for pname in entries.platforms:
        spec = registry.platforms[pname]
        if not isinstance(spec.claims, _Guarded):
            registry.platforms[pname] = replace(
                spec, claims=_Guarded(spec.claims, f"platform {pname!r}: claims()", name, registry))
    for op, kname in entries.kernels:
        impl = registry.kernels[op][kname]
        if impl.supports is not None and not isinstance(impl.supports, _Guarded):
            registry.kernels[op][kname] = replace(
                impl, supports=_Guarded(impl.supports, f"kernel {kname!r} ({op}): supports()", name, registry))


class _HookRaised(Exception):
    """The plugin's own dsv4hal_register raised `cause` (told apart from a tie found when its scope closes)."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


def _register_one(pm: pluggy.PluginManager, registry: Registry, name: str, module: object, strict: bool) -> bool:
    """Register `module` with pluggy and call its dsv4hal_ops and dsv4hal_register hooks alone, inside
    registry.scope(name).
    False (recorded, warned, or raised in strict mode) when it is not a valid plugin or fails."""
    try:
        pm.register(module, name=name)
        pm.check_pending()  # a hookimpl whose name no hookspec declares (a misspelt hook) is refused here
    except _CONTAINED as exc:
        if pm.is_registered(module):
            pm.unregister(module)
        _fail(registry, name, f"not a valid dsv4hal plugin: {type(exc).__name__}: {exc}", strict)
        return False
    others = [p for p in pm.get_plugins() if p is not module]
    hook = pm.subset_hook_caller("dsv4hal_register", remove_plugins=others)
    if not hook.get_hookimpls():
        pm.unregister(module)
        _fail(registry, name, "module has no dsv4hal_register(registry) hook (marked with dsv4hal.hookimpl)", strict)
        return False
    ops_hook = pm.subset_hook_caller("dsv4hal_ops", remove_plugins=others)
    try:
        with registry.scope(name):
            try:
                for specs in ops_hook():  # its ops first: its kernels may implement them
                    for spec in specs:
                        registry.add_op(spec)
                hook(registry=registry)
            except _CONTAINED as exc:
                raise _HookRaised(exc) from exc
    except _HookRaised as raised:  # the scope rolled it back: a plugin that fails half-way leaves nothing
        pm.unregister(module)
        exc = raised.cause
        _fail(registry, name, f"dsv4hal_register raised {type(exc).__name__}: {exc}", strict, cause=exc)
        return False
    except RegistryError as tie:  # the registry was tie-free before this plugin: it brought the tie
        pm.unregister(module)
        if strict:
            raise
        _fail(registry, name, f"its registration ties with registered kernels: {tie}", strict)
        return False
    return True


def build_registry(*, disabled: Iterable[str] = (), strict: bool = False,
                   extra_modules: Iterable[tuple[str, object]] = ()) -> Registry:
    """Load the plugins and return a closed registry.

    Each plugin is registered with pluggy and its dsv4hal_register hook is called on its own, inside
    registry.scope(name), in a fixed order (built-ins first, then by name; pluggy's own call order never
    decides anything). `extra_modules` are (name, module) pairs registered directly (tests), after the entry
    points. A plugin that raises at import or registration, or whose registration ties with kernels
    registered before it, is recorded in `registry.plugin_errors` and warned about, and leaves nothing
    behind; in strict mode it raises PluginLoadError (RegistryError for a tie) instead."""
    disabled, extra_modules = set(disabled), list(extra_modules)
    entry_points = _entry_points()
    _check_disabled(disabled, {ep.name for ep in entry_points} | set(BUILTIN_PLUGINS)
                    | {name for name, _ in extra_modules})
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    registry = Registry(strict=strict)
    sources: list[tuple[str, object, str]] = []
    for ep in entry_points:
        if ep.name in disabled:
            continue
        try:
            module = ep.load()
        except _CONTAINED as exc:  # a broken plugin must not break the others, nor exit the host
            _fail(registry, ep.name, f"import of {ep.value!r} failed: {type(exc).__name__}: {exc}", strict,
                  cause=exc, stacklevel=3)
            continue
        sources.append((ep.name, module, _dist_version(ep)))
    sources.extend((name, mod, "direct") for name, mod in extra_modules if name not in disabled)
    for name, module, version in sources:
        if _register_one(pm, registry, name, module, strict):
            _guard(registry, name)
            registry.plugin_versions[name] = version
    return registry.close()


def _check_disabled(disabled: set[str], known: set[str]) -> None:
    """A plugin named for disabling must exist: a misspelt name would otherwise leave the plugin enabled."""
    unknown = sorted(disabled - known)
    if unknown:
        raise BadOverrideError(f"DSV4HAL_DISABLE_PLUGINS (or overrides(disable_plugins=...)) names "
                               f"{', '.join(map(repr, unknown))}: no such plugin is installed",
                               remedy=f"name installed plugins only: {', '.join(sorted(known))}")


def _fail(registry: Registry, name: str, why: str, strict: bool, cause: BaseException | None = None,
          stacklevel: int = 4) -> None:
    registry.plugin_errors[name] = why
    msg = f"dsv4hal plugin {name!r} did not load: {why}"
    if strict:
        raise PluginLoadError(msg, remedy=_remedy(name)) from cause
    warnings.warn(f"{msg}. {_remedy(name)}", PluginWarning, stacklevel=stacklevel)


def import_target(target: str):  # type: ignore[no-untyped-def]
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


def load_target(registry: Registry, impl: KernelImpl, which: str = "target") -> Callable[..., Any] | None:
    """Import a kernel's `target` (or `prepare`) function. If it does not import, the kernel is marked broken
    in the registry (selection refuses it from now on with the reason), the fault is recorded, and None is
    returned so the caller selects again; strict mode raises PluginFaultError."""
    target = getattr(impl, which)
    try:
        fn = import_target(target)
    except _CONTAINED as exc:
        why = f"kernel {impl.name!r} ({impl.op}): {which} {target!r} did not import: {type(exc).__name__}: {exc}"
        registry.disable_kernel(impl, f"plugin fault: {why}")
        record_fault(registry, impl.plugin or "?", why, exc)
        return None
    if not callable(fn):
        why = f"kernel {impl.name!r} ({impl.op}): {which} {target!r} is not callable"
        registry.disable_kernel(impl, f"plugin fault: {why}")
        record_fault(registry, impl.plugin or "?", why)
        return None
    return fn
