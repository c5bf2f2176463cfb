"""dsv4hal: one interface to DeepSeek-V4's kernels on Hopper, Blackwell, ROCm and the CPU.

    import dsv4hal
    platform = dsv4hal.select_platform()
    out, lse = platform.ops.sparse_attention_decode(q, swa_cache, swa_idx, swa_len, sink, scale, ...)

Importing this package is free: no torch, no CUDA, no Triton, no vendor library. Names below are
loaded on first use."""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

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
    "PreparedWeights": "dsv4hal.prepared",
}

__all__ = sorted(_LAZY) + ["__version__"]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'dsv4hal' has no attribute {name!r}")
    mod = importlib.import_module(module)
    value = mod if name == "errors" else getattr(mod, name)
    globals()[name] = value
    return value
