"""FlashInfer's MoE all-to-all (`flashinfer.comm.MoeAlltoAll`, the "throughput backend" ported from TensorRT-LLM)
as an expert-parallel backend of dsv4hal.distributed: decode mode with the standard layout.

Facts of FlashInfer (flashinfer-ai/flashinfer at fb28d72, flashinfer/comm/trtllm_moe_alltoall.py, its kernels in
csrc/trtllm_moe_alltoall.cu and csrc/nv_internal/tensorrt_llm/kernels/communicationKernels/moeAlltoAllKernels.cu):
- MoeAlltoAll(mapping, max_num_tokens, top_k, num_experts, workspace_size_per_rank, mnnvl_config=MnnvlConfig(
  comm_backend=...)) allocates one fixed workspace [ep_size, bytes_per_rank] uint8 (MnnvlMemory, flashinfer/comm/
  mnnvl.py) mapped into every rank; moe_a2a_get_workspace_size_per_rank(ep_size, max_num_tokens, dispatch bytes per
  token, combine bytes per token) sizes it. The rendezvous runs over a CommBackend (Get_rank, Get_size, allgather,
  bcast, barrier, Split): MPI by default, a torch.distributed adapter here.
- The memory is shared by CUDA FABRIC handles (multi-node NVLink, MNNVL: GB200 NVL72) or, since 0.6.16 (PR #3701),
  by POSIX file descriptors between the ranks of one host (any single NVLink node, H100/H200/B200 boxes included);
  ranks on several hosts without FABRIC support fail at setup. MoeAlltoAll itself is in releases from 0.6.0
  (PR #2102). This binding asks for 0.6.16, the first release that runs on a single node without MNNVL.
- dispatch(token_selected_experts int32 [T, k], payloads: up to 6 tensors [T, *] of any dtype, moved as bytes,
  runtime_max_tokens_per_rank, invalid_token_expert_id, expert_id_payload_index) -> one view per payload
  [ep_size, runtime_max_tokens_per_rank, *] into the workspace: row (source rank, i) is the i-th token that rank
  sent here. A token goes once to each distinct rank among its k experts (rank = expert // (num_experts / ep_size),
  contiguous blocks, the slots of dsv4hal's ExpertMap); a negative id is NOT skipped (-1 // n truncates to rank 0),
  so this binding reroutes every id outside [0, num_physical) to this rank and sends -1 in the ids payload.
  Rows past a source's count hold stale bytes; the expert-id payload named by expert_id_payload_index gets
  invalid_token_expert_id in them (moe_a2a_sanitize_expert_ids).
- combine(payload [ep_size, runtime_max_tokens_per_rank, H] bf16, runtime_max_tokens_per_rank) -> [T, H]: each
  token's rows from the ranks it went to, summed in fp32, unweighted: moe_experts' weighted rows of the standard
  layout are what it sums.
- Limits: top_k in {1, 2, 4, 6, 8, 10, 12, 14, 16, 18, 22}, ep_size <= 64, num_experts >= ep_size; kernels are
  compiled for __CUDA_ARCH__ >= 900 (SM90 and SM100 here). No host synchronisation and a fixed workspace: CUDA-graph
  capturable with a fixed runtime_max_tokens_per_rank (max_tokens_per_rank here).
- MoeAlltoAll is stateful: dispatch, then combine, then the next dispatch; the dispatched views are overwritten by
  the next dispatch. MnnvlMemory keeps one communicator per process: one expert-parallel group per process.

Shared by the cuda_sm90 and cuda_sm100 plugins, which register `kernel(platform, arch)` (metadata only: this module
imports torch and flashinfer inside the backend's methods)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from dsv4hal.collectives import EXPERT_PARALLEL
from dsv4hal.hardware import PlatformInfo
from dsv4hal.kernels import vendor_versions
from dsv4hal.registry import KernelImpl

if TYPE_CHECKING:
    import torch

LIBRARY = "flashinfer"
MIN_VERSION = (0, 6, 16)
# above the loop-back (300) and the torch collectives (200, 100): the kernels write tokens straight into the peers'
# workspace over NVLink (no all_to_all padding, no host-side split exchange). Below DeepEP (400): DeepEP's kernels
# are DeepSeek's own for this model's routing and neither has been timed against the other here, so DeepEP keeps
# any case both can serve until a bench says otherwise
FLASHINFER_A2A_PRIORITY = 380
TOP_KS = (1, 2, 4, 6, 8, 10, 12, 14, 16, 18, 22)
MAX_RANKS = 64
VECTOR = 8  # bf16 elements of the kernels' 16-byte copies


def supports(case: Mapping[str, object], info: PlatformInfo) -> list[str]:
    out = []
    world = int(case["world_size"])  # type: ignore[call-overload]
    if world == 1:
        out.append("world size 1: the loop-back moves nothing")
    elif world > MAX_RANKS:
        out.append(f"world size {world}: FlashInfer's all-to-all serves at most {MAX_RANKS} ranks")
    if case["group_backend"] != "nccl" or case["device"] != "cuda":
        out.append(f"needs an NCCL group and CUDA tensors (got {case['group_backend']}, {case['device']})")
    if case["mode"] != "decode" or case["layout"] != "standard":
        out.append(f"serves decode mode with the standard layout (rows per source rank in a fixed workspace); got "
                   f"{case['mode']} mode, {case['layout']} layout")
    if case["top_k"] not in TOP_KS:
        out.append(f"top_k {case['top_k']} is not one of the kernels' {TOP_KS}")
    if int(case["hidden"]) % VECTOR:  # type: ignore[call-overload]
        out.append(f"hidden {case['hidden']} is not a multiple of {VECTOR} (16-byte rows)")
    return out


def kernel(platform: str, arch: str) -> KernelImpl:
    """FlashInfer's all-to-all as the expert_parallel backend `flashinfer_a2a_<arch>` of `platform`."""
    return KernelImpl(EXPERT_PARALLEL, f"flashinfer_a2a_{arch}", "dsv4hal.kernels.flashinfer_a2a:make", (platform,),
                      FLASHINFER_A2A_PRIORITY, tier="vendor", requires=(LIBRARY,), supports=supports,
                      min_versions=(vendor_versions.flashinfer(MIN_VERSION, "whose all-to-all runs on one node "
                                                                            "without multi-node NVLink"),),
                      description="FlashInfer MoeAlltoAll (NVLink workspace, decode mode, standard layout)")


