"""Collective ops: operations over a process group whose implementations (backends) are KernelImpl entries of the
main registry, chosen per platform and case by dsv4hal.selection like every kernel (priorities, requirements,
supports() reasons, DSV4HAL_KERNELS overrides, locks, explain), but not bound as `platform.ops.<op>` tensor calls:
the platform builds an object for a group (Platform.expert_parallel, Platform.tensor_parallel). Torch-free: read
by the registry, the overrides and the CLI without importing torch."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType


@dataclass(frozen=True)
class CollectiveSpec:
    """A collective op: its name, a one-line summary, the typical case explain and info decide without one, the
    case features a platform's device type sets (the device, the process group backend) and the closed sets of
    its case features' values (`dsv4hal explain --case`)."""

    name: str
    summary: str
    default_case: Mapping[str, object] = field(default_factory=dict)
    device_features: Mapping[str, Mapping[str, object]] = field(default_factory=dict)  # device type -> features
    choices: Mapping[str, tuple[object, ...]] = field(default_factory=dict)

    def case_on(self, device_type: str) -> dict[str, object]:
        """The default case as a platform of this device type ("cpu", "cuda") sees it."""
        return {**self.default_case, **self.device_features.get(device_type, {})}


EXPERT_PARALLEL = "expert_parallel"
TP_ALL_REDUCE = "tp_all_reduce"
EP_FUSED_MOE = "ep_fused_moe"

COLLECTIVES: tuple[CollectiveSpec, ...] = (
    CollectiveSpec(
        EXPERT_PARALLEL,
        "expert-parallel dispatch of routed tokens to the ranks holding their experts, and combine of the outputs",
        # V4-Flash over 8 GPUs: hidden 4096, top-6, 256 experts (32 a rank), prefill-shaped (normal mode)
        MappingProxyType(dict(world_size=8, group_backend="nccl", mode="normal", layout="standard", dtype="bf16",
                              hidden=4096, top_k=6, experts_per_rank=32, device="cuda")),
        MappingProxyType({"cpu": MappingProxyType({"device": "cpu", "group_backend": "gloo"})}),
        MappingProxyType({"group_backend": ("nccl", "gloo", "none"), "mode": ("normal", "decode"),
                          "layout": ("standard", "batched"), "dtype": ("bf16", "fp8"), "device": ("cpu", "cuda")})),
    CollectiveSpec(
        TP_ALL_REDUCE,
        "tensor-parallel all-reduce of the output projection's partial sums (optionally then mHC post and the "
        "residual)",
        # V4-Flash attention over 8 GPUs: hidden 4096, bf16 partials, a decode batch of up to 256 tokens a rank
        MappingProxyType(dict(world_size=8, group_backend="nccl", dtype="bf16", hidden=4096, max_tokens=256,
                              symm_mem="available", device="cuda")),
        MappingProxyType({"cpu": MappingProxyType({"device": "cpu", "group_backend": "gloo",
                                                   "symm_mem": "missing"})}),
        MappingProxyType({"group_backend": ("nccl", "gloo", "none"), "dtype": ("bf16", "fp32"),
                          "symm_mem": ("available", "missing"), "device": ("cpu", "cuda")})),
    CollectiveSpec(
        EP_FUSED_MOE,
        "a whole expert-parallel MoE layer in one call (dispatch, experts, combine): a fused vendor kernel, or the "
        "split expert_parallel dispatch + moe_experts + combine",
        # V4-Flash over 8 GPUs: 256 experts (32 a rank), top-6, hidden 4096, intermediate 2048, MXFP4 experts,
        # a decode batch of up to 256 tokens a rank
        MappingProxyType(dict(world_size=8, group_backend="nccl", weights="mxfp4", fp8="e4m3fn", hidden=4096,
                              intermediate=2048, top_k=6, experts_per_rank=32, max_tokens=256,
                              symm_mem="available", device="cuda")),
        MappingProxyType({"cpu": MappingProxyType({"device": "cpu", "group_backend": "gloo",
                                                   "symm_mem": "missing"})}),
        MappingProxyType({"group_backend": ("nccl", "gloo", "none"), "weights": ("mxfp4", "fp8_block"),
                          "symm_mem": ("available", "missing"), "device": ("cpu", "cuda")})),
)
COLLECTIVE_NAMES: tuple[str, ...] = tuple(c.name for c in COLLECTIVES)
COLLECTIVES_BY_NAME: Mapping[str, CollectiveSpec] = MappingProxyType({c.name: c for c in COLLECTIVES})
