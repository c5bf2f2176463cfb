"""The typed registry plugins fill: platforms (which hardware they claim) and kernel implementations
(which op, for which platforms, what they need, which cases they take, at what priority)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Literal

from dsv4hal.collectives import COLLECTIVES_BY_NAME, CollectiveSpec
from dsv4hal.errors import RegistryError
from dsv4hal.hardware import PlatformInfo, version_before
from dsv4hal.ops.catalog import OPS_BY_NAME, OpSpec

Case = Mapping[str, object]
Tier = Literal["vendor", "portable", "reference"]


PriorityWhen = tuple[Mapping[str, object], int | Mapping[str, int]]  # (condition, priority): KernelImpl.priority_when


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
    # capabilities kernels may ask for through KernelImpl.platform_capability (see Registry.add_platform):
    # the platform compiles and runs Triton kernels natively, so dsv4hal's portable Triton kernels apply to it
    runs_triton: bool = False

    def has(self, capability: str) -> bool:
        """Whether this platform declares `capability` (the name of one of its bool fields, e.g. runs_triton)."""
        return getattr(self, capability, False) is True


@dataclass(frozen=True)
class QueryHeads:
    """The query head counts (h_q) an attention kernel runs, declared where it is registered: one of `counts`, or
    any positive multiple of `multiple`. Its supports() refuses other counts with `reasons`; a tensor-parallel
    caller pads its heads to `padded` (dsv4hal.distributed.tp.attention_heads)."""

    counts: tuple[int, ...] = ()
    multiple: int = 1

    def padded(self, heads: int) -> int | None:
        """The smallest head count this kernel runs that holds `heads` (None: none does)."""
        if self.counts:
            return next((c for c in sorted(self.counts) if c >= heads), None)
        return -(-heads // self.multiple) * self.multiple

    def reasons(self, h_q: object, kernel: str) -> list[str]:
        """Why `kernel` cannot run `h_q` query heads (empty: it can)."""
        ok = isinstance(h_q, int) and h_q > 0 and (h_q in self.counts if self.counts else h_q % self.multiple == 0)
        if ok:
            return []
        need = " or ".join(map(str, self.counts)) if self.counts else f"a multiple of {self.multiple}"
        return [f"{kernel} needs h_q {need}, got {h_q}: pad the heads (dsv4hal.distributed.tp.pad_heads)"]


@dataclass(frozen=True)
class MinVersion:
    """The oldest release of a library a kernel requires that it runs with: `release`, the first release `brings`
    (what the kernel calls; named in the refusal, with `remedy` after "upgrade <label>"). Selection refuses an
    older installed version; an unknown or unparsable one is not judged older (hardware.version_before)."""

    library: str  # as PlatformInfo.libraries names it (and KernelImpl.requires)
    release: tuple[int, int, int]
    brings: str
    label: str = ""  # the library's name in the message (default: `library`)
    remedy: str = ""

    def reasons(self, info: PlatformInfo) -> list[str]:
        version = info.libraries.get(self.library, "")
        if not version_before(version, self.release):
            return []
        label = self.label or self.library
        return [f"{label} {version} predates {'.'.join(map(str, self.release))}, the first release {self.brings}; "
                f"upgrade {label}{self.remedy}"]


@dataclass(frozen=True)
class KernelImpl:
    """One implementation of one op.

    `target` is "module:function", imported only when the op is bound. `requires` names libraries
    (import names or torch-op namespaces as PlatformInfo.libraries lists them). `supports(case, info)`
    returns the reasons it cannot run a case (empty: it can). `priority` is explicit data, optionally
    per platform; higher wins. `layout` names the weight or cache layout this kernel fixes, and `prepare`
    the function that produces it. `platform_capability` offers the kernel to every platform that declares
    that capability (PlatformSpec.has), registered before or after it; the registry adds their names to
    `platforms`, so a portable kernel names no vendor platform."""

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
    platform_capability: str = ""
    # case-conditional priorities, explicit data: the first (condition, priority) whose condition's every
    # feature equals the case's replaces `priority` (e.g. ({"tokens": "prefill"}, 310): a kernel measured faster
    # only for one class of cases)
    priority_when: tuple[PriorityWhen, ...] = ()
    # why priority_when's priorities differ from `priority` (the measurement behind them), shown by explain and info
    priority_why: str = ""
    # False for a kernel that reads or writes where an index-like argument points without checking it against its
    # buffer (unchecked mode then cannot keep a bad index inside the buffers); `bounds_note` says which argument
    # and what it does. Shown by explain (docs/unchecked-indices.md)
    bounds_checked: bool = True
    bounds_note: str = ""
    # attention kernels: the query head counts the kernel runs (None: any count)
    query_heads: QueryHeads | None = None
    # the oldest releases of required libraries the kernel runs with (checked by selection before `supports`)
    min_versions: tuple[MinVersion, ...] = ()

    def priority_on(self, platform: str) -> int:
        return _resolve_priority(self.priority, platform)

    def priority_for(self, platform: str, case: Mapping[str, object]) -> int:
        """The priority selection uses for `case` on `platform`: a matching priority_when entry, else priority."""
        entry = self._priority_entry(case)
        return self.priority_on(platform) if entry is None else _resolve_priority(entry[1], platform)

    def priority_note(self, platform: str, case: Mapping[str, object]) -> str:
        """Where priority_for's value comes from when a priority_when condition matches the case: that condition
        and the kernel's own priority (for explain); '' where none matches and the own priority applies."""
        entry = self._priority_entry(case)
        if entry is None:
            return ""
        when = ", ".join(f"{f}={v}" for f, v in entry[0].items())
        why = f" ({self.priority_why})" if self.priority_why else ""
        return f"for {when}; {self.priority_on(platform)} otherwise{why}"

    def _priority_entry(self, case: Mapping[str, object]) -> PriorityWhen | None:
        for entry in self.priority_when:
            if all(case.get(f) == v for f, v in entry[0].items()):
                return entry
        return None

    def applies_to(self, platform: str) -> bool:
        return "*" in self.platforms or platform in self.platforms


