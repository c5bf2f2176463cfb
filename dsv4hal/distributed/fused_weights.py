"""The prepared weights of the collective op ep_fused_moe (dsv4hal.distributed.fused): what the contract checks and
every backend returns. No torch here: the plugins' registration imports this module."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class FusedWeights:
    """This rank's experts as the chosen backend holds them. `backend`: the ep_fused_moe entry that prepared them
    (fused_moe runs that one); `state`: the backend's own form of the weights."""

    backend: str
    format: str
    hidden: int
    intermediate: int
    experts_per_rank: int
    state: Any
