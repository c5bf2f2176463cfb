"""The typed registry plugins fill: platforms (which hardware they claim) and kernel implementations
(which op, for which platforms, what they need, which cases they take, at what priority)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from dsv4hal.errors import RegistryError
from dsv4hal.hardware import PlatformInfo
from dsv4hal.ops.catalog import OP_NAMES

Case = Mapping[str, object]
Tier = Literal["vendor", "portable", "reference"]


@dataclass(frozen=True)
class PlatformSpec:
    """A named target. `claims(info)` returns the reasons this platform does NOT fit the machine
    (empty: it fits). `priority` settles which of several fitting platforms auto-selection takes."""

    name: str
    description: str
    priority: int
    claims: Callable[[PlatformInfo], list[str]]
    device_type: str  # torch device type its tensors live on: "cpu" or "cuda" (ROCm uses "cuda" too)
    archs: tuple[str, ...] = ("cpu",)  # the architectures it is built for (the first one is used to simulate it)
    plugin: str = ""


@dataclass(frozen=True)
class KernelImpl:
    """One implementation of one op.

    `target` is "module:function", imported only when the op is bound. `requires` names libraries
    (import names or torch-op namespaces as PlatformInfo.libraries lists them). `supports(case, info)`
    returns the reasons it cannot run a case (empty: it can). `priority` is explicit data, optionally
    per platform; higher wins. `layout` names the weight or cache layout this kernel fixes, and `prepare`
    the function that produces it."""

    op: str
    name: str
    target: str
    platforms: tuple[str, ...]
    priority: int | Mapping[str, int]
    tier: Tier = "portable"
    requires: tuple[str, ...] = ()
    supports: Callable[[Case, PlatformInfo], list[str]] | None = None
    layout: str = ""
    description: str = ""
    plugin: str = ""
    # "module:function" turning logical weights into this kernel's layout (ops with weights only);
    # None keeps the logical layout
    prepare: str | None = None
    # set by dsv4hal when the kernel turned out broken (its target did not import): it is never chosen again
    fault: str = ""

    def priority_on(self, platform: str) -> int:
        if isinstance(self.priority, Mapping):
            return int(self.priority.get(platform, self.priority.get("*", 0)))
        return int(self.priority)

    def applies_to(self, platform: str) -> bool:
        return "*" in self.platforms or platform in self.platforms


@dataclass
class Registry:
    """Filled by plugins, then closed: closing checks names, ops and priority ties."""

    platforms: dict[str, PlatformSpec] = field(default_factory=dict)
    kernels: dict[str, dict[str, KernelImpl]] = field(default_factory=dict)  # op -> name -> impl
    plugin_versions: dict[str, str] = field(default_factory=dict)
    plugin_errors: dict[str, str] = field(default_factory=dict)
    closed: bool = False
    strict: bool = False  # plugin faults found after loading raise instead of being recorded (plugins.py)
    _current_plugin: str = ""

    def add_platform(self, spec: PlatformSpec) -> None:
        self._check_open()
        if spec.name in self.platforms:
            other = self.platforms[spec.name].plugin
            raise RegistryError(f"platform {spec.name!r} registered twice (by {other!r} and {self._current_plugin!r})",
                                remedy="disable one of the plugins with DSV4HAL_DISABLE_PLUGINS")
        self.platforms[spec.name] = _with_plugin(spec, self._current_plugin)

    def add_kernel(self, impl: KernelImpl) -> None:
        self._check_open()
        if impl.op not in OP_NAMES:
            raise RegistryError(f"plugin {self._current_plugin!r} registered kernel {impl.name!r} for unknown op "
                                f"{impl.op!r}", remedy=f"use one of: {', '.join(OP_NAMES)}")
        if ":" not in impl.target:
            raise RegistryError(f"kernel {impl.name!r}: target {impl.target!r} is not 'module:function'")
        by_name = self.kernels.setdefault(impl.op, {})
        if impl.name in by_name:
            raise RegistryError(
                f"kernel {impl.name!r} for op {impl.op!r} registered twice (by {by_name[impl.name].plugin!r} and "
                f"{self._current_plugin!r})", remedy="kernel names must be unique per op; rename one")
        by_name[impl.name] = _with_plugin(impl, self._current_plugin)

    def first_tie(self) -> RegistryError | None:
        """The first priority tie, as the error close() raises: two kernels of one op that may both apply to
        a platform at the same priority would make the choice depend on registration order."""
        for op, impls in self.kernels.items():
            items = list(impls.values())
            for i, a in enumerate(items):
                for b in items[i + 1:]:
                    for plat in _shared_platforms(a, b, self.platforms):
                        if a.priority_on(plat) == b.priority_on(plat):
                            return RegistryError(
                                f"op {op!r}: kernels {a.name!r} ({a.plugin}) and {b.name!r} ({b.plugin}) both apply "
                                f"to platform {plat!r} at priority {a.priority_on(plat)}",
                                remedy="give them distinct priorities (order of registration never decides), "
                                       "or disable one plugin with DSV4HAL_DISABLE_PLUGINS")
        return None

    def close(self) -> Registry:
        """Refuse priority ties (see first_tie), then accept no more registrations."""
        tie = self.first_tie()
        if tie is not None:
            raise tie
        self.closed = True
        return self

    def disable_kernel(self, impl: KernelImpl, why: str) -> None:
        """Mark a kernel broken (e.g. its target does not import): selection rejects it with `why` from now on."""
        from dataclasses import replace

        by_name = self.kernels.get(impl.op, {})
        if impl.name in by_name:
            by_name[impl.name] = replace(by_name[impl.name], fault=why)

    def kernels_for(self, op: str) -> list[KernelImpl]:
        return list(self.kernels.get(op, {}).values())

    def requirements(self) -> set[str]:
        return {r for impls in self.kernels.values() for k in impls.values() for r in k.requires}

    def _check_open(self) -> None:
        if self.closed:
            raise RegistryError("the registry is closed; register from a plugin's dsv4hal_register hook")


def _with_plugin(obj: PlatformSpec | KernelImpl, plugin: str):  # type: ignore[no-untyped-def]
    if obj.plugin:
        return obj
    from dataclasses import replace

    return replace(obj, plugin=plugin)


def _shared_platforms(a: KernelImpl, b: KernelImpl, platforms: Mapping[str, PlatformSpec]) -> Iterable[str]:
    names = set(platforms)
    pa = names if "*" in a.platforms else set(a.platforms)
    pb = names if "*" in b.platforms else set(b.platforms)
    return sorted(pa & pb)
