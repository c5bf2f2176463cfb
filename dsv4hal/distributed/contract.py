"""Contract of expert-parallel dispatch and combine (the data an engine gets back, and argument validation).

dispatch(x bf16 [T, H], topk_ids int32 [T, k] logical (negative: dropped), topk_weights fp32 [T, k])
    -> Dispatched: the tokens this rank's experts need, in one of two layouts (vLLM's modular MoE names them):
       * "standard": rows [M, H], one per (source token, this rank) pair, with topk_ids int32 [M, k] in LOCAL
         expert ids (-1: a route to another rank, or dropped) and topk_weights [M, k]; moe_experts runs on it as is
         and returns the weighted sum of this rank's experts per row.
       * "batched": [E_local, max_tokens_per_rank * world_size, H], expert e's rows first, valid up to counts[e];
         the experts return their unweighted outputs in the same layout, combine applies the weights.
       With dtype "fp8" x is quantized on the way (1x128 block scales): x_scale fp32 [..., H / 128] beside fp8 x.
       counts int32 [E_local]: routes received per local expert; handle: what combine needs.
fused_moe(x, topk_ids, topk_weights, fused weights) -> bf16 [T, H]: dispatch, this rank's experts and combine in one
    call (dsv4hal.distributed.fused); the weights are prepared once for the backend chosen then.
combine(expert_out, handle) -> bf16 [T, H] on the token's rank: the sum of every rank's weighted expert outputs
    (for the standard layout moe_experts' rows; for the batched layout weights applied here, in fp32).

Decode mode: fixed worst-case buffers (max_tokens_per_rank rows from every rank), no host synchronisation, no
data-dependent shapes: capturable in a CUDA graph. Normal mode: exact sizes (one host sync for the split sizes)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from dsv4hal.checks import check_choice, check_tensor, show
from dsv4hal.distributed.fused_weights import FusedWeights
from dsv4hal.errors import InvalidArgumentError

DISPATCH_OP = "ep_dispatch"
COMBINE_OP = "ep_combine"
FUSED_OP = "ep_fused_moe"
Layout = Literal["standard", "batched"]
LAYOUTS = ("standard", "batched")
DTYPES = ("bf16", "fp8")
FP8_BLOCK = 128


@dataclass(frozen=True)
class Handle:
    """What combine needs to route outputs home. `sent` bool [W, T]: token t went to rank r (decode mode, and the
    combine of both modes); normal mode also keeps the sorted (rank, token) pairs and the split sizes."""

    layout: Layout
    decode: bool
    num_tokens: int
    sent: torch.Tensor
    send_tokens: torch.Tensor | None = None  # int64 [S]: token of each sent row, grouped by destination rank
    send_splits: tuple[int, ...] = ()
    recv_splits: tuple[int, ...] = ()
    recv_weights: torch.Tensor | None = None  # fp32 [M, k]: the weights combine applies (batched layout)
    slots: torch.Tensor | None = None  # int64 [M, k]: row of expert e's batch holding each route, -1 none
    recv_ids: torch.Tensor | None = None  # int32 [M, k] local ids (batched layout)
    backend_state: Any = None  # a backend's own handle (DeepEP's)
    out_rows: int = 0  # rows of the dispatched tokens (standard) or of each expert's batch (batched)


@dataclass
class Dispatched:
    x: torch.Tensor
    x_scale: torch.Tensor | None
    topk_ids: torch.Tensor | None  # standard layout: int32 [M, k] local ids; batched: None
    topk_weights: torch.Tensor | None
    counts: torch.Tensor  # int32 [E_local]
    handle: Handle
    layout: Layout
    extra: dict[str, Any] = field(default_factory=dict)

    def dequantized(self) -> torch.Tensor:
        """x as bf16 (fp8 x times its 1x128 block scales; bf16 x as is)."""
        if self.x_scale is None:
            return self.x
        from dsv4hal.formats.fp8_block import act_dequant_1x128

        flat = self.x.reshape(-1, self.x.shape[-1])
        if flat.shape[0] == 0:
            return torch.empty(self.x.shape, dtype=torch.bfloat16, device=self.x.device)
        scale = self.x_scale.reshape(flat.shape[0], self.x_scale.shape[-1])
        return act_dequant_1x128(flat, scale).to(torch.bfloat16).view(self.x.shape)


def _check_routed(op: str, x: object, topk_ids: object, topk_weights: object, hidden: int, top_k: int) -> int:
    """x bf16 [T, H], topk_ids int32 [T, k], topk_weights fp32 [T, k] on x's device; returns T."""
    xt = check_tensor(op, "x", x, dtype=torch.bfloat16, shape=(None, hidden))
    t = xt.shape[0]
    check_tensor(op, "topk_ids", topk_ids, dtype=torch.int32, shape=(t, top_k), device=xt.device)
    check_tensor(op, "topk_weights", topk_weights, dtype=torch.float32, shape=(t, top_k), device=xt.device)
    return t


