"""Pure-PyTorch manifold-constrained hyper-connections (spec 6): pre-mix, post-mix, head and the fused
post + pre boundary. Conventions as DeepSeek's reference (deepseek-ai/TileKernels tile_kernels/torch/mhc.py;
see dsv4hal.ops.mhc).

The residual stream X is bf16 [T, 4, d]. Mixing parameters come from one fp32 GEMM of the flattened stream,
scaled by its inverse RMS; the 4x4 stream-mixing matrix is pushed towards doubly stochastic by Sinkhorn.
All math in fp32; outputs that re-enter the stream are rounded to bf16 once.
"""

from __future__ import annotations

import torch

HC_MULT = 4
MIX = (2 + HC_MULT) * HC_MULT  # 24: 4 pre + 4 post + 16 comb
POST_MULT = 2.0


def mixes(x: torch.Tensor, fn: torch.Tensor, rms_eps: float) -> torch.Tensor:
    """fp32 [T, rows(fn)]: (flatten(x) @ fn^T) * rsqrt(mean(flatten(x)^2) + eps), RMS over all 4d values."""
    xf = x.flatten(1).float()
    r = torch.rsqrt(xf.pow(2).mean(dim=1, keepdim=True) + rms_eps)
    return (xf @ fn.float().t()) * r


def sinkhorn(logits: torch.Tensor, iters: int, eps: float) -> torch.Tensor:
    """[..., 4, 4] -> row softmax (+eps), column normalisation, then iters-1 rounds of row then column
    normalisation, each divided by (sum + eps). Rows index the source stream j, columns the target k."""
    c = torch.softmax(logits, dim=-1) + eps
    c = c / (c.sum(dim=-2, keepdim=True) + eps)
    for _ in range(iters - 1):
        c = c / (c.sum(dim=-1, keepdim=True) + eps)
        c = c / (c.sum(dim=-2, keepdim=True) + eps)
    return c


def _weighted_streams(x: torch.Tensor, pre: torch.Tensor) -> torch.Tensor:
    """bf16 [T, d] = sum_i pre[:, i] * X[:, i], summed in fp32."""
    return torch.einsum("ti,tid->td", pre, x.float()).to(torch.bfloat16)


def mhc_pre(
    x: torch.Tensor,
    fn: torch.Tensor,
    base: torch.Tensor,
    scale: torch.Tensor,
    rms_eps: float = 1e-6,
    hc_eps: float = 1e-6,
    sinkhorn_iters: int = 20,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(y bf16 [T, d], post fp32 [T, 4], comb fp32 [T, 4, 4]) for x bf16 [T, 4, d], fn [24, 4d], base, scale."""
    m = mixes(x, fn, rms_eps)
    base, scale = base.float(), scale.float()
    n = HC_MULT
    pre = torch.sigmoid(m[:, :n] * scale[0] + base[:n]) + hc_eps
    post = POST_MULT * torch.sigmoid(m[:, n : 2 * n] * scale[1] + base[n : 2 * n])
    comb_logits = (m[:, 2 * n :] * scale[2] + base[2 * n :]).unflatten(1, (n, n))
    comb = sinkhorn(comb_logits, sinkhorn_iters, hc_eps)
    return _weighted_streams(x, pre), post, comb


def mhc_post(f: torch.Tensor, x: torch.Tensor, post: torch.Tensor, comb: torch.Tensor) -> torch.Tensor:
    """bf16 [T, 4, d]: X'[:, k] = post[:, k] * f + sum_j comb[:, j, k] * X[:, j], in fp32 then rounded once."""
    mixed = torch.einsum("tjk,tjd->tkd", comb.float(), x.float())
    return (post.float()[:, :, None] * f.float()[:, None, :] + mixed).to(torch.bfloat16)


def mhc_head(
    x: torch.Tensor,
    fn: torch.Tensor,
    base: torch.Tensor,
    scale: torch.Tensor,
    rms_eps: float = 1e-6,
    hc_eps: float = 1e-6,
) -> torch.Tensor:
    """bf16 [T, d] = sum_i (sigmoid(m_i * scale + base_i) + hc_eps) X[:, i] with m from fn [4, 4d]."""
    m = mixes(x, fn, rms_eps)
    pre = torch.sigmoid(m * scale.float()[0] + base.float()) + hc_eps
    return _weighted_streams(x, pre)


def mhc_post_pre(
    f: torch.Tensor,
    x: torch.Tensor,
    post: torch.Tensor,
    comb: torch.Tensor,
    fn: torch.Tensor,
    base: torch.Tensor,
    scale: torch.Tensor,
    rms_eps: float = 1e-6,
    hc_eps: float = 1e-6,
    sinkhorn_iters: int = 20,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """A sublayer boundary: (x' = mhc_post(f, x, post, comb), *mhc_pre(x', fn, base, scale, ...)); the next
    sublayer's gates see the stream as stored (bf16)."""
    stream = mhc_post(f, x, post, comb)
    y, post2, comb2 = mhc_pre(stream, fn, base, scale, rms_eps, hc_eps, sinkhorn_iters)
    return stream, y, post2, comb2
