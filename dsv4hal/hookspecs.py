"""pluggy hook specifications. A plugin module (found through the `dsv4hal.platforms` entry-point
group) implements `dsv4hal_register(registry)`, marked with `hookimpl`, and adds platforms and kernels to
the registry; it may also implement `dsv4hal_ops()`, the ops it defines. dsv4hal calls each plugin's hooks once,
on their own, inside `registry.scope(plugin)`: its ops first, so its kernels may implement them.
Registration is metadata only: kernels are named by "module:function" strings, imported when bound, and ops by
their OpSpec (contract, reference and cases modules), imported when a platform binds them."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from dsv4hal.ops.catalog import OpSpec
    from dsv4hal.registry import Registry

PROJECT = "dsv4hal"
ENTRY_POINT_GROUP = "dsv4hal.platforms"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def dsv4hal_register(registry: Registry) -> None:
    """Add PlatformSpec and KernelImpl entries with registry.add_platform / registry.add_kernel."""


@hookspec
def dsv4hal_ops() -> list[OpSpec]:
    """The ops this plugin defines, each an OpSpec naming its contract, reference and conformance case modules
    (docs/adding-an-op.md); added to the registry's ops before the plugin's dsv4hal_register runs."""
