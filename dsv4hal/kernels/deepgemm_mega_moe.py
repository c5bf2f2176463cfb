"""DeepGEMM Mega MoE (deepseek-ai/DeepGEMM, `deep_gemm`) as an ep_fused_moe backend: EP dispatch, linear 1, SwiGLU,
linear 2 and EP combine in one kernel that overlaps NVLink traffic with the tensor cores.

Facts used (DeepGEMM 2.6.1, main at 54e22612; deep_gemm/mega/__init__.py, csrc/apis/mega.hpp, tests/test_mega_moe.py,
README "Mega MoE"):
  * get_symm_buffer_for_mega_moe(group, num_experts, num_max_tokens_per_rank, num_topk, hidden, intermediate_hidden,
    mma_type="fp8xfp4") -> SymmBuffer: one int8 buffer from torch symmetric memory
    (torch.distributed._symmetric_memory.empty + rendezvous; plain torch.empty for a group of one; PyTorch >= 2.9),
    zeroed, then group.barrier(). Its views x, x_sf, topk_idx, topk_weights are the kernel's inputs: the caller
    copies each step's tokens into their first T rows. num_max_tokens_per_rank is rounded up to the kernel's token
    alignment; num_experts must be a multiple of the group size.
  * fp8_fp4_mega_moe(y, l1_weights, l2_weights, sym_buffer, cumulative_local_expert_recv_stats=None,
    recipe=(1, 1, 32), activation="swiglu", activation_clamp=None, fast_math=True): y bf16 [T, H] is written with
    the weighted sum of each token's experts. Activations FP8 e4m3 with one UE8M0 scale a 32 elements, packed four to
    an int32 (x_sf int32 [T, H/128]); weights FP4 e2m1 packed two a byte (low nibble: even element) as int8,
    l1 [E_local, 2I, H/2] (gate rows then up rows), l2 [E_local, H, I/2], their per-32 UE8M0 scales given as fp32
    to transform_sf_into_required_layout(sf, mn, k, (1, 32), E_local), then both pairs through
    transform_weights_for_mega_moe (gate/up rows interleaved by 8, scales transposed for UTCCP). topk_idx int64
    [T, k] physical experts (-1: none), topk_weights fp32. hidden and intermediate multiples of 128. SM100 only
    (arch major 10; any other arch is "Unsupported architecture"). bf16_mega_moe is the BF16 x BF16 form (dsv4hal
    has no BF16 expert format, so it is not bound).
  * "EP8 Mega MoE 56.5 us at batch 1": DeepGEMM PR #316's measurement of fp8_fp4_mega_moe for DeepSeek-V4-Flash
    (256 experts, top-6, hidden 4096, intermediate 2048) over 8 ranks (EP8) of an SM100 node with 1 token per rank,
    averaged over the ranks; 146.5 us at 512 tokens a rank.
  * SM90: fp8_mega_moe(y, l1_weights, l2_weights, sym_buffer, ..., recipe=(128, 128, 128), activation_clamp=...)
    from DeepGEMM PR #323 / #383 (csrc/apis/sm90_mega.hpp) and SGLang's sgl-deep-gemm (import name deep_gemm), not
    in 2.6.1: FP8 e4m3 weights with fp32 128x128 block scales (MN-major), FP8 activations with fp32 1x128 scales
    (x_sf fp32 [T, H/128]), weights through transform_weights_for_mega_moe_sm90; hidden and intermediate multiples of
    128 and intermediate <= 4096 (one bit a 64-column block of a uint64 mask); the symmetric buffer comes from the
    same get_symm_buffer_for_mega_moe on an SM90 device. Where deep_gemm lacks fp8_mega_moe, make_sm90 raises
    ImportError and selection falls back to the split path.

Shared by the cuda_sm90 and cuda_sm100 plugins, which register `kernel(platform, arch)`; this module imports torch and
deep_gemm inside the backend's methods only."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from dsv4hal.collectives import EP_FUSED_MOE
from dsv4hal.hardware import PlatformInfo
from dsv4hal.registry import KernelImpl

if TYPE_CHECKING:
    import torch

LIBRARY = "deep_gemm"
# above the split path (100): one kernel instead of dispatch, grouped GEMMs and combine with their launches and
# host-side exchange (DeepGEMM PR #316: 1.56x-1.96x over DeepEP + grouped GEMM at EP8)
MEGA_MOE_PRIORITY = 400
SM90_MAX_INTERMEDIATE = 4096
FP8_SCALE_GROUP = 32  # SM100 activations: one UE8M0 scale a 32 elements, four packed in an int32


def _common(case: Mapping[str, object]) -> list[str]:
    out = []
    if case["group_backend"] != "nccl" or case["device"] != "cuda":
        out.append(f"needs an NCCL group and CUDA tensors (got {case['group_backend']}, {case['device']})")
    if int(case["world_size"]) > 1 and case["symm_mem"] != "available":  # type: ignore[call-overload]
        out.append("needs torch symmetric memory (torch.distributed._symmetric_memory, PyTorch >= 2.9)")
    if not int(case["max_tokens"]):  # type: ignore[call-overload]
        out.append("needs max_tokens_per_rank (the symmetric buffer's rows)")
    for what in ("hidden", "intermediate"):
        if int(case[what]) % 128:  # type: ignore[call-overload]
            out.append(f"{what} {case[what]} is not a multiple of 128")
    return out


def supports_sm100(case: Mapping[str, object], info: PlatformInfo) -> list[str]:
    out = _common(case)
    if case["weights"] != "mxfp4":
        out.append(f"fp8_fp4_mega_moe runs MXFP4 experts (FP8 x FP4), got {case['weights']}")
    return out


def supports_sm90(case: Mapping[str, object], info: PlatformInfo) -> list[str]:
    out = _common(case)
    if case["weights"] != "fp8_block" or case["fp8"] != "e4m3fn":
        out.append(f"fp8_mega_moe runs fp8_block e4m3fn experts, got {case['weights']} ({case['fp8']})")
    if int(case["intermediate"]) > SM90_MAX_INTERMEDIATE:  # type: ignore[call-overload]
        out.append(f"intermediate {case['intermediate']} > {SM90_MAX_INTERMEDIATE} (SM90 kernel's block mask)")
    return out


def kernel(platform: str, arch: str) -> KernelImpl:
    """Mega MoE as the ep_fused_moe backend `deepgemm_mega_moe_<arch>` of `platform` (sm100: fp8_fp4_mega_moe;
    sm90: fp8_mega_moe)."""
    sm90 = arch == "sm90"
    return KernelImpl(EP_FUSED_MOE, f"deepgemm_mega_moe_{arch}", f"dsv4hal.kernels.deepgemm_mega_moe:make_{arch}",
                      (platform,), MEGA_MOE_PRIORITY, tier="vendor", requires=(LIBRARY,),
                      supports=supports_sm90 if sm90 else supports_sm100,
                      description="DeepGEMM Mega MoE: dispatch, FP8 x FP8 GEMMs, SwiGLU, combine in one kernel "
                                  "(fp8_mega_moe)" if sm90 else
                                  "DeepGEMM Mega MoE: dispatch, FP8 x FP4 GEMMs, SwiGLU, combine in one kernel "
                                  "(fp8_fp4_mega_moe)")


def _fp32_from_ue8m0(scale: torch.Tensor) -> torch.Tensor:
    """UE8M0 bytes -> the fp32 powers of two they encode (exponent bits placed, no arithmetic)."""
    import torch

    return (scale.to(torch.int32) << 23).view(torch.float32)


def quantize_acts_ue8m0(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """bf16 [T, H] -> (fp8 e4m3fn [T, H], int32 [T, H/128]: the per-32 UE8M0 scale bytes, four to an int32, the
    first group in the low byte), the activation format of fp8_fp4_mega_moe."""
    import torch

    from dsv4hal.formats.fp8_block import act_quant_groups

    q, scale = act_quant_groups(x, FP8_SCALE_GROUP, "e4m3fn", True, op="fp8_fp4_mega_moe")
    exp_bytes = ((scale.contiguous().view(torch.int32) >> 23) & 0xFF).to(torch.uint8)
    return q, exp_bytes.contiguous().view(torch.int32)


class MegaMoEBackend:
    """One symmetric buffer per process group, sized by the ExpertParallel's max_tokens_per_rank."""

    def __init__(self, arch: str) -> None:
        self.arch = arch
        self.name = f"deepgemm_mega_moe_{arch}"
        self._buffers: dict[int, Any] = {}

    def _buffer(self, ep: Any, intermediate: int) -> Any:
        import deep_gemm

        key = id(ep.group)
        if key not in self._buffers:
            self._buffers[key] = deep_gemm.get_symm_buffer_for_mega_moe(
                ep.group, ep.expert_map.num_physical, ep.max_tokens, ep.top_k, ep.hidden, intermediate)
        return self._buffers[key]

    def prepare(self, ep: Any, weights: Any) -> Any:
        import deep_gemm
        import torch

        if self.arch == "sm90":
            def mn_major(s: torch.Tensor) -> torch.Tensor:
                return deep_gemm.get_mn_major_tma_aligned_tensor(s.float())

            l1, l2 = deep_gemm.transform_weights_for_mega_moe_sm90(
                (weights.w13.contiguous(), mn_major(weights.w13_scale)),
                (weights.w2.contiguous(), mn_major(weights.w2_scale)))
        else:
            e, hidden, inter = weights.num_experts, weights.hidden, weights.intermediate

            def fp4(w: torch.Tensor, s: torch.Tensor, mn: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
                sf = deep_gemm.transform_sf_into_required_layout(_fp32_from_ue8m0(s), mn, k, (1, FP8_SCALE_GROUP), e)
                return w.contiguous().view(torch.int8), sf

            l1, l2 = deep_gemm.transform_weights_for_mega_moe(fp4(weights.w13, weights.w13_scale, 2 * inter, hidden),
                                                              fp4(weights.w2, weights.w2_scale, hidden, inter))
        return l1, l2, self._buffer(ep, weights.intermediate)

    def run(self, ep: Any, x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, state: Any,
            decode: bool, swiglu_limit: float) -> torch.Tensor:
        import deep_gemm
        import torch

        l1, l2, buf = state
        t = x.shape[0]
        phys = ep.expert_map.physical(topk_ids) if ep.expert_map.num_physical else topk_ids.long()
        if self.arch == "sm90":
            from dsv4hal.formats.fp8_block import act_quant_1x128

            q, sf = act_quant_1x128(x, "e4m3fn")
        else:
            q, sf = quantize_acts_ue8m0(x)
        buf.x[:t].copy_(q)
        buf.x_sf[:t].copy_(sf)
        buf.topk_idx[:t].copy_(phys)
        buf.topk_weights[:t].copy_(torch.where(phys >= 0, topk_weights, 0.0))
        y = torch.empty((t, ep.hidden), dtype=torch.bfloat16, device=x.device)
        run = deep_gemm.fp8_mega_moe if self.arch == "sm90" else deep_gemm.fp8_fp4_mega_moe
        run(y, l1, l2, buf, activation_clamp=float(swiglu_limit))
        return y


def make_sm100() -> MegaMoEBackend:
    return MegaMoEBackend("sm100")


def make_sm90() -> MegaMoEBackend:
    import deep_gemm

    if not hasattr(deep_gemm, "fp8_mega_moe"):
        raise ImportError("deep_gemm has no fp8_mega_moe (the SM90 Mega MoE: DeepGEMM with PR #383, or "
                          "sgl-deep-gemm); the split path runs instead")
    return MegaMoEBackend("sm90")
