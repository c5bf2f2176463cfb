"""Expert parallelism across ranks: dispatch of routed tokens to the ranks holding their experts and combine of the
experts' outputs back, with backends chosen like kernels (dsv4hal.distributed.backends). Importing this package
imports no vendor library and initialises no device."""

from __future__ import annotations

from dsv4hal.distributed.contract import Dispatched, Handle
from dsv4hal.distributed.ep import ExpertParallel
from dsv4hal.distributed.expert_map import ExpertMap
from dsv4hal.distributed.experts import local_expert_weights, run_local_experts

__all__ = ["Dispatched", "ExpertMap", "ExpertParallel", "Handle", "local_expert_weights", "run_local_experts"]
