"""ExpertParallel: what an engine builds once per MoE layer group and calls every step.

    ep = platform.expert_parallel(dist.group.WORLD, num_experts=256, hidden=4096, top_k=6, max_tokens_per_rank=256)
    d = ep.dispatch(x, topk_ids, topk_weights, layout="standard")   # or dispatch_async(...).wait()
    y_local = platform.ops.moe_experts(d.dequantized(), d.topk_ids, d.topk_weights, my_prepared_weights)
    y = ep.combine(y_local, d.handle)                                # bf16 [T, H] on this rank

or the whole layer in one call (collective op ep_fused_moe, dsv4hal.distributed.fused: a fused vendor kernel where one
runs the case, the three steps above elsewhere):

    fw = ep.prepare_fused_weights(local_expert_weights(layer_weights, ep.local_experts()))
    y = ep.fused_moe(x, topk_ids, topk_weights, fw)

The backend is chosen per (mode, layout, device) by the platform, like a kernel (Platform.decide_collective with
its registry, overrides and lock; ep.explain(...) says why); every call first agrees
on errors across the group, so a problem on one rank raises ExpertParallelError on all of them."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from dsv4hal.distributed import agree as ag
from dsv4hal.distributed.backends import EP_OP
from dsv4hal.distributed.backends.base import EPContext, Pending
from dsv4hal.distributed.contract import (
    DISPATCH_OP,
    DTYPES,
    FUSED_OP,
    Dispatched,
    Handle,
    Layout,
    validate_combine,
    validate_dispatch,
    validate_fused,
    validate_fused_weights,
    validate_max_tokens,
)
from dsv4hal.distributed.expert_map import ExpertMap
from dsv4hal.distributed.packing import FP8_BLOCK, RowCodec
from dsv4hal.errors import Dsv4HalError, InvalidArgumentError
from dsv4hal.selection import Decision

if TYPE_CHECKING:
    from dsv4hal.distributed.fused import FusedWeights
    from dsv4hal.formats.experts import ExpertWeights

FINGERPRINT = ("num_experts", "num_physical", "hidden", "top_k", "max_tokens_per_rank", "dtype", "expert map")


def _group_shape(group: Any, world_size: int | None) -> tuple[int, int, str]:
    """(size, rank, backend name) of the group; one rank and no backend without one."""
    if group is None:
        return 1, 0, "none"
    import torch.distributed as dist

    return dist.get_world_size(group), dist.get_rank(group), str(dist.get_backend(group))


def _capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


class ExpertParallel:
    """Dispatch/combine of one expert-parallel group. Arguments are checked, then agreed on collectively: every rank
    raises ExpertParallelError if any rank passed a world size other than its group's, an expert map that misses a
    logical expert, or a config that differs from rank 0's."""

    def __init__(self, *, num_experts: int, hidden: int, top_k: int = 6, group: Any = None,
                 world_size: int | None = None, expert_map: ExpertMap | None = None,
                 max_tokens_per_rank: int | None = None, dtype: str = "bf16", fp8: str = "e4m3fn",
                 pow2_scales: bool = False, platform: Any = None, backend: str | None = None,
                 fused_backend: str | None = None) -> None:
        size, rank, self.group_backend = _group_shape(group, world_size)
        self.group, self.world_size, self.rank = group, size, rank
        self.platform, self.forced, self.forced_fused = platform, backend, fused_backend
        self.expert_map = expert_map if expert_map is not None else ExpertMap.identity(num_experts)
        code, value, local = ag.NO_ERROR, 0, None
        try:
            self.max_tokens = validate_max_tokens(max_tokens_per_rank)
            if dtype not in DTYPES or (dtype == "fp8" and hidden % FP8_BLOCK):
                raise InvalidArgumentError("ExpertParallel", "dtype", f"one of {DTYPES} (fp8: hidden a multiple of "
                                           f"{FP8_BLOCK})", f"{dtype!r} with hidden {hidden}")
            if world_size is not None and world_size != size:
                code, value = 3, world_size
                raise InvalidArgumentError("ExpertParallel", "world_size", f"the group's size {size}", f"{world_size}")
            problems = self.expert_map.problems(size)
            if self.expert_map.num_logical != num_experts:
                problems.append(f"it covers {self.expert_map.num_logical} logical experts, not {num_experts}")
            if problems:
                code = 4
                raise InvalidArgumentError("ExpertParallel", "expert_map", "a map serving every logical expert",
                                           "; ".join(problems))
        except InvalidArgumentError as exc:
            code, local = code or 1, exc
        self.num_experts, self.hidden, self.top_k, self.dtype = num_experts, hidden, top_k, dtype
        checksum = int(self.expert_map.replicas.long().flatten().mul(
            torch.arange(1, self.expert_map.replicas.numel() + 1)).sum()) if code != 4 else 0
        fingerprint = (num_experts, self.expert_map.num_physical, hidden, top_k, max_tokens_per_rank or 0,
                       DTYPES.index(dtype) if dtype in DTYPES else -1, checksum)
        nccl = torch.device("cuda", torch.cuda.current_device()) if self.group_backend == "nccl" else None
        ag.agree(group, size, rank, code, value, what="ExpertParallel setup", local=local, fingerprint=fingerprint,
                 fields=FINGERPRINT, device=nccl)  # NCCL reduces device tensors only
        self.codec = RowCodec(hidden, top_k, fp8 if dtype == "fp8" else None, pow2_scales)
        self.ctx = EPContext(group, size, rank, self.expert_map.num_physical, hidden, top_k, self.codec,
                             self.max_tokens)
        self.experts_per_rank = self.ctx.experts_per_rank
        self.recv_counts = torch.zeros(self.experts_per_rank, dtype=torch.int64)  # cumulative, for EPLB
        self._backends: dict[tuple[bool, str], tuple[Decision, Any]] = {}
        self._fused: dict[str, Any] = {}  # ep_fused_moe backend name -> its built backend

    # ---------------------------------------------------------------- selection

    def case(self, decode: bool, layout: Layout, device: str = "cpu") -> dict[str, object]:
        return {"world_size": self.world_size, "group_backend": self.group_backend,
                "mode": "decode" if decode else "normal", "layout": layout, "dtype": self.dtype,
                "hidden": self.hidden, "top_k": self.top_k, "experts_per_rank": self.experts_per_rank,
                "device": device}

    def decide(self, *, decode: bool = False, layout: Layout = "standard", device: str = "cpu") -> Decision:
        key = (decode, f"{layout}/{device}")
        if key not in self._backends:
            from dsv4hal.plugins import load_target

            p = self._platform()
            while True:  # a backend whose target does not import is marked broken by load_target: choose again
                decision = p.decide_collective(EP_OP, self.case(decode, layout, device), forced=self.forced)
                make = load_target(p.registry, decision.chosen)
                if make is not None:
                    break
            self._backends[key] = (decision, make())
        return self._backends[key][0]

    def explain(self, *, decode: bool = False, layout: Layout = "standard", device: str = "cpu") -> str:
        return self.decide(decode=decode, layout=layout, device=device).explain()

    def _platform(self) -> Any:
        if self.platform is None:
            import dsv4hal

            self.platform = dsv4hal.select_platform()
        return self.platform

    def _backend(self, decode: bool, layout: Layout, device: str) -> Any:
        self.decide(decode=decode, layout=layout, device=device)
        return self._backends[(decode, f"{layout}/{device}")][1]

    # ---------------------------------------------------------------- calls

    def dispatch_async(self, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, *,
                       layout: Layout = "standard", decode: bool = False) -> Pending[Dispatched]:
        """Start the dispatch (the exchange runs while the caller works); .wait() returns the Dispatched."""
        self._agreed(DISPATCH_OP, x, lambda: validate_dispatch(
            x, topk_ids, topk_weights, hidden=self.hidden, top_k=self.top_k, max_tokens=self.max_tokens,
            layout=layout, decode=decode))
        return self._start_dispatch(x, topk_ids, topk_weights, layout, decode)

    def _start_dispatch(self, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, layout: Layout,
                        decode: bool) -> Pending[Dispatched]:
        """The exchange of arguments the group has agreed are valid (dispatch_async, or fused_moe's split path,
        whose one agreement covers its dispatch)."""
        phys = self.expert_map.physical(topk_ids) if self.expert_map.num_physical else topk_ids.long()
        backend = self._backend(decode, layout, x.device.type)
        pending = backend.dispatch(self.ctx, x, phys, topk_weights, layout, decode)
        return Pending([pending], lambda: self._count(pending.wait()))

    def _agreed(self, what: str, x: object, check: Callable[[], int]) -> None:
        """Run this rank's checks (returning its token count T, held to max_tokens_per_rank), then agree on errors
        across the group: a problem on any rank raises ExpertParallelError on every rank."""
        code, value, local = ag.NO_ERROR, 0, None
        try:
            t = check()
            if self.max_tokens is not None and t > self.max_tokens:
                code, value = 2, t
                raise InvalidArgumentError(what, "x", f"at most max_tokens_per_rank = {self.max_tokens} tokens",
                                           f"{t}")
        except Dsv4HalError as exc:
            code, local = code or 1, exc
        if not _capturing():  # a captured graph has static shapes, agreed on when it was captured
            device = x.device if isinstance(x, torch.Tensor) and x.device.type != "cpu" else None
            ag.agree(self.group, self.world_size, self.rank, code, value, what=what, local=local,
                     device=device if self.group_backend == "nccl" else None)
        elif local is not None:
            raise local

    def _count(self, d: Dispatched) -> Dispatched:
        if self.recv_counts.device != d.counts.device:
            self.recv_counts = self.recv_counts.to(d.counts.device)
        self.recv_counts += d.counts
        return d

    def dispatch(self, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, *,
                 layout: Layout = "standard", decode: bool = False) -> Dispatched:
        return self.dispatch_async(x, topk_ids, topk_weights, layout=layout, decode=decode).wait()

    def combine_async(self, expert_out: torch.Tensor, handle: Handle) -> Pending[torch.Tensor]:
        """Start the combine of the experts' outputs (the layout dispatch returned); .wait() gives bf16 [T, H].
        Arguments were fixed by dispatch (agreed on then): only local checks here."""
        validate_combine(expert_out, handle, self.hidden, self.experts_per_rank)
        return self._backend(handle.decode, handle.layout, expert_out.device.type).combine(self.ctx, expert_out,
                                                                                            handle)

    def combine(self, expert_out: torch.Tensor, handle: Handle) -> torch.Tensor:
        return self.combine_async(expert_out, handle).wait()

    # ---------------------------------------------------------------- the whole layer (ep_fused_moe)

    def decide_fused(self, weights: ExpertWeights) -> Decision:
        """The ep_fused_moe backend for these local expert weights (their format and sizes are the case)."""
        return self._fused_backend(weights)[0]

    def explain_fused(self, weights: ExpertWeights) -> str:
        return self.decide_fused(weights).explain()

    def _fused_backend(self, weights: ExpertWeights) -> tuple[Decision, Any]:
        from dsv4hal.distributed.fused import fused_case
        from dsv4hal.plugins import load_target

        p = self._platform()
        case = fused_case(self, weights, weights.w13.device.type)
        while True:  # a backend whose target or vendor entry point does not import is marked broken: choose again
            decision = p.decide_collective(FUSED_OP, case, forced=self.forced_fused)
            make = load_target(p.registry, decision.chosen)
            if make is None:
                continue
            if decision.chosen.name not in self._fused:
                try:
                    self._fused[decision.chosen.name] = make()
                except ImportError as exc:
                    p.registry.disable_kernel(decision.chosen, f"plugin fault: {exc}")
                    continue
            return decision, self._fused[decision.chosen.name]

    def prepare_fused_weights(self, weights: ExpertWeights) -> FusedWeights:
        """This rank's experts (ExpertWeights of its physical slots) in the form the ep_fused_moe backend chosen for
        them runs; every rank calls it (a fused backend may set up its shared buffer here)."""
        from dsv4hal.distributed.fused import FusedWeights

        def check() -> int:
            validate_fused_weights(weights, hidden=self.hidden, experts_per_rank=self.experts_per_rank)
            return 0

        self._agreed(f"{FUSED_OP} (prepare weights)", None, check)
        decision, backend = self._fused_backend(weights)
        return FusedWeights(decision.chosen.name, weights.format, self.hidden, weights.intermediate,
                            self.experts_per_rank, backend.prepare(self, weights))

    def fused_moe(self, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, prepared: FusedWeights,
                  *, decode: bool = False, swiglu_limit: float = 10.0) -> torch.Tensor:
        """The MoE layer over the group: bf16 [T, H], each token's weighted sum of its routed experts' SwiGLU MLPs
        (logical topk_ids, negative: dropped), by the backend that prepared the weights."""
        self._agreed(FUSED_OP, x, lambda: validate_fused(x, topk_ids, topk_weights, prepared, hidden=self.hidden,
                                                         top_k=self.top_k, experts_per_rank=self.experts_per_rank,
                                                         max_tokens=self.max_tokens, decode=decode))
        return self._fused[prepared.backend].run(self, x, topk_ids, topk_weights, prepared.state, decode,
                                                 swiglu_limit)

    def reset_counters(self) -> torch.Tensor:
        """The routes received per local expert since the last reset (int64 [E_local]); zeroes them."""
        out = self.recv_counts.clone()
        self.recv_counts.zero_()
        return out

    def local_experts(self) -> list[int]:
        """The logical expert held by each of this rank's physical slots (-1: an empty slot)."""
        e = self.experts_per_rank
        return self.expert_map.logical_of_slots()[self.rank * e:(self.rank + 1) * e]


__all__ = ["EP_OP", "ExpertParallel"]
