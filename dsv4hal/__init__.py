"""dsv4hal: one interface to DeepSeek-V4's kernels on Hopper, Blackwell, ROCm and the CPU.

    import dsv4hal
    platform = dsv4hal.select_platform()
    out, lse = platform.ops.sparse_attention_decode(q, swa_cache, swa_idx, swa_len, sink, scale, ...)

Importing this package is free: no torch, no CUDA, no Triton, no vendor library. Names below are
loaded on first use; type checkers and IDEs read them from the TYPE_CHECKING imports."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# Each public name and the module it is loaded from on first use. The TYPE_CHECKING block below imports the same
# names from the same modules (tests/core/test_import_surface.py checks that they agree).
_LAZY = {
    "select_platform": "dsv4hal.platform",
    "load_registry": "dsv4hal.platform",
    "Platform": "dsv4hal.platform",
    "PlatformInfo": "dsv4hal.hardware",
    "Vendor": "dsv4hal.hardware",
    "detect": "dsv4hal.hardware",
    "simulated": "dsv4hal.hardware",
    "overrides": "dsv4hal.override",
    "Overrides": "dsv4hal.override",
    "Registry": "dsv4hal.registry",
    "KernelImpl": "dsv4hal.registry",
    "PlatformSpec": "dsv4hal.registry",
    "hookimpl": "dsv4hal.hookspecs",
    "Decision": "dsv4hal.selection",
    "OP_NAMES": "dsv4hal.ops.catalog",
    "errors": "dsv4hal.errors",
    "V4PagedCache": "dsv4hal.formats.v4_cache",
    "ExpertWeights": "dsv4hal.formats.experts",
    "quantize_experts": "dsv4hal.formats.experts",
    "quantize_fp8_block": "dsv4hal.formats.fp8_block",
    "PreparedWeights": "dsv4hal.prepared",
}

if TYPE_CHECKING:  # never run: the lazy __getattr__ below loads these at run time
    from dsv4hal import errors as errors
    from dsv4hal.formats.experts import ExpertWeights as ExpertWeights
    from dsv4hal.formats.experts import quantize_experts as quantize_experts
    from dsv4hal.formats.fp8_block import quantize_fp8_block as quantize_fp8_block
    from dsv4hal.formats.v4_cache import V4PagedCache as V4PagedCache
    from dsv4hal.hardware import PlatformInfo as PlatformInfo
    from dsv4hal.hardware import Vendor as Vendor
    from dsv4hal.hardware import detect as detect
    from dsv4hal.hardware import simulated as simulated
    from dsv4hal.hookspecs import hookimpl as hookimpl
    from dsv4hal.ops.catalog import OP_NAMES as OP_NAMES
    from dsv4hal.override import Overrides as Overrides
    from dsv4hal.override import overrides as overrides
    from dsv4hal.platform import Platform as Platform
    from dsv4hal.platform import load_registry as load_registry
    from dsv4hal.platform import select_platform as select_platform
    from dsv4hal.prepared import PreparedWeights as PreparedWeights
    from dsv4hal.registry import KernelImpl as KernelImpl
    from dsv4hal.registry import PlatformSpec as PlatformSpec
    from dsv4hal.registry import Registry as Registry
    from dsv4hal.selection import Decision as Decision

__all__ = sorted(_LAZY) + ["__version__"]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'dsv4hal' has no attribute {name!r}")
    mod = importlib.import_module(module)
    value = mod if name == "errors" else getattr(mod, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """The public API with the module's own names, before any is loaded (dir() and tab completion)."""
    return sorted({*globals(), *__all__})
