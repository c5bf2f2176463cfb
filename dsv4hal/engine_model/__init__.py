"""The engine-shaped model `dsv4hal demo` and `dsv4hal soak` run, on the public API only: three DSV4 layers
(SWA-only, C4 with the lightning indexer, C128), each followed by MoE and wrapped in mHC, over paged caches.

Modules: `config` (dimensions), `model` (weights, caches, forward pass, random fill), `timers` (per-op timing),
`tape` (record and replay op calls). The RoPE table and rotation are `dsv4hal.rope` (an engine computes them
itself; they are not ops). Neither the command line nor the references are imported here (tests/test_layers.py)."""

from __future__ import annotations

from dsv4hal.engine_model.config import C4_TOPK, D_HEAD, PAGE, RATIOS, ROPE, SIZES, WINDOW, DemoConfig
from dsv4hal.engine_model.model import DemoModel, fill_random
from dsv4hal.engine_model.tape import REPLAY_TOLERANCE, Tape, replay, tensors_of
from dsv4hal.engine_model.timers import NullTimer, OpTimer, Timer

__all__ = ["C4_TOPK", "D_HEAD", "PAGE", "RATIOS", "REPLAY_TOLERANCE", "ROPE", "SIZES", "WINDOW", "DemoConfig",
           "DemoModel", "NullTimer", "OpTimer", "Tape", "Timer", "fill_random", "replay", "tensors_of"]
