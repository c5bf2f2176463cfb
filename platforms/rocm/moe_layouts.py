"""aiter's a8w4 MoE layouts for MXFP4 experts (gate/up interleaved "GUGU", FlyDSL stage kernels), in pure
PyTorch with their inverses. Read from ROCm/aiter e4048607 `aiter/ops/shuffle.py`: `shuffle_weight(w, (16, 16),
is_guinterleave=True, gate_up=...)` and `shuffle_scale(s, E, is_guinterleave=True, gate_up=...)`, as its
op_tests/flydsl_tests/test_flydsl_moe_a8w4.py prepares w1 (gate_up=True) and w2 (gate_up=False).

Weights, packed bytes [E, N, Kb] (Kb = K/2; DSV4's w13 is [gate; up], N = 2I): with NLane 16, KLane 4, KPack 16,
N0 = n/16 (n = N/2 for gate_up), K0 = Kb/64:
  gate_up: view(E, 2, N0, 16, K0, 4, 16).permute(0, 2, 1, 4, 5, 3, 6)
  else:    view(E, N0, 16, K0, 4, 16).permute(0, 1, 3, 4, 2, 5)
Scales, UE8M0 bytes [E*N, Kg] (Kg = K/32 padded to a multiple of 8 with 0x7F, i.e. 2**0): with N1 = N/32,
K1 = Kg/8:
  gate_up: view(E, 2, N1, 16, K1, 2, 4).permute(0, 2, 4, 6, 3, 5, 1)
  else:    view(E, N1, 2, 16, K1, 2, 4).permute(0, 1, 4, 6, 3, 5, 2)"""

from __future__ import annotations

import torch

SCALE_ONE = 0x7F  # UE8M0 2**0: the neutral scale aiter pads with


def _weight_view(e: int, n: int, kb: int, gate_up: bool) -> tuple[tuple[int, ...], tuple[int, ...]]:
    if n % 32 or kb % 64:
        raise ValueError(f"aiter's a8w4 weight shuffle needs rows in multiples of 32 and K/2 bytes in multiples of "
                         f"64 (K % 128 == 0); got rows {n}, {kb} bytes")
    if gate_up:
        return (e, 2, n // 32, 16, kb // 64, 4, 16), (0, 2, 1, 4, 5, 3, 6)
    return (e, n // 16, 16, kb // 64, 4, 16), (0, 1, 3, 4, 2, 5)


def _inverse(perm: tuple[int, ...]) -> tuple[int, ...]:
    inv = [0] * len(perm)
    for i, p in enumerate(perm):
        inv[p] = i
    return tuple(inv)


def shuffle_weights(w: torch.Tensor, *, gate_up: bool) -> torch.Tensor:
    """Packed MXFP4 bytes uint8 [E, N, K/2] -> the same shape in aiter's a8w4 order."""
    shape, perm = _weight_view(*w.shape, gate_up)
    return w.contiguous().view(shape).permute(perm).contiguous().view(w.shape)


def unshuffle_weights(w: torch.Tensor, *, gate_up: bool) -> torch.Tensor:
    shape, perm = _weight_view(*w.shape, gate_up)
    permuted = tuple(shape[p] for p in perm)
    return w.contiguous().view(permuted).permute(_inverse(perm)).contiguous().view(w.shape)


def _scale_view(e: int, n: int, kg: int, gate_up: bool) -> tuple[tuple[int, ...], tuple[int, ...]]:
    if n % 32 or kg % 8:
        raise ValueError(f"aiter's a8w4 scale shuffle needs rows in multiples of 32 and K/32 padded to 8; got {n}, "
                         f"{kg}")
    if gate_up:
        return (e, 2, n // 32, 16, kg // 8, 2, 4), (0, 2, 4, 6, 3, 5, 1)
    return (e, n // 32, 2, 16, kg // 8, 2, 4), (0, 1, 4, 6, 3, 5, 2)


def shuffle_scales(scale: torch.Tensor, *, gate_up: bool) -> torch.Tensor:
    """UE8M0 bytes uint8 [E, N, K/32] -> uint8 [E*N, Kg] in aiter's a8w4 order (K/32 padded to 8 with 2**0)."""
    e, n, kg = scale.shape
    kp = -(-kg // 8) * 8
    padded = torch.full((e, n, kp), SCALE_ONE, dtype=torch.uint8, device=scale.device)
    padded[..., :kg] = scale
    shape, perm = _scale_view(e, n, kp, gate_up)
    return padded.view(shape).permute(perm).contiguous().view(e * n, kp)


def unshuffle_scales(shuffled: torch.Tensor, num_experts: int, k_groups: int, *, gate_up: bool) -> torch.Tensor:
    rows, kp = shuffled.shape
    e, n = num_experts, rows // num_experts
    shape, perm = _scale_view(e, n, kp, gate_up)
    permuted = tuple(shape[p] for p in perm)
    out = shuffled.contiguous().view(permuted).permute(_inverse(perm)).contiguous().view(e, n, kp)
    return out[..., :k_groups].contiguous()
