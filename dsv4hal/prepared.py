"""Weights prepared for one kernel. Kernel choice fixes the weight layout (Marlin repacks, TRTLLM-Gen
shuffles, DeepGEMM wants its scale layout), so an op with weights is decided when the weights are
prepared, and that choice is kept: later calls run the implementation that prepared them, or fail."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class PreparedWeights:
    op: str
    implementation: str
    layout: str
    platform: str
    case: Mapping[str, object]  # features of the logical weights (format, sizes) the choice was made on
    payload: Any  # the implementation's own layout
    # the fast path's token for these weights (dsv4hal.dispatch.fast_path), made on their first call
    _memo_token: object | None = field(default=None, init=False, repr=False, compare=False)

    def describe(self) -> str:
        return (f"weights prepared for {self.op} by {self.implementation} (layout {self.layout or 'reference'}) "
                f"on platform {self.platform}")

    def __repr__(self) -> str:  # the payload's tensors are summarised, never dumped
        return (f"PreparedWeights(op={self.op!r}, implementation={self.implementation!r}, layout={self.layout!r}, "
                f"platform={self.platform!r}, case={dict(self.case)!r}, payload={type(self.payload).__name__})")


@dataclass(frozen=True)
class ExpertTensors:
    """MoE expert weights as one kernel lays them out (a moe_experts payload); kernels subclass it with what
    else they keep. The tensors' dtypes and shapes are each kernel's own (documented on the subclass)."""

    w13: torch.Tensor
    w13_scale: torch.Tensor
    w2: torch.Tensor
    w2_scale: torch.Tensor
    num_experts: int
    hidden: int
    intermediate: int