def _resolve_priority(priority: int | Mapping[str, int], platform: str) -> int:
    if isinstance(priority, Mapping):
        return int(priority.get(platform, priority.get("*", 0)))
    return int(priority)


@dataclass(frozen=True)
class PluginEntries:
    """What one plugin registered: platform names, (op, kernel name) pairs and the ops it defines."""

    platforms: tuple[str, ...] = ()
    kernels: tuple[tuple[str, str], ...] = ()
    ops: tuple[str, ...] = ()


@dataclass
class Registry:
    """Filled by plugins, each inside its own scope(plugin), then closed: closing checks priority ties."""

    platforms: dict[str, PlatformSpec] = field(default_factory=dict)
    kernels: dict[str, dict[str, KernelImpl]] = field(default_factory=dict)  # op -> name -> impl
    # the ops: the built-in catalog's, then those plugins define (add_op); a platform binds every one
    ops: dict[str, OpSpec] = field(default_factory=lambda: dict(OPS_BY_NAME))
    # collective ops (dsv4hal.collectives): their kernels are chosen and explained like an op's, but a platform
    # builds an object for a process group from them instead of binding a tensor call
    collectives: dict[str, CollectiveSpec] = field(default_factory=lambda: dict(COLLECTIVES_BY_NAME))
    plugin_versions: dict[str, str] = field(default_factory=dict)
    plugin_errors: dict[str, str] = field(default_factory=dict)
    closed: bool = False
    strict: bool = False  # plugin faults found after loading raise instead of being recorded (plugins.py)
    registered: dict[str, PluginEntries] = field(default_factory=dict)  # plugin -> what its scope added
    _current_plugin: str = ""

    @contextmanager
    def scope(self, plugin: str) -> Iterator[None]:
        """Register as `plugin`: every entry added inside is attributed to it and, on success, recorded in
        `registered[plugin]`. If the block raises, or leaves a priority tie (the registry had none before,
        so this plugin brought it), everything it did is rolled back and the exception (for a tie, the
        RegistryError of first_tie) propagates: a plugin that fails half-way leaves nothing behind."""
        self._check_open()
        if self._current_plugin:
            raise RegistryError(f"scope({plugin!r}) opened inside scope({self._current_plugin!r})")
        platforms, kernels = dict(self.platforms), {op: dict(k) for op, k in self.kernels.items()}
        ops = dict(self.ops)
        self._current_plugin = plugin
        try:
            yield
            tie = self.first_tie()
            if tie is not None:
                raise tie
        except BaseException:  # SystemExit from a plugin is rolled back too; the host decides what to do
            self.platforms, self.kernels, self.ops = platforms, kernels, ops
            raise
        finally:
            self._current_plugin = ""
        self.registered[plugin] = PluginEntries(
            tuple(n for n in self.platforms if n not in platforms),
            tuple((op, n) for op, ks in self.kernels.items() for n in ks if n not in kernels.get(op, {})),
            tuple(n for n in self.ops if n not in ops))

    @property
    def op_names(self) -> tuple[str, ...]:
        """The ops of this registry, built-in ones first."""
        return tuple(self.ops)

    def add_op(self, spec: OpSpec) -> None:
        """An op a plugin defines (its dsv4hal_ops hook): platforms of this registry bind it."""
        self._check_open()
        if not isinstance(spec, OpSpec):
            raise RegistryError(f"plugin {self._current_plugin!r} gave {spec!r} as an op",
                                remedy="return dsv4hal.ops.catalog.OpSpec entries from dsv4hal_ops()")
        if spec.name in self.ops:
            raise RegistryError(f"op {spec.name!r} defined twice (the second by plugin {self._current_plugin!r})",
                                remedy="op names are unique; rename the plugin's op")
        self.ops[spec.name] = spec

    def add_platform(self, spec: PlatformSpec) -> None:
        self._check_open()
        if spec.name in self.platforms:
            other = self.platforms[spec.name].plugin
            raise RegistryError(f"platform {spec.name!r} registered twice (by {other!r} and {self._current_plugin!r})",
                                remedy="disable one of the plugins with DSV4HAL_DISABLE_PLUGINS")
        self.platforms[spec.name] = _with_plugin(spec, self._current_plugin)
        for impls in self.kernels.values():  # kernels offered by capability apply to this platform too
            for name, impl in impls.items():
                if impl.platform_capability and spec.has(impl.platform_capability) and not impl.applies_to(spec.name):
                    impls[name] = replace(impl, platforms=impl.platforms + (spec.name,))

    def add_kernel(self, impl: KernelImpl) -> None:
        self._check_open()
        if impl.op not in self.ops and impl.op not in self.collectives:
            raise RegistryError(f"plugin {self._current_plugin!r} registered kernel {impl.name!r} for unknown op "
                                f"{impl.op!r}", remedy=f"use one of: {', '.join((*self.ops, *self.collectives))}")
        if ":" not in impl.target:
            raise RegistryError(f"kernel {impl.name!r}: target {impl.target!r} is not 'module:function'")
        unrequired = [m.library for m in impl.min_versions if m.library not in impl.requires]
        if unrequired:
            raise RegistryError(f"kernel {impl.name!r}: min_versions names {', '.join(unrequired)}, which it does not "
                                "require", remedy="add the library to `requires`, or drop its minimum version")
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
                    # the unconditional priorities, and both kernels' under each condition either one states and
                    # under each pair of their conditions together (a case may meet one of each)
                    cases = ({}, *(when for when, _ in (*a.priority_when, *b.priority_when)),
                             *({**wa, **wb} for wa, _ in a.priority_when for wb, _ in b.priority_when))
                    for plat in _shared_platforms(a, b, self.platforms):
                        tied = next((c for c in cases if a.priority_for(plat, c) == b.priority_for(plat, c)), None)
                        if tied is not None:
                            where = f" for cases [{', '.join(f'{f}={v}' for f, v in tied.items())}]" if tied else ""
                            return RegistryError(
                                f"op {op!r}: kernels {a.name!r} ({a.plugin}) and {b.name!r} ({b.plugin}) both apply "
                                f"to platform {plat!r} at priority {a.priority_for(plat, tied)}{where}",
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
    return replace(obj, plugin=plugin)


def _shared_platforms(a: KernelImpl, b: KernelImpl, platforms: Mapping[str, PlatformSpec]) -> Iterable[str]:
    names = set(platforms)
    pa = names if "*" in a.platforms else set(a.platforms)
    pb = names if "*" in b.platforms else set(b.platforms)
    return sorted(pa & pb)
