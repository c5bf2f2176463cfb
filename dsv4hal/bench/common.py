"""Helpers shared by the benchmarks."""

from __future__ import annotations

from typing import Any

from dsv4hal.override import overrides


def bound_op(platform: Any, op: str, impl: str, *, validate: bool = True) -> Any:
    """The bound op of a platform whose choice for `op` is forced to `impl`."""
    import dsv4hal

    with overrides(kernels={op: impl}):
        p = dsv4hal.select_platform(platform.name, info=platform.info, registry=platform.registry,
                                    validate=validate)
    return p.ops[op]


def candidates(platform: Any, op: str, *, with_reference: bool = False, case: Any = None) -> list[str]:
    return [c.name for c in platform.ops[op].decide(case).candidates
            if c.status != "rejected" and (with_reference or c.tier != "reference")]
