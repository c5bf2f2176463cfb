"""mhc_pre with DeepGEMM's pre-norm GEMM (`tf32_hc_prenorm_gemm`), the binding the cuda_sm90 and cuda_sm100 plugins
share: DeepGEMM computes the split-K partials of x.flatten(1) @ fn^T and of the sum of squares, and the portable
Triton kernel of mhc_pre turns them into y, post and comb (dsv4hal.kernels.triton.mhc.mhc_pre_from_partials), so
the gates, Sinkhorn and the weighted sum are the same code as triton_mhc_pre's.

DeepGEMM as vLLM 0.24 bundles it (2.5.0): `tf32_hc_prenorm_gemm(a bf16 [T, K], b fp32 [rows, K], d fp32 [S, T, rows],
sqr_sum fp32 [S, T], num_splits=S)` (spec dsv4-ops.md, mHC; its use in `dsv4hal bench mhc`). Host checks
(csrc/jit_kernels/impls/sm{90,100}_tf32_hc_prenorm_gemm.hpp): K % 64 == 0; rows a multiple of 8, at most 32 on SM90
and 128 on SM100 (mhc_pre has 24); one CTA per (64-token block, split), a split owning a share of K's 64-column
blocks. The product is TF32 (gate logits within ~2^-11 relative, inside mhc's conformance bound, which names this
GEMM).

Splits: one wave of CTAs, at most 64 and at most one a K block: min(64, SMs // ceil(T / 64), K / 64). On the H200
(`bench-mhc.json`) that rule picks, at every measured shape, the split count that was fastest or within
3% of it: 64 up to T = 64, 16 at T = 512, 2 at T = 4096; the GEMM then runs 1.0-4.2x faster than the Triton partials.
On the H200 faster than triton_mhc_pre in every shape timed (`bench-mhc.json`, `cuda_sm90.lock.json`) and passing
conformance (`conformance-cuda_sm90-rest.json`, `-attention.json`): ranked above the Triton kernels on cuda_sm90;
on cuda_sm100, never timed, below them.

This module imports torch and deep_gemm only inside functions: registering the plugin stays free."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from dsv4hal.kernels import vendor_versions
from dsv4hal.registry import KernelImpl

if TYPE_CHECKING:
    import torch

    from dsv4hal.hardware import PlatformInfo

LIBRARY = "deep_gemm"
MIN_VERSION = (2, 5, 0)  # the release whose tf32_hc_prenorm_gemm was read and timed (vLLM 0.24's bundle)
K_BLOCK = 64
TOKEN_BLOCK = 64
MAX_SPLITS = 64
MIX_ROWS = 24  # mhc_pre's fn: 4 pre + 4 post + 16 comb rows


def splits(t: int, k: int, num_sms: int) -> int:
    """The split count: one wave of CTAs over the 64-token blocks, at most 64, at most one per 64-column K block."""
    token_blocks = max(1, -(-t // TOKEN_BLOCK))
    return max(1, min(MAX_SPLITS, num_sms // token_blocks, k // K_BLOCK))


def supports(case: Mapping[str, object], info: PlatformInfo) -> list[str]:
    """Reasons DeepGEMM's pre-norm GEMM cannot serve this mhc_pre case (the contract fixes fn at 24 rows)."""
    reasons = []
    hidden = case.get("hidden")
    if isinstance(hidden, int) and (4 * hidden) % K_BLOCK:
        reasons.append(f"tf32_hc_prenorm_gemm needs K = 4 * hidden a multiple of {K_BLOCK}; got hidden={hidden}")
    return reasons


def kernel(platform: str, name: str, priority: int, arch: str, op: str = "mhc_pre",
           supports_fn: Callable[[Mapping[str, object], PlatformInfo], list[str]] = supports) -> KernelImpl:
    """The KernelImpl each CUDA plugin registers for `op` (mhc_pre, or mhc_post_pre: triton_mhc_post, then this
    mhc_pre on the stream it stored): the same target, its own name, priority and arch."""
    then = "triton_mhc_post, then " if op == "mhc_post_pre" else ""
    return KernelImpl(
        op=op, name=name, target=f"dsv4hal.kernels.deepgemm_mhc:{op}", platforms=(platform,),
        priority=priority, tier="vendor", requires=(LIBRARY, "triton"), supports=supports_fn,
        min_versions=(vendor_versions.deep_gemm(MIN_VERSION, "whose tf32_hc_prenorm_gemm dsv4hal checked"),),
        description=f"{then}DeepGEMM tf32_hc_prenorm_gemm ({arch}; split-K partials, one wave) and the Triton "
                    "gates, Sinkhorn and weighted sum of triton_mhc_pre")


def _entry() -> Any:
    import deep_gemm

    entry = getattr(deep_gemm, "tf32_hc_prenorm_gemm", None)
    if entry is None:  # deep_gemm leaves its kernels out with a CUDA runtime before 12.1
        raise RuntimeError(f"deep_gemm {getattr(deep_gemm, '__version__', '?')} has no tf32_hc_prenorm_gemm "
                           "(it needs a CUDA runtime >= 12.1); pick triton_mhc_pre (DSV4HAL_KERNELS=mhc_pre=...)")
    return entry


def mhc_pre(x: torch.Tensor, fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor, rms_eps: float = 1e-6,
            hc_eps: float = 1e-6, sinkhorn_iters: int = 20) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(y bf16 [T, d], post fp32 [T, 4], comb fp32 [T, 4, 4]) (contract: ops.mhc)."""
    import torch

    from dsv4hal.kernels.triton.device import sm_count
    from dsv4hal.kernels.triton.mhc import HC, mhc_pre_from_partials

    t, _, d = x.shape
    dev = x.device
    x = x.contiguous()
    k = HC * d
    s = splits(t, k, sm_count(dev))
    mix = torch.empty(s, t, fn.shape[0], dtype=torch.float32, device=dev)
    sq = torch.empty(s, t, dtype=torch.float32, device=dev)
    if t:  # no tokens: no GEMM, and the gates write nothing
        _entry()(x.view(t, k), fn.float().contiguous(), mix, sq, num_splits=s)
    return mhc_pre_from_partials(x, mix, sq, base, scale, rms_eps, hc_eps, sinkhorn_iters)


def mhc_post_pre(f: torch.Tensor, x: torch.Tensor, post: torch.Tensor, comb: torch.Tensor, fn: torch.Tensor,
                 base: torch.Tensor, scale: torch.Tensor, rms_eps: float = 1e-6, hc_eps: float = 1e-6,
                 sinkhorn_iters: int = 20) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x' bf16 [T, 4, d], y, post', comb') (contract: ops.mhc): the Triton mhc_post, then mhc_pre above on the
    bf16 stream it stored (the contract's definition; the Triton composition measured faster than the fused
    kernel on the H200)."""
    from dsv4hal.kernels.triton.mhc import mhc_post

    stream = mhc_post(f, x, post, comb)
    return (stream, *mhc_pre(stream, fn, base, scale, rms_eps, hc_eps, sinkhorn_iters))