def validate_dispatch(x: object, topk_ids: object, topk_weights: object, *, hidden: int, top_k: int,
                      max_tokens: int | None, layout: object, decode: bool) -> int:
    """Local checks of one rank's dispatch arguments; returns T. A batch over max_tokens_per_rank is reported by
    the caller (agreed on collectively), not raised here."""
    t = _check_routed(DISPATCH_OP, x, topk_ids, topk_weights, hidden, top_k)
    check_choice(DISPATCH_OP, "layout", layout, LAYOUTS)
    _check_worst_case(DISPATCH_OP, max_tokens, decode or layout == "batched")
    return t


def _check_worst_case(op: str, max_tokens: int | None, needed: bool) -> None:
    if needed and max_tokens is None:
        raise InvalidArgumentError(op, "max_tokens_per_rank", "a power of two (decode mode and the batched layout "
                                   "use worst-case buffers)", "None",
                                   remedy="build ExpertParallel(..., max_tokens_per_rank=N)")


def validate_combine(expert_out: object, handle: object, hidden: int, e_local: int) -> None:
    if not isinstance(handle, Handle):
        raise InvalidArgumentError(COMBINE_OP, "handle", "the Handle dispatch returned", type(handle).__name__)
    if handle.layout == "standard":
        shape: tuple[int, ...] = (handle.out_rows, hidden)
    else:
        shape = (e_local, handle.out_rows, hidden)
    check_tensor(COMBINE_OP, "expert_out", expert_out, dtype=torch.bfloat16, shape=shape)


def validate_max_tokens(value: object) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1 or value & (value - 1):
        raise InvalidArgumentError("ExpertParallel", "max_tokens_per_rank", "a power of two >= 1 (the worst-case "
                                   "buffers of decode mode are sized by it)", show(value),
                                   remedy="round the largest per-rank batch up to a power of two")
    return value


def validate_fused_weights(weights: object, *, hidden: int, experts_per_rank: int) -> None:
    """The local experts handed to prepare_fused_weights: ExpertWeights of this rank's physical slots."""
    from dsv4hal.formats.experts import ExpertWeights

    if not isinstance(weights, ExpertWeights):
        raise InvalidArgumentError(FUSED_OP, "weights", "ExpertWeights of this rank's experts", type(weights).__name__,
                                   remedy="dsv4hal.distributed.local_expert_weights(layer_weights, "
                                          "ep.local_experts())")
    if weights.num_experts != experts_per_rank or weights.hidden != hidden:
        raise InvalidArgumentError(FUSED_OP, "weights", f"{experts_per_rank} experts (this rank's physical slots) of "
                                   f"hidden {hidden}", f"{weights.num_experts} experts of hidden {weights.hidden}",
                                   remedy="pass this rank's experts only: local_expert_weights(layer_weights, "
                                          "ep.local_experts())")


def validate_fused(x: object, topk_ids: object, topk_weights: object, prepared: object, *, hidden: int, top_k: int,
                   experts_per_rank: int, max_tokens: int | None = None, decode: bool = False) -> int:
    """Local checks of one rank's fused_moe arguments (its split path's dispatch included); returns T."""
    if not isinstance(prepared, FusedWeights):
        raise InvalidArgumentError(FUSED_OP, "prepared", "the FusedWeights prepare_fused_weights returned",
                                   type(prepared).__name__, remedy="prepared = ep.prepare_fused_weights(local_weights)")
    if prepared.hidden != hidden or prepared.experts_per_rank != experts_per_rank:
        raise InvalidArgumentError(FUSED_OP, "prepared", f"weights of {experts_per_rank} experts of hidden {hidden}",
                                   f"{prepared.experts_per_rank} experts of hidden {prepared.hidden}",
                                   remedy="prepare the weights with the ExpertParallel that runs them")
    _check_worst_case(FUSED_OP, max_tokens, decode)
    return _check_routed(FUSED_OP, x, topk_ids, topk_weights, hidden, top_k)
