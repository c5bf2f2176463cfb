"""Plugin loading: every module in the `dsv4hal.platforms` entry-point group is registered with
pluggy and asked to fill the registry. The built-in platforms use the same path as a third party."""

from __future__ import annotations

import importlib
import importlib.metadata
import warnings
from collections.abc import Iterable

import pluggy

from dsv4hal import hookspecs
from dsv4hal.errors import PluginLoadError
from dsv4hal.registry import Registry


class PluginWarning(UserWarning):
    """A plugin failed to load; its platforms and kernels are missing (an error in strict mode)."""


def _entry_points() -> list[importlib.metadata.EntryPoint]:
    return sorted(importlib.metadata.entry_points(group=hookspecs.ENTRY_POINT_GROUP), key=lambda e: e.name)


def _dist_version(ep: importlib.metadata.EntryPoint) -> str:
    dist = getattr(ep, "dist", None)
    return f"{dist.name} {dist.version}" if dist is not None else "unknown"


def build_registry(*, disabled: Iterable[str] = (), strict: bool = False,
                   extra_modules: Iterable[tuple[str, object]] = ()) -> Registry:
    """Load the plugins and return a closed registry.

    `extra_modules` are (name, module) pairs registered directly (tests). A plugin that raises at
    import or registration is recorded in `registry.plugin_errors` and warned about; in strict
    mode it raises PluginLoadError instead."""
    disabled = set(disabled)
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    registry = Registry()
    sources: list[tuple[str, object, str]] = []
    for ep in _entry_points():
        if ep.name in disabled:
            continue
        try:
            module = ep.load()
        except Exception as exc:  # a broken plugin must not break the others
            _fail(registry, ep.name, f"import of {ep.value!r} failed: {type(exc).__name__}: {exc}", strict)
            continue
        sources.append((ep.name, module, _dist_version(ep)))
    sources.extend((name, mod, "direct") for name, mod in extra_modules if name not in disabled)
    for name, module, version in sources:
        hook = getattr(module, "dsv4hal_register", None)
        if hook is None:
            _fail(registry, name, "module has no dsv4hal_register(registry) hook", strict)
            continue
        pm.register(module, name=name)
        registry._current_plugin = name
        saved = (dict(registry.platforms), {op: dict(k) for op, k in registry.kernels.items()})
        try:
            hook(registry=registry)
        except Exception as exc:
            # a plugin that fails half-way leaves nothing behind
            registry.platforms, registry.kernels = saved[0], saved[1]
            _fail(registry, name, f"dsv4hal_register raised {type(exc).__name__}: {exc}", strict)
            continue
        registry.plugin_versions[name] = version
    registry._current_plugin = ""
    return registry.close()


def _fail(registry: Registry, name: str, why: str, strict: bool) -> None:
    registry.plugin_errors[name] = why
    msg = f"dsv4hal plugin {name!r} did not load: {why}"
    remedy = f"fix or uninstall the plugin, or disable it with DSV4HAL_DISABLE_PLUGINS={name}"
    if strict:
        raise PluginLoadError(msg, remedy=remedy)
    warnings.warn(f"{msg}. {remedy}", PluginWarning, stacklevel=3)


def import_target(target: str):  # type: ignore[no-untyped-def]
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)
