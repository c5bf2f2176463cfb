"""Pure-PyTorch compressor (spec 4.1), prefill form: whole requests starting at position 0.

Each request emits one compressed row per full group of `ratio` tokens: a per-channel softmax-weighted
sum of kv over the group's window, then RMSNorm, RoPE at the group's first position and (indexer
compressor) a scaled Walsh-Hadamard transform. All math in fp32; vectorised over groups.
"""

from __future__ import annotations

import torch

# The compressor state is a format the engine holds (formats/compressor_state.py); re-exported here.
from dsv4hal.formats.compressor_state import OVERLAP_RATIO, coff_for, new_state, window_rows  # noqa: F401
from dsv4hal.reference.rope import apply_rope, table_positions, table_rows


def compression_positions(cu_seqlens: torch.Tensor, ratio: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(row of each group's first token in the packed batch, its position in its request), int64 [M].

    Request b contributes L_b // ratio groups, in order; groups of all requests are concatenated."""
    cu = cu_seqlens.long()
    groups = (cu[1:] - cu[:-1]) // ratio
    req = torch.repeat_interleave(torch.arange(groups.numel(), device=cu.device), groups)
    first_group = torch.cumsum(groups, 0) - groups  # index of request b's first group in the output
    index = torch.arange(req.numel(), device=cu.device) - first_group[req]
    positions = index * ratio
    return cu[:-1][req] + positions, positions


def _window_c128(
    kv_score: torch.Tensor, rows: torch.Tensor, ape: torch.Tensor, hd: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """kv, score [M, 128, hd] over the group's own tokens, score + ape[w]."""
    idx = rows[:, None] + torch.arange(ape.shape[0], device=rows.device)
    window = kv_score[idx]
    return window[..., :hd], window[..., hd:] + ape


def _window_c4(
    kv_score: torch.Tensor, rows: torch.Tensor, positions: torch.Tensor, ape: torch.Tensor, hd: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """kv, score [M, 8, hd]: rows 0..3 = previous group via the ov halves, rows 4..7 = own group via cur."""
    w = torch.arange(OVERLAP_RATIO, device=rows.device)
    has_prev = (positions > 0)[:, None, None]
    # The first group has no previous group: clamp its indices in range, then mask (score -inf, kv 0).
    prev = kv_score[(rows[:, None] - OVERLAP_RATIO + w).clamp_min(0)]
    cur = kv_score[rows[:, None] + w]
    kv_ov = torch.where(has_prev, prev[..., :hd], 0.0)
    score_ov = torch.where(has_prev, prev[..., 2 * hd : 3 * hd] + ape[:, :hd], float("-inf"))
    kv = torch.cat((kv_ov, cur[..., hd : 2 * hd]), dim=1)
    score = torch.cat((score_ov, cur[..., 3 * hd :] + ape[:, hd:]), dim=1)
    return kv, score


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps) * weight


def hadamard_transform(x: torch.Tensor) -> torch.Tensor:
    """Walsh-Hadamard (Sylvester, natural order) over the last dim, scaled by n^-0.5 (orthonormal)."""
    n = x.shape[-1]
    if n & (n - 1):
        raise ValueError(f"Hadamard size must be a power of two, got {n}")
    out, h = x, 1
    while h < n:  # log2(n) butterfly stages: (a, b) -> (a + b, a - b) at stride h
        pairs = out.unflatten(-1, (n // (2 * h), 2, h))
        a, b = pairs[..., 0, :], pairs[..., 1, :]
        out = torch.stack((a + b, a - b), dim=-2).flatten(-3)
        h *= 2
    return out * n**-0.5


def compress(
    kv_score: torch.Tensor,
    cu_seqlens: torch.Tensor,
    ape: torch.Tensor,
    norm_weight: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    ratio: int,
    eps: float = 1e-6,
    hadamard: bool = False,
    num_groups: int | None = None,
) -> torch.Tensor:
    """fp32 [M, hd] compressed rows, M = sum_b L_b // ratio (see dsv4hal.ops.compress for the contract). M comes
    from cu_seqlens here; num_groups, a caller's promise of M (checked wherever cu_seqlens is read), gives the row
    count as the kernels give it when unchecked: the first num_groups rows, zero rows past M."""
    hd = norm_weight.shape[0]
    kv_score, ape = kv_score.float(), ape.float()
    rows, positions = compression_positions(cu_seqlens, ratio)
    if ratio == OVERLAP_RATIO:
        kv, score = _window_c4(kv_score, rows, positions, ape, hd)
    else:
        kv, score = _window_c128(kv_score, rows, ape, hd)
    out = _pool_norm_rope(kv, score, positions, norm_weight, cos, sin, eps, hadamard)
    if num_groups is None or num_groups == out.shape[0]:
        return out
    return torch.cat([out, out.new_zeros(max(0, num_groups - out.shape[0]), hd)])[:num_groups]


def _pool_norm_rope(kv: torch.Tensor, score: torch.Tensor, positions: torch.Tensor, norm_weight: torch.Tensor,
                    cos: torch.Tensor, sin: torch.Tensor, eps: float, hadamard: bool) -> torch.Tensor:
    """Per-channel softmax over the window rows, RMSNorm, RoPE at the group's first position (clamped into the
    table, as the kernels do when unchecked), Hadamard."""
    pooled = (torch.softmax(score, dim=1) * kv).sum(dim=1)
    out = rms_norm(pooled, norm_weight.float(), eps)
    out = apply_rope(out, *table_rows(cos, sin, positions))
    return hadamard_transform(out) if hadamard else out


def compress_decode(
    kv_score: torch.Tensor,
    state: torch.Tensor,
    slots: torch.Tensor,
    positions: torch.Tensor,
    ape: torch.Tensor,
    norm_weight: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    ratio: int,
    eps: float = 1e-6,
    hadamard: bool = False,
) -> torch.Tensor:
    """Decode form: write each row's kv_score into its request's ring at position % ring, then compress the
    window ending at that position. fp32 [B, hd]; rows whose token does not close a group are 0.

    Unchecked indices (as the kernels): a slot outside [0, S) skips the row (its ring is neither read nor written,
    its output is a zero row); a position outside the RoPE table is clamped into it before anything else."""
    hd = norm_weight.shape[0]
    ring = state.shape[1]
    pos, slot = table_positions(positions, cos), slots.long()
    live = (slot >= 0) & (slot < state.shape[0])
    state[slot[live], pos[live] % ring] = kv_score.float()[live]  # no negative index wraps into another ring
    if state.shape[0] == 0:  # no ring: every row is skipped
        return kv_score.new_zeros(kv_score.shape[0], hd, dtype=torch.float32)
    slot = torch.where(live, slot, 0)  # skipped rows read ring 0 and drop the result
    window = window_rows(ratio)
    back = pos[:, None] - window + 1 + torch.arange(window, device=pos.device)  # oldest .. newest position
    ordered = state[slot[:, None], back % ring].reshape(-1, state.shape[2])  # [B * window, width]
    base = torch.arange(pos.shape[0], device=pos.device) * window
    first = pos + 1 - ratio  # the group's first position
    if ratio == OVERLAP_RATIO:
        kv, score = _window_c4(ordered, base + OVERLAP_RATIO, first, ape.float(), hd)
    else:
        kv, score = _window_c128(ordered, base, ape.float(), hd)
    out = _pool_norm_rope(kv, score, first.clamp(min=0), norm_weight, cos, sin, eps, hadamard)
    return torch.where((live & ((pos + 1) % ratio == 0))[:, None], out, 0.0)
