"""KernelImpl entries for the portable Triton kernels. They are offered by capability: every platform whose
PlatformSpec says `runs_triton` (registered before or after this plugin) gets them below its vendor kernels;
no vendor platform is named here. The CPU platform gets them only under Triton's interpreter
(TRITON_INTERPRET=1, for tests), below the reference, so there they run only when forced."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from dsv4hal.hardware import PlatformInfo
from dsv4hal.registry import KernelImpl, Registry

CAPABILITY = "runs_triton"  # PlatformSpec.runs_triton: the platform compiles Triton kernels natively
NATIVE_PRIORITY = 100  # below every vendor kernel (>= 250), above the reference (0)
INTERPRETED_PRIORITY = -10  # the CPU under TRITON_INTERPRET=1: below the reference, so only when forced
PRIORITY = {"*": NATIVE_PRIORITY, "cpu": INTERPRETED_PRIORITY}
_MOD = "dsv4hal.kernels.triton"
Supports = Callable[[Mapping[str, object], PlatformInfo], list[str]]


def interpreter_on_cpu(case: Mapping[str, object], info: PlatformInfo) -> list[str]:
    if not info.is_gpu and "triton-interpreter" not in info.libraries:
        return ["on the CPU Triton runs only under its interpreter: set TRITON_INTERPRET=1 (tests only)"]
    return []


def _route_supports(case: Mapping[str, object], info: PlatformInfo) -> list[str]:
    reasons = interpreter_on_cpu(case, info)
    e, k = case.get("E"), case.get("top_k")
    if isinstance(e, int) and e > 1024 or isinstance(k, int) and k > 16:
        reasons.append(f"triton_moe_route holds up to 1024 experts and top_k <= 16 in registers; got E={e}, "
                       f"top_k={k}")
    return reasons


ROW_TOPK_MAX = 16384  # topk_row.MAX_ROW: the widest row one program holds, the op's case size=small


def _row_topk_supports(case: Mapping[str, object], info: PlatformInfo) -> list[str]:
    reasons = interpreter_on_cpu(case, info)
    if case.get("size") == "large":
        reasons.append(f"triton_row_topk holds one row in registers, at most {ROW_TOPK_MAX} scores (case "
                       f"size=small); this case is wider (size=large): triton_radix_topk or triton_chunked_topk "
                       "takes it")
    return reasons


def _chunked_topk_supports(case: Mapping[str, object], info: PlatformInfo) -> list[str]:
    reasons = interpreter_on_cpu(case, info)
    if case.get("size") == "small":
        reasons.append(f"triton_chunked_topk splits rows wider than {ROW_TOPK_MAX} scores (case size=large); a row "
                       "this narrow (size=small) fits one program: triton_row_topk takes it")
    # The case carries no width: rows past topk_chunked.max_width(k) (16384 // k chunks of 16384 scores:
    # 262144 at k=1024, 524288 at k=512) are refused by the kernel with a ValueError naming triton_radix_topk
    return reasons


def _offload_supports(case: Mapping[str, object], info: PlatformInfo) -> list[str]:
    reasons = interpreter_on_cpu(case, info)
    if case.get("host") == "pageable":
        reasons.append("triton_offload_fetch reads the pool through its device mapping: pin it (pin_memory()) or "
                       "keep it on the device")
    return reasons


def register(registry: Registry) -> None:
    common = dict(platforms=("cpu",), platform_capability=CAPABILITY, priority=PRIORITY, tier="portable",
                  requires=("triton",), supports=interpreter_on_cpu)
    registry.add_kernel(KernelImpl(op="pack_store", name="triton_pack_store",
                                   target=f"{_MOD}.v4_cache_kernels:pack_store", layout="v4-584",
                                   description="one program per token, bit-identical to the reference", **common))
    registry.add_kernel(KernelImpl(op="dequant_gather", name="triton_dequant_gather",
                                   target=f"{_MOD}.v4_cache_kernels:dequant_gather", layout="v4-584",
                                   description="cache rows to the bf16 prefill workspace", **common))

    def topk(name: str, module: str, offset: int, description: str, supports: Supports = interpreter_on_cpu) -> None:
        """An indexer_topk kernel `offset` above (or below) the portable priority."""
        registry.add_kernel(KernelImpl(op="indexer_topk", name=name, target=f"{_MOD}.{module}:indexer_topk",
                                       description=description, **{**common, "supports": supports, "priority": {
                                           p: v + offset for p, v in PRIORITY.items()}}))

    topk("triton_radix_topk", "topk", 0, "radix select on order-preserving 32-bit keys (4 histogram levels of 8 bits "
         "find the k-th key), then an atomic collect pass with the page transform")
    # above triton_radix_topk where a row fits it (size=small): 3.0-3.7x faster at 8192 scores on the H200, and 3.1-3.7x
    # in every tuned bucket (bench/results/h200/bench-topk.json, cuda_sm90.lock.json)
    topk("triton_row_topk", "topk_row", 2, "one launch, one program per row of at most 16384 scores: the row as a "
         "register tile of 32-bit keys, bisection over the key bits for the exact k-th key, one prefix sum for the "
         "output slots", _row_topk_supports)
    # below the radix and sampled kernels: it holds rows of at most 16384 // k chunks (262144 scores at k=1024) and the
    # case carries no width, so the static choice stays a kernel that takes any width; a lock picks it per bucket (it
    # beat the radix kernel in 10 of 12 wide shapes, bench-topk.json; the sampled kernel beats it in 10 of 12), and a
    # wider row then raises UnsupportedCaseError naming the radix kernel
    topk("triton_chunked_topk", "topk_chunked", -1, "two launches for rows wider than 16384 scores: each chunk's exact "
         "top-k (the row kernel's bisection) to a candidate buffer in index order, then one program a row selects "
         "among the <= 16384 candidates and writes the outputs", _chunked_topk_supports)
    # above triton_radix_topk (and the chunked kernel): faster at every wide shape of bench-topk.json on the H200
    # (64 x 262144 in 46.8 us through the bound op, 5.3x torch.topk and 2.91x its bandwidth floor;
    # 1 x 262144 in 15.6 us), any width (its fallback is the radix kernel past the chunked kernel's
    # width); below triton_row_topk, which is faster where a row fits it
    topk("triton_sampled_topk", "topk_sampled", 1, "3 launches for wide rows: a threshold from 2048 or 4096 sampled "
         "scores (about 2k keys above it), one read appending the keys above it to a candidate tile, the exact select "
         "there; rows whose estimate missed run the chunked kernel inside the select launch (the radix kernel's "
         "launches past its width)")
    registry.add_kernel(KernelImpl(op="sparse_attention_decode", name="triton_sparse_decode",
                                   target=f"{_MOD}.sparse_attention:sparse_attention_decode",
                                   layout="v4-584 (e4m3fn or e4m3fnuz)",
                                   description="gather + in-register FP8 dequant + online softmax, split-K",
                                   **common))
    registry.add_kernel(KernelImpl(op="sparse_attention_prefill", name="triton_sparse_prefill",
                                   target=f"{_MOD}.sparse_attention:sparse_attention_prefill",
                                   description="the decode kernel over a bf16 workspace", **common))
    registry.add_kernel(KernelImpl(op="indexer_logits", name="triton_indexer_logits",
                                   target=f"{_MOD}.indexer_logits:indexer_logits", layout="indexer-132",
                                   description="one program per (token, run of pages): each page read once for all "
                                               "64 heads, FP8 dot, ReLU, weighted head sum", **common))
    registry.add_kernel(KernelImpl(op="indexer_q_prep", name="triton_indexer_q_prep",
                                   target=f"{_MOD}.indexer_q_prep:indexer_q_prep",
                                   description="a program per 4 heads of a token: the compressor's RoPE and "
                                               "Hadamard, per-head FP8 scale and codes, folded head weights",
                                   **common))
    registry.add_kernel(KernelImpl(op="indexer_store", name="triton_indexer_store",
                                   target=f"{_MOD}.indexer_store:indexer_store", layout="indexer-132",
                                   description="8 rows a program: amax/pow2 scale, integer FP8 codec, masked "
                                               "scatter (bit-identical to the reference)", **common))
    registry.add_kernel(KernelImpl(op="fp8_linear", name="triton_fp8_linear", target=f"{_MOD}.fp8_linear:fp8_linear",
                                   description="one launch: a program's 128 output columns over a run of K's "
                                               "128-blocks, x quantized 1x128 in registers (the MoE's quantizer), "
                                               "FP8 dot, block scales after the dot; split-K (a second, "
                                               "deterministic sum launch) when the column tiles are fewer than the "
                                               "SMs", **common))
    registry.add_kernel(KernelImpl(op="fp8_grouped_linear", name="triton_fp8_grouped_linear",
                                   target=f"{_MOD}.fp8_linear:fp8_grouped_linear",
                                   description="triton_fp8_linear's kernel with the groups on its first grid axis "
                                               "(a program's group and 128 output columns): one launch for every "
                                               "group, split-K counting every group's tiles", **common))
    registry.add_kernel(KernelImpl(op="offload_fetch", name="triton_offload_fetch",
                                   target=f"{_MOD}.offload_fetch:offload_fetch", layout="v4-584",
                                   description="device-side plan (no host sync), one program per miss copies "
                                               "its page from mapped pinned host memory: CUDA-graph capturable",
                                   **{**common, "supports": _offload_supports}))
    registry.add_kernel(KernelImpl(op="build_attention_metadata", name="triton_attention_metadata",
                                   target=f"{_MOD}.attention_metadata:build_attention_metadata",
                                   description="one program per query row, in place", **common))
    registry.add_kernel(KernelImpl(op="moe_route", name="triton_moe_route", target=f"{_MOD}.moe_route:moe_route",
                                   description="one program per token: sqrt-softplus, arg-max top-k or hash row, "
                                               "renormalised", **{**common, "supports": _route_supports}))
    registry.add_kernel(KernelImpl(op="moe_experts", name="triton_fused_moe", target=f"{_MOD}.fused_moe:moe_experts",
                                   prepare=f"{_MOD}.fused_moe:prepare_weights", layout="triton-moe-v2",
                                   description="expert-sorted blocks; MXFP4/FP8 dequant in registers (MXFP4 "
                                               "decode: weight rows as the dot's M, PTX nibble decode on NVIDIA), "
                                               "fused clamp+SwiGLU, down proj with routing weight (fp32 atomics)",
                                   **common))
    registry.add_kernel(KernelImpl(op="compress", name="triton_compress", target=f"{_MOD}.compress:compress",
                                   description="one program per group: window read once, online softmax pool, "
                                               "RMSNorm, RoPE, Hadamard (hd 128) in registers", **common))
    registry.add_kernel(KernelImpl(op="compress_decode", name="triton_compress_decode",
                                   target=f"{_MOD}.compress:compress_decode",
                                   description="one program per row: ring write in place, then the closing "
                                               "group's pool, norm, RoPE, Hadamard in one pass", **common))
    gemm = "split-K pre-norm GEMM (2xTF32, fp32 accuracy) with the sum of squares, then "
    registry.add_kernel(KernelImpl(op="mhc_pre", name="triton_mhc_pre", target=f"{_MOD}.mhc:mhc_pre",
                                   description=gemm + "gates, Sinkhorn in registers, stream sum: 2 launches",
                                   **common))
    registry.add_kernel(KernelImpl(op="mhc_post", name="triton_mhc_post", target=f"{_MOD}.mhc:mhc_post",
                                   description="one program per (token, d block), 4x4 mix in registers", **common))
    registry.add_kernel(KernelImpl(op="mhc_post_pre", name="triton_mhc_post_pre",
                                   target=f"{_MOD}.mhc:mhc_post_pre",
                                   description="post-mix fused into the next pre's split-K GEMM (stream read "
                                               "once), then the pre epilogue: 2 launches", **common))
    # above the fused kernel: mhc_post then mhc_pre measured faster at every T on the H200 (bench-mhc.json: 1.09-1.12x
    # up to T = 64, 1.52x at T = 4096)
    registry.add_kernel(KernelImpl(op="mhc_post_pre", name="triton_mhc_post_then_pre",
                                   target=f"{_MOD}.mhc:mhc_post_then_pre",
                                   description="triton_mhc_post, then triton_mhc_pre on the bf16 stream it stored: "
                                               "3 launches", **{**common, "priority": {p: v + 1 for p, v in
                                                                                       PRIORITY.items()}}))
    registry.add_kernel(KernelImpl(op="mhc_head", name="triton_mhc_head", target=f"{_MOD}.mhc:mhc_head",
                                   description=gemm + "gates and stream sum: 2 launches", **common))