class _GroupComm:
    """FlashInfer's CommBackend over a torch.distributed group: the workspace's handle exchange runs on it."""

    def __init__(self, group: Any) -> None:
        self.group = group

    def Get_rank(self) -> int:  # noqa: N802 (FlashInfer's CommBackend names)
        import torch.distributed as dist

        return dist.get_rank(self.group)

    def Get_size(self) -> int:  # noqa: N802
        import torch.distributed as dist

        return dist.get_world_size(self.group)

    def allgather(self, data: Any) -> list[Any]:
        import torch.distributed as dist

        out: list[Any] = [None] * self.Get_size()
        dist.all_gather_object(out, data, group=self.group)
        return out

    def bcast(self, data: Any, root: int) -> Any:
        import torch.distributed as dist

        box = [data]
        dist.broadcast_object_list(box, src=dist.get_global_rank(self.group, root), group=self.group)
        return box[0]

    def barrier(self) -> None:
        import torch.distributed as dist

        dist.barrier(group=self.group)

    def Split(self, color: int, key: int) -> _GroupComm:  # noqa: N802
        # MnnvlMemory splits by (pp, cp) rank; the Mapping built here has pp = cp = 1, so every rank of the group
        # passes the same color and the split is the group itself
        return self


class FlashInferA2ABackend:
    name = "flashinfer_a2a"

    def __init__(self) -> None:
        self._a2a: dict[int, Any] = {}

    def _alltoall(self, ctx: Any) -> Any:
        key = id(ctx.group)
        if key not in self._a2a:
            from dsv4hal.errors import PluginFaultError, UnsupportedCaseError

            try:
                from flashinfer.comm import Mapping, MnnvlConfig, MoeAlltoAll, moe_a2a_get_workspace_size_per_rank
            except ImportError as exc:
                raise PluginFaultError(f"expert_parallel backend flashinfer_a2a: flashinfer.comm lacks the MoE "
                                       f"all-to-all ({exc})", remedy="install flashinfer >= 0.6.16, or "
                                       "DSV4HAL_KERNELS=expert_parallel=torch_all_to_all") from exc
            k, h, w = ctx.top_k, ctx.hidden, ctx.world_size
            fp8 = ctx.codec.fp8 is not None
            x_bytes = h + h // 128 * 4 if fp8 else h * 2  # fp8 rows and their fp32 1x128 scales, or bf16 rows
            size = moe_a2a_get_workspace_size_per_rank(w, ctx.max_tokens, x_bytes + k * 4 + k * 4, h * 2)
            try:
                self._a2a[key] = MoeAlltoAll(Mapping(world_size=w, rank=ctx.rank, tp_size=w, moe_ep_size=w),
                                             ctx.max_tokens, k, ctx.num_physical, workspace_size_per_rank=size,
                                             mnnvl_config=MnnvlConfig(comm_backend=_GroupComm(ctx.group)))
            except RuntimeError as exc:
                raise UnsupportedCaseError(f"expert_parallel backend flashinfer_a2a: the shared workspace could not "
                                           f"be set up ({exc})", remedy="run the ranks on one NVLink node or an "
                                           "MNNVL (FABRIC) system, or DSV4HAL_KERNELS=expert_parallel="
                                           "torch_all_to_all") from exc
        return self._a2a[key]

    def dispatch(self, ctx: Any, x: torch.Tensor, phys_ids: torch.Tensor, weights: torch.Tensor, layout: str,
                 decode: bool) -> Any:
        import torch

        from dsv4hal.distributed.backends.base import Pending
        from dsv4hal.distributed.contract import Dispatched, Handle

        a2a = self._alltoall(ctx)
        e, base, rows = ctx.experts_per_rank, ctx.rank * ctx.experts_per_rank, ctx.max_tokens * ctx.world_size
        ids = phys_ids.to(torch.int32)
        valid = (ids >= 0) & (ids < ctx.num_physical)
        # the kernel maps every id to a rank without a check: -1 (and any id outside the map) goes to this rank's
        # first slot, and the ids payload says -1, so no expert computes it and combine adds a zero row
        route = torch.where(valid, ids, base)
        sent = torch.where(valid, ids, -1)
        payloads: list[torch.Tensor] = [x.contiguous()]
        if ctx.codec.fp8 is not None:
            from dsv4hal.formats.fp8_block import act_quant_1x128

            payloads = list(act_quant_1x128(x, ctx.codec.fp8, pow2_scales=ctx.codec.pow2_scales))
        id_slot = len(payloads)
        recv = a2a.dispatch(route, [*payloads, sent, weights.to(torch.float32).contiguous()], ctx.max_tokens,
                            invalid_token_expert_id=-1, expert_id_payload_index=id_slot)
        got = recv[id_slot].reshape(rows, ctx.top_k)
        mine = (got >= base) & (got < base + e)
        local = torch.where(mine, got - base, -1)
        counts = torch.zeros(e + 1, dtype=torch.int32, device=x.device)  # slot e collects the -1 entries
        counts.scatter_add_(0, torch.where(mine, local, e).flatten().long(), torch.ones_like(local).flatten())
        xs = recv[0].reshape(rows, ctx.hidden)
        scale = recv[1].reshape(rows, -1) if id_slot == 2 else None
        none = torch.zeros(0, dtype=torch.bool, device=x.device)
        handle = Handle("standard", decode, x.shape[0], none, backend_state=a2a, out_rows=rows)
        # rows past a source's count keep stale workspace bytes: their ids are -1 and their weights zeroed here, as
        # the torch collectives' zero padding rows are
        w = torch.where(mine, recv[id_slot + 1].reshape(rows, ctx.top_k), 0.0)
        d = Dispatched(xs, scale, local, w, counts[:e], handle, "standard")
        return Pending([], lambda: d)

    def combine(self, ctx: Any, expert_out: torch.Tensor, handle: Any) -> Any:
        from dsv4hal.distributed.backends.base import Pending

        out = handle.backend_state.combine(expert_out.reshape(ctx.world_size, ctx.max_tokens, ctx.hidden),
                                           ctx.max_tokens)
        return Pending([], lambda: out)


def make() -> FlashInferA2ABackend:
    return FlashInferA2ABackend()
