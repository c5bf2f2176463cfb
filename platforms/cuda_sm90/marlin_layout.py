"""Marlin's MXFP4 weight and scale layouts, in pure PyTorch (the route alignment is dsv4hal.kernels.moe_align).

Device-agnostic re-implementations (no vLLM needed: `gptq_marlin_repack` lives in vLLM's `_C`, not in
`_moe_C`) of what vLLM 0.24 does to MXFP4 expert weights before `moe_wna16_marlin_gemm`
(`prepare_moe_mxfp4_layer_for_marlin`, docs/vendor-apis.md 3.4, 3.6, 3.7), with exact inverses.

Weights. Logical weight of one expert: N output rows, K reduction columns, packed uint8 [N, K/2], low nibble = even k.
Transform chain, per expert (as vLLM runs it):
  1. `packed.view(int32)` -> [N, K/8] (little-endian: nibble j of word i is element k = 8i + j);
  2. `.T.contiguous()` -> GPTQ "size_k x size_n" int32 [K/8, N]: nibble j of word [i, n] is code W[k=8i+j, n],
     i.e. W[k, n] is the code of logical (row n, column k); no value changes;
  3. `gptq_marlin_repack(.., perm=empty, size_k=K, size_n=N, num_bits=4, is_a_8bit=False)` -> int32 [K/16, 2N]:
     16 (k) x 64 (n) tiles of 128 words; tile (kt, nt) fills row kt, columns nt*128 .. nt*128+127. For w in 0..3
     (warp) and t in 0..31 (lane), with r = 16kt + 2(t%4), n0 = 64nt + 16w + t//4, n1 = n0 + 8, word
     Q[kt, 128nt + 4t + w] holds, from bit 0 upward, the nibbles
         W[r,n0], W[r+8,n0], W[r,n1], W[r+8,n1], W[r+1,n0], W[r+9,n0], W[r+1,n1], W[r+9,n1]
     (the kernel gathers {r, r+1, r+8, r+9} x {n0, n1} and interleaves them with pack_idx 0,2,4,6,1,3,5,7).
  Preconditions: K % 16 == 0 and N % 64 == 0 (the kernel's 16x64 tile).

Scales. uint8 e8m0 [N, K/32] per expert:
  1. `.T` -> [G = K/32, N] (vLLM casts e8m0 -> bf16 -> e8m0 around the permutes: exact, as all values are 2^e);
  2. `marlin_permute_scales(group_size=32)`: group_size < size_k, 16-bit activations -> the 64-entry scale_perm:
     the flattened [G, N] tensor in rows of 64, new position 8a + b takes old position a + 8b (each 8x8 transposed);
  3. `mxfp4_marlin_process_scales(input_dtype=bf16)`: in rows of 4, order [0, 2, 1, 3]; then float8_e8m0fnu.
  The two steps compose into one fixed permutation of every 64 consecutive bytes (needs G*N % 64 == 0: N % 64).
  Result: float8_e8m0fnu [E, K/32, N].
"""

from __future__ import annotations

import torch

TILE_K = 16  # Marlin tile: 16 reduction rows
TILE_N = 64  # by 64 output columns
PACK = 8  # 4-bit codes per int32 word
GROUP = 32  # MXFP4 scale group along K

# Nibble j of a word (bit 4j) holds W[r + DK[j], n0 + DN[j]] (see the module docstring).
_DK = (0, 8, 0, 8, 1, 9, 1, 9)
_DN = (0, 0, 8, 8, 0, 0, 8, 8)


