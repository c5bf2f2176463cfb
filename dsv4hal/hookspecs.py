"""pluggy hook specifications. A plugin module (found through the `dsv4hal.platforms` entry-point
group) implements `dsv4hal_register(registry)`, marked with `hookimpl`, and adds platforms and kernels to
the registry. dsv4hal calls each plugin's hook once, on its own, inside `registry.scope(plugin)`.
Registration is metadata only: kernels are named by "module:function" strings, imported when bound."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from dsv4hal.registry import Registry

PROJECT = "dsv4hal"
ENTRY_POINT_GROUP = "dsv4hal.platforms"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def dsv4hal_register(registry: Registry) -> None:
    """Add PlatformSpec and KernelImpl entries with registry.add_platform / registry.add_kernel."""
