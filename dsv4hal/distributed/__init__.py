"""Expert parallelism across ranks: dispatch of routed tokens to the ranks holding their experts and combine of the
experts' outputs back, with backends chosen like kernels (dsv4hal.distributed.backends; an engine gets one from
Platform.expert_parallel); tensor-parallel attention helpers and the all-reduce (dsv4hal.distributed.tp,
Platform.tensor_parallel). Importing this package imports no torch, no vendor library and initialises no device:
its names are loaded at first use, so the plugins' registration can read dsv4hal.distributed.backends."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dsv4hal.distributed.contract import Dispatched, Handle
    from dsv4hal.distributed.ep import ExpertParallel
    from dsv4hal.distributed.expert_map import ExpertMap
    from dsv4hal.distributed.experts import local_expert_weights, run_local_experts
    from dsv4hal.distributed.tp import TensorParallel, attention_heads, pad_heads, pad_to_largest_rank, unpad_heads

_WHERE = {"Dispatched": "contract", "Handle": "contract", "ExpertParallel": "ep", "ExpertMap": "expert_map",
          "local_expert_weights": "experts", "run_local_experts": "experts", "TensorParallel": "tp",
          "attention_heads": "tp", "pad_heads": "tp", "unpad_heads": "tp", "pad_to_largest_rank": "tp"}
__all__ = ["Dispatched", "ExpertMap", "ExpertParallel", "Handle", "TensorParallel", "attention_heads",
           "local_expert_weights", "pad_heads", "pad_to_largest_rank", "run_local_experts", "unpad_heads"]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