def _tile_index(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """(k, n) offsets inside a 16x64 tile of the nibble stored at (lane t, warp w, nibble j): two [32, 4, 8] tensors."""
    t = torch.arange(32, device=device).view(32, 1, 1)
    w = torch.arange(4, device=device).view(1, 4, 1)
    dk = torch.tensor(_DK, device=device).view(1, 1, 8)
    dn = torch.tensor(_DN, device=device).view(1, 1, 8)
    k_in = (2 * (t % 4) + dk).expand(32, 4, 8)
    n_in = 16 * w + t // 4 + dn
    return k_in, n_in


def _check_weight_dims(n: int, k: int) -> None:
    if k % TILE_K or n % TILE_N:
        raise ValueError(f"Marlin 4-bit repack needs K % {TILE_K} == 0 and N % {TILE_N} == 0 (its 16x64 tile); "
                         f"got N={n} (output rows), K={k} (reduction)")


def _to_int32(words: torch.Tensor) -> torch.Tensor:
    """int64 values in [0, 2^32) -> int32 with the same bits."""
    return (words - ((words >> 31) & 1) * (1 << 32)).to(torch.int32)


def _repack_one(packed: torch.Tensor, k_in: torch.Tensor, n_in: torch.Tensor) -> torch.Tensor:
    n, k = packed.shape[0], packed.shape[1] * 2
    codes = torch.stack((packed & 0xF, packed >> 4), dim=-1).reshape(n, k)  # [N, K]: code of (n, k)
    w = codes.T  # [K, N]: W[k, n] (steps 1-2 of the chain)
    tiles = w.reshape(k // TILE_K, TILE_K, n // TILE_N, TILE_N).permute(0, 2, 1, 3)  # [KT, NT, 16, 64]
    vals = tiles[:, :, k_in, n_in].to(torch.int64)  # [KT, NT, 32, 4, 8]
    shifts = torch.arange(0, 32, 4, device=packed.device, dtype=torch.int64)
    words = (vals << shifts).sum(dim=-1)  # disjoint nibbles: the sum is the bitwise or
    return _to_int32(words).reshape(k // TILE_K, 2 * n)  # column 128nt + 4t + w


def repack_mxfp4_for_marlin(packed: torch.Tensor) -> torch.Tensor:
    """MXFP4 weights uint8 [E, N, K/2] (N output rows, low nibble = even k) -> int32 [E, K/16, 2N], the result of
    vLLM's `gptq_marlin_repack(packed[e].view(int32).T.contiguous(), empty perm, K, N, num_bits=4)` per expert.
    Loops over experts, so a full layer needs only one expert's temporaries."""
    if packed.dtype != torch.uint8 or packed.dim() != 3:
        raise ValueError(f"expected packed MXFP4 uint8 [E, N, K/2], got {packed.dtype} {tuple(packed.shape)}")
    e, n, k = packed.shape[0], packed.shape[1], packed.shape[2] * 2
    _check_weight_dims(n, k)
    k_in, n_in = _tile_index(packed.device)
    out = torch.empty(e, k // TILE_K, 2 * n, dtype=torch.int32, device=packed.device)
    for i in range(e):
        out[i] = _repack_one(packed[i], k_in, n_in)
    return out


def unrepack_marlin_mxfp4(q: torch.Tensor) -> torch.Tensor:
    """Exact inverse of repack_mxfp4_for_marlin: int32 [E, K/16, 2N] -> uint8 [E, N, K/2]."""
    if q.dtype != torch.int32 or q.dim() != 3 or q.shape[2] % (2 * TILE_N):
        raise ValueError(f"expected Marlin int32 [E, K/16, 2N] with N % {TILE_N} == 0, got {q.dtype} "
                         f"{tuple(q.shape)}")
    e, kt, n = q.shape[0], q.shape[1], q.shape[2] // 2
    k, nt = kt * TILE_K, n // TILE_N
    k_in, n_in = _tile_index(q.device)
    shifts = torch.arange(0, 32, 4, device=q.device, dtype=torch.int64)
    out = torch.empty(e, n, k // 2, dtype=torch.uint8, device=q.device)
    for i in range(e):
        words = (q[i].to(torch.int64) & 0xFFFFFFFF).reshape(kt, nt, 32, 4, 1)
        vals = ((words >> shifts) & 0xF).to(torch.uint8)  # [KT, NT, 32, 4, 8]
        tiles = torch.empty(kt, nt, TILE_K, TILE_N, dtype=torch.uint8, device=q.device)
        tiles[:, :, k_in, n_in] = vals  # every (k, n) of a tile is written exactly once
        codes = tiles.permute(0, 2, 1, 3).reshape(k, n).T  # [N, K]
        out[i] = codes[:, 0::2] | (codes[:, 1::2] << 4)
    return out


# ---------------------------------------------------------------- scales


def _scale_perm_64() -> list[int]:
    """new[i] = old[perm[i]] within each 64 bytes: scale_perm (new 8a+b <- old a+8b), then rows of 4 as [0,2,1,3]."""
    transpose = [a + 8 * b for a in range(8) for b in range(8)]  # index 8a + b
    swap = [4 * (i // 4) + (0, 2, 1, 3)[i % 4] for i in range(64)]
    return [transpose[swap[i]] for i in range(64)]


SCALE_PERM: tuple[int, ...] = tuple(_scale_perm_64())
SCALE_UNPERM: tuple[int, ...] = tuple(sorted(range(64), key=SCALE_PERM.__getitem__))


def permute_scales_for_marlin(scale: torch.Tensor, group_size: int = GROUP) -> torch.Tensor:
    """MXFP4 e8m0 scale bytes uint8 [E, N, K/32] -> float8_e8m0fnu [E, K/32, N] in Marlin's order (the result of
    marlin_permute_scales(scale[e].T, K, N, 32) then mxfp4_marlin_process_scales(.., bf16) per expert)."""
    if group_size != GROUP:
        raise ValueError(f"MXFP4 scales have group size {GROUP}, got {group_size}")
    if scale.dtype != torch.uint8 or scale.dim() != 3:
        raise ValueError(f"expected e8m0 scale bytes uint8 [E, N, K/32], got {scale.dtype} {tuple(scale.shape)}")
    e, n, g = scale.shape
    if n % TILE_N:
        raise ValueError(f"Marlin scale permutation needs N % {TILE_N} == 0, got N={n}")
    perm = torch.tensor(SCALE_PERM, device=scale.device)
    s = scale.transpose(1, 2).reshape(-1, 64)[:, perm]
    return s.reshape(e, g, n).view(torch.float8_e8m0fnu)


def unpermute_scales_for_marlin(marlin_scale: torch.Tensor) -> torch.Tensor:
    """Exact inverse of permute_scales_for_marlin: [E, K/32, N] (e8m0 or uint8) -> uint8 [E, N, K/32]."""
    if marlin_scale.dim() != 3 or marlin_scale.element_size() != 1 or marlin_scale.shape[2] % TILE_N:
        raise ValueError(f"expected Marlin scales [E, K/32, N] of one byte with N % {TILE_N} == 0, got "
                         f"{marlin_scale.dtype} {tuple(marlin_scale.shape)}")
    e, g, n = marlin_scale.shape
    unperm = torch.tensor(SCALE_UNPERM, device=marlin_scale.device)
    s = marlin_scale.contiguous().view(torch.uint8).reshape(-1, 64)[:, unperm]
    return s.reshape(e, g, n).transpose(1, 2).contiguous()
