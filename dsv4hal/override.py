"""Overrides: the environment (DSV4HAL_PLATFORM, DSV4HAL_KERNELS, DSV4HAL_DISABLE_PLUGINS, DSV4HAL_STRICT,
DSV4HAL_LOCK, DSV4HAL_LOCK_MISMATCH; DSV4HAL_NATIVE_GLUE is checked here too) and the same settings in code
through the `overrides(...)` context manager, which wins over the environment. A forced choice that
cannot run is an error; nothing falls back silently."""

from __future__ import annotations

import contextlib
import contextvars
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace

from dsv4hal.collectives import COLLECTIVE_NAMES
from dsv4hal.errors import BadOverrideError
from dsv4hal.kernels import native_glue
from dsv4hal.ops.catalog import OP_NAMES

# names DSV4HAL_KERNELS and overrides(kernels=...) may force: the ops and the collective ops (their backends)
FORCEABLE = (*OP_NAMES, *COLLECTIVE_NAMES)
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


@dataclass(frozen=True)
class Overrides:
    platform: str | None = None
    kernels: Mapping[str, str] = field(default_factory=dict)  # op -> implementation name
    disabled_plugins: frozenset[str] = frozenset()
    strict: bool = False
    lock: str | None = None  # DSV4HAL_LOCK: a lock file from `dsv4hal tune` (dsv4hal.lock)
    lock_mismatch: str = "error"  # DSV4HAL_LOCK_MISMATCH: "error" or "reselect" (accept static selection)
    # where each setting came from: "env" or "api"
    sources: Mapping[str, str] = field(default_factory=dict)

    def kernel_source(self, op: str) -> str:
        return self.sources.get(f"kernels.{op}", "env")


def parse_kernels(text: str, *, origin: str = "DSV4HAL_KERNELS") -> dict[str, str]:
    """'op=impl,op2=impl2' -> {op: impl}. Op names are checked here; impl names when selecting."""
    out: dict[str, str] = {}
    for item in (p.strip() for p in text.split(",")):
        if not item:
            continue
        op, sep, impl = (s.strip() for s in item.partition("="))
        if not sep or not op or not impl:
            raise BadOverrideError(f"{origin}: malformed entry {item!r}; expected 'op=implementation'",
                                   remedy="write e.g. DSV4HAL_KERNELS='sparse_attention_decode=flashmla_sm90'")
        if op not in FORCEABLE:
            raise BadOverrideError(f"{origin}: unknown op {op!r}", remedy=f"valid ops: {', '.join(FORCEABLE)}")
        if op in out and out[op] != impl:
            raise BadOverrideError(f"{origin}: op {op!r} forced twice ({out[op]!r} and {impl!r})")
        out[op] = impl
    return out


def parse_bool(text: str, *, origin: str) -> bool:
    t = text.strip().lower()
    if t in _TRUE:
        return True
    if t in _FALSE:
        return False
    raise BadOverrideError(f"{origin}: {text!r} is not a boolean", remedy="use 1 or 0")


def from_env(environ: Mapping[str, str] | None = None) -> Overrides:
    env = os.environ if environ is None else environ
    platform = env.get("DSV4HAL_PLATFORM", "").strip() or None
    kernels = parse_kernels(env.get("DSV4HAL_KERNELS", ""))
    disabled = frozenset(p.strip() for p in env.get("DSV4HAL_DISABLE_PLUGINS", "").split(",") if p.strip())
    strict = parse_bool(env.get("DSV4HAL_STRICT", "0"), origin="DSV4HAL_STRICT")
    sources = {"platform": "env", "strict": "env", **{f"kernels.{op}": "env" for op in kernels}}
    lock = env.get("DSV4HAL_LOCK", "").strip() or None
    lock_mismatch = env.get("DSV4HAL_LOCK_MISMATCH", "").strip() or "error"
    if lock_mismatch not in ("error", "reselect"):
        raise BadOverrideError(f"DSV4HAL_LOCK_MISMATCH={lock_mismatch!r} is not a policy",
                               remedy="use error or reselect")
    native_glue.mode()  # read at a kernel's first call: a value it does not know is refused at selection
    return Overrides(platform=platform, kernels=kernels, disabled_plugins=disabled, strict=strict, sources=sources,
                     lock=lock, lock_mismatch=lock_mismatch)


_api_layer: contextvars.ContextVar[Overrides | None] = contextvars.ContextVar("dsv4hal_overrides", default=None)


def current(environ: Mapping[str, str] | None = None) -> Overrides:
    """The environment's overrides with the innermost `overrides(...)` context applied on top."""
    base = from_env(environ)
    api = _api_layer.get()
    if api is None:
        return base
    return merge(base, api)


def merge(base: Overrides, top: Overrides) -> Overrides:
    sources = dict(base.sources)
    sources.update(top.sources)
    return Overrides(
        platform=top.platform or base.platform,
        kernels={**base.kernels, **top.kernels},
        disabled_plugins=base.disabled_plugins | top.disabled_plugins,
        strict=top.strict if "strict" in top.sources else base.strict,
        sources=sources,
        lock=top.lock or base.lock,
        lock_mismatch=top.lock_mismatch if "lock_mismatch" in top.sources else base.lock_mismatch,
    )


@contextlib.contextmanager
def overrides(*, platform: str | None = None, kernels: Mapping[str, str] | str | None = None,
              disable_plugins: tuple[str, ...] = (), strict: bool | None = None) -> Iterator[Overrides]:
    """Force choices in code, e.g. `with dsv4hal.override(kernels={"indexer_topk": "triton_radix"}): ...`.
    Nested contexts stack; the innermost wins. Applies to select_platform() calls made inside."""
    ks = parse_kernels(kernels, origin="overrides(kernels=...)") if isinstance(kernels, str) else dict(kernels or {})
    for op in ks:
        if op not in FORCEABLE:
            raise BadOverrideError(f"overrides(kernels=...): unknown op {op!r}",
                                   remedy=f"valid ops: {', '.join(FORCEABLE)}")
    sources = {f"kernels.{op}": "api" for op in ks}
    if platform:
        sources["platform"] = "api"
    if strict is not None:
        sources["strict"] = "api"
    layer = Overrides(platform=platform, kernels=ks, disabled_plugins=frozenset(disable_plugins),
                      strict=bool(strict), sources=sources)
    outer = _api_layer.get()
    token = _api_layer.set(merge(outer, layer) if outer else layer)
    try:
        yield current()
    finally:
        _api_layer.reset(token)


def with_kernel(ov: Overrides, op: str, impl: str) -> Overrides:
    return replace(ov, kernels={**ov.kernels, op: impl}, sources={**ov.sources, f"kernels.{op}": "api"})
