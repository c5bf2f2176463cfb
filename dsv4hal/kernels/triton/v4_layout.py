"""The record geometry of dsv4hal.formats.v4_cache as Triton compile-time constants, shared by the cache kernels
and the sparse attention kernel. A slot's record is RECORD_BYTES: NOPE_DIM fp8 bytes (NUM_TILES tiles of TILE
values), then ROPE_DIM bf16 values at byte NOPE_DIM; a page's SCALE_BLOCK_BYTES-byte scale blocks follow its P
records. Kernels pad the tile axis to SCALE_BLOCK_BYTES (8, a power of two, as tl.arange needs) and mask it to
NUM_TILES; one [TILE] range serves tile columns and rope values. Keys, values and queries are HEAD_DIM wide."""

from __future__ import annotations

import triton.language as tl

from dsv4hal.formats.v4_cache import HEAD_DIM, NOPE_DIM, NUM_TILES, RECORD_BYTES, ROPE_DIM, SCALE_BLOCK_BYTES, TILE

assert TILE == ROPE_DIM and NUM_TILES < SCALE_BLOCK_BYTES and SCALE_BLOCK_BYTES & (SCALE_BLOCK_BYTES - 1) == 0
RECORD = tl.constexpr(RECORD_BYTES)
NOPE = tl.constexpr(NOPE_DIM)
HEAD = tl.constexpr(HEAD_DIM)
TILE_W = tl.constexpr(TILE)
NTILES = tl.constexpr(NUM_TILES)
SCALES = tl.constexpr(SCALE_BLOCK_BYTES)
