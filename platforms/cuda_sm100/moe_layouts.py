"""MXFP4 expert weight layouts of the Blackwell MoE kernels, in pure PyTorch, each with its inverse (tests invert
every transform and compare with the logical weights). Facts and sources: docs/vendor-apis.md sections 2 and 4.

FlashInfer TRTLLM-Gen (`trtllm_fp4_block_scale_routed_moe`, epilogue_tile_m = 128):
  * GEMM1 wants [w3 (up); w1 (gate)] with rows interleaved one at a time (row 2j = up_j, row 2j+1 = gate_j:
    flashinfer's reorder_rows_for_gated_act_gemm), DSV4 stores [w1; w3], so the halves are swapped first;
  * every weight matrix's rows are then shuffled in blocks of 32 (shuffle_matrix_a): output row r is input row
    32*(r//32) + 4*(r%8) + (r%32)//8; the scales get the same rows, then the 128x4 swizzle of
    block_scale_interleave: element (m, k) of an [M, K] scale matrix goes to
    (m//128)*(ceil(K/4)*512) + (k//4)*512 + (m%32)*16 + ((m%128)//32)*4 + (k%4), M and K padded to 128 and 4.
DeepGEMM SM100 FP8 x FP4 (`m_grouped_fp8_fp4_gemm_nt_contiguous`, recipe_b = (1, 32)):
  * weights: the packed nibbles as they are (low nibble = even k), viewed as int8 [E, N, K/2];
  * scales: UE8M0 bytes [E, N, K/32] packed four k-groups to an int32 (group 4p + j in byte j), MN-major and
    TMA-aligned: int32 [E, N, ceil(K/128)] with strides (ceil(K/128) * align(N, 4), 1, align(N, 4))."""

from __future__ import annotations

import torch

SHUFFLE_BLOCK = 32
SWIZZLE_ROWS, SWIZZLE_COLS = 128, 4


def gated_interleave_rows(m: int) -> torch.Tensor:
    """Row order for TRTLLM-Gen's gated GEMM1 from DSV4's [w1 (gate); w3 (up)] (M = 2I rows): up_j, gate_j, ..."""
    half = m // 2
    j = torch.arange(half)
    return torch.stack((half + j, j), dim=1).reshape(-1)  # up rows are the second half of [w1; w3]


def shuffle_rows(m: int) -> torch.Tensor:
    """shuffle_matrix_a's row gather for epilogue_tile_m = 128 (blocks of 32 rows): out[r] = in[idx[r]]."""
    if m % SHUFFLE_BLOCK:
        raise ValueError(f"the TRTLLM-Gen row shuffle needs rows in multiples of {SHUFFLE_BLOCK}; got {m}")
    r = torch.arange(m)
    return SHUFFLE_BLOCK * (r // SHUFFLE_BLOCK) + 4 * (r % 8) + (r % SHUFFLE_BLOCK) // 8


def swizzle_offsets(m: int, k: int) -> torch.Tensor:
    """block_scale_interleave's destination offset of each (row, column) of an [m, k] scale matrix: int64 [m, k]."""
    if m % SWIZZLE_ROWS or k % SWIZZLE_COLS:
        raise ValueError(f"the 128x4 scale swizzle is used here without padding: rows {m} must be a multiple of "
                         f"{SWIZZLE_ROWS} and scale columns {k} of {SWIZZLE_COLS}")
    mm = torch.arange(m).view(m, 1)
    kk = torch.arange(k).view(1, k)
    return ((mm // 128) * (k // 4 * 512) + (kk // 4) * 512 + (mm % 32) * 16 + ((mm % 128) // 32) * 4 + kk % 4)


def _trtllm_row_order(m: int, gated: bool) -> torch.Tensor:
    shuffle = shuffle_rows(m)
    return gated_interleave_rows(m)[shuffle] if gated else shuffle


def to_trtllm(w: torch.Tensor, scale: torch.Tensor, *, gated: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed weights uint8 [E, M, K/2] and UE8M0 scales uint8 [E, M, K/32] -> (uint8 [E, M, K/2] with rows
    reordered, scales uint8 [E, M, K/32] with rows reordered then 128x4-swizzled, as a flat buffer per expert)."""
    e, m, _ = w.shape
    order = _trtllm_row_order(m, gated).to(w.device)
    ws, ss = w[:, order], scale[:, order]
    offs = swizzle_offsets(m, scale.shape[2]).to(w.device).reshape(-1)
    out = torch.empty_like(ss).view(e, -1)
    out[:, offs] = ss.reshape(e, -1)
    return ws.contiguous(), out.view(scale.shape)


def from_trtllm(w: torch.Tensor, scale: torch.Tensor, *, gated: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The inverse of to_trtllm."""
    e, m, _ = w.shape
    order = _trtllm_row_order(m, gated).to(w.device)
    offs = swizzle_offsets(m, scale.shape[2]).to(w.device).reshape(-1)
    ss = scale.reshape(e, -1)[:, offs].view(scale.shape)
    inv = torch.empty_like(order)
    inv[order] = torch.arange(m, device=order.device)
    return w[:, inv].contiguous(), ss[:, inv].contiguous()


def pack_ue8m0_for_deepgemm(scale: torch.Tensor) -> torch.Tensor:
    """UE8M0 bytes uint8 [E, N, K/32] -> int32 [E, N, ceil(K/128)], four k-groups a word (group 4p + j in byte j),
    MN-major with N padded to a multiple of 4 (missing k-groups are 0)."""
    e, n, kg = scale.shape
    words = -(-kg // 4)
    padded = torch.zeros(e, n, words * 4, dtype=torch.uint8, device=scale.device)
    padded[..., :kg] = scale
    b = padded.view(e, n, words, 4).to(torch.int64)
    packed = (b[..., 0] | (b[..., 1] << 8) | (b[..., 2] << 16) | (b[..., 3] << 24))
    packed = torch.where(packed >= 1 << 31, packed - (1 << 32), packed).to(torch.int32)
    n_al = -(-n // 4) * 4
    store = torch.zeros(e, words, n_al, dtype=torch.int32, device=scale.device)
    store[:, :, :n] = packed.transpose(1, 2)
    return store.transpose(1, 2)[:, :n]  # [E, N, words] with strides (words * n_al, 1, n_al)


def unpack_ue8m0_for_deepgemm(packed: torch.Tensor, k_groups: int) -> torch.Tensor:
    """The inverse of pack_ue8m0_for_deepgemm: int32 [E, N, words] -> uint8 [E, N, k_groups]."""
    w = packed.to(torch.int64) & 0xFFFFFFFF
    b = torch.stack([(w >> (8 * j)) & 0xFF for j in range(4)], dim=-1).to(torch.uint8)
    return b.reshape(*packed.shape[:2], -1)[..., :k_groups].contiguous()
