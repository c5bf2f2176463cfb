"""vLLM 0.24's stable-ABI MoE library (`_moe_C_stable_libtorch.abi3.so`, registering `torch.ops._moe_C`),
shared by the Marlin MoE and the sqrt-softplus router bindings. It is not an importable module, so it
is found through VLLM_MOE_LIB (or an op already registered in the process); on a simulated machine the
PlatformInfo library key "vllm_moe" stands for it, keeping selection a function of the PlatformInfo."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dsv4hal.hardware import PlatformInfo

ENV_LIB = "VLLM_MOE_LIB"
LIBRARY_KEY = "vllm_moe"
NAMESPACE = "_moe_C"


def op_registered(name: str) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and hasattr(getattr(torch.ops, NAMESPACE), name)


def availability_reasons(info: PlatformInfo, op: str) -> list[str]:
    if info.detected_by == "simulated":
        return [] if info.has(LIBRARY_KEY) else [f"missing {LIBRARY_KEY} (the simulated machine lists no "
                                                 f"'{LIBRARY_KEY}' library)"]
    path = os.environ.get(ENV_LIB, "")
    if (path and os.path.isfile(path)) or op_registered(op):
        return []
    return [f"{ENV_LIB} is not set or does not exist (set it to vLLM 0.24's _moe_C_stable_libtorch.abi3.so)"]


def load_library(path: str | None, who: str) -> None:
    import torch

    if not path:
        raise RuntimeError(f"{who}: environment variable {ENV_LIB} is not set; set it to the path of vLLM 0.24's "
                           "_moe_C_stable_libtorch.abi3.so (it registers torch.ops._moe_C)")
    if not os.path.isfile(path):
        raise RuntimeError(f"{who}: {ENV_LIB}={path!r} is not a file")
    torch.ops.load_library(path)


def moe_op(name: str, who: str) -> Any:
    """torch.ops._moe_C.<name>, loading the library from VLLM_MOE_LIB unless the op is registered already."""
    import torch

    if not op_registered(name):
        load_library(os.environ.get(ENV_LIB), who)
        if not op_registered(name):
            raise RuntimeError(f"{who}: {os.environ.get(ENV_LIB)!r} (from {ENV_LIB}) did not register "
                               f"torch.ops.{NAMESPACE}.{name}")
    return getattr(getattr(torch.ops, NAMESPACE), name)
