"""Portable Triton fused MoE (routed experts) for MXFP4 and FP8 128x128 block-scaled weights.

Layout "triton-moe-v2" (prepare_weights): the logical ExpertWeights tensors in a TritonMoeWeights: w13 [E, 2I,
H(/2)] and w2 [E, H, I(/2)] are K-contiguous rows, which is what a weight tile loaded along K wants (each row's K run
is coalesced). FP8 values are kept as raw uint8 bytes, uncopied (decoded in registers with integer arithmetic, so
e4m3fn and e4m3fnuz decode identically on NVIDIA, ROCm and the interpreter); FP8 block scales stay fp32
[E, ceil(N/128), ceil(K/128)]. MXFP4 keeps its UE8M0 bytes; its packed nibbles are copied with the bits of each
16-bit element (the four e2m1 codes of k = 4e .. 4e + 3) reordered so that the decode takes few instructions
(mxfp4_decode.MX_BITS).

Algorithm (no host sync, fixed-size buffers: CUDA-graph safe):
  1. align (torch ops on the device): the T*k (token, slot) pairs are sorted by expert (stable), each
     expert's run is padded up to a multiple of BLOCK_M, and every BLOCK_M block gets its expert (-1 for
     unused blocks). The buffers are sized for the worst case, T*k + min(E, T*k) * (BLOCK_M - 1) rows,
     so nothing depends on the routing's values. Ids < 0 (and >= E) go to no block: they contribute 0.
  2. kernel 1, grid (blocks, I / BLOCK_N): gathered x rows [BLOCK_M, H] times the expert's gate (w1) and
     up (w3) tiles, dequantized in registers, two fp32 accumulators; then the clamped SwiGLU of
     moe_activation, h = silu(min(g, limit)) * clamp(u, -limit, limit), stored bf16 at the pair's sorted row.
  3. kernel 2, grid (blocks, H / BLOCK_N): h rows [BLOCK_M, I] times the expert's w2 tiles, scaled by the
     pair's routing weight and atomically added (fp32) into y [T, H]; y is cast to bf16 at the end.

MXFP4 decode (T <= 64) runs two other kernels with the same algorithm and buffers (fused_moe_swapped): the weight
rows are the dot's M and the tokens its N, the activations and h are split by k mod 4; for one token they skip the
alignment (a block a route), and the down kernel's last program of each column tile writes it as bf16 (no cast
launch). Shapes whose H or I is not a multiple of 64 run the row kernels (fused_moe_rows).

Dequantization: MXFP4 weights are read as 16-bit elements, decoded into four operands (one per k mod 4) that are
dotted against the matching activations, exactly in bf16 (by inline PTX on NVIDIA GPUs, in plain Triton elsewhere:
mxfp4_decode). FP8 codes are exact in bf16; the 128x128 block scale is constant along K inside a tile (BLOCK_K
divides 128) and is applied per output column after the dot, as DeepGEMM does. Activations stay bf16 (W4A16 /
W8A16); accumulation is fp32.

This module holds the layout, the tile configs and the choice between the two kernel families; each family's
module launches its own kernels.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch

from dsv4hal.formats.experts import ExpertWeights
from dsv4hal.kernels.moe_align import align_routes
from dsv4hal.kernels.triton.fused_moe_rows import launch_rows
from dsv4hal.kernels.triton.fused_moe_swapped import (
    DOWN_KEYS,
    SWAP_MAX_BLOCK_K,
    SWAP_MIN_BLOCK_K,
    launch_swapped,
    pow2_divisor,
)
from dsv4hal.kernels.triton.moe_activation import swiglu_limit_args
from dsv4hal.kernels.triton.mxfp4_decode import MX_NARROW_SCALE_MAX, reorder_mxfp4
from dsv4hal.ops.moe import token_class
from dsv4hal.prepared import ExpertTensors

LAYOUT = "triton-moe-v2"
# Triton's interpreter computes tl.dot on bf16 operands wrongly: upcast them to fp32 there.
_DOT_F32 = os.environ.get("TRITON_INTERPRET") == "1"
# The swapped MXFP4 kernels decode with inline PTX on NVIDIA GPUs, in plain Triton elsewhere (same values).
_MX_ASM = not _DOT_F32 and torch.version.hip is None

# Tile sizes per (format, token class), the fastest of nine each on an H200 with V4-Flash experts at T = 64 and
# 4096 (bench/results/h200/tune-moe.json; every one checked against the float64 oracle there). BLOCK_M is the
# rows of one expert block: 16 for decode (a few pairs per expert), 64-128 for prefill. MXFP4 decode runs the
# swapped kernels (fused_moe_swapped) with blocks of 8 routes, the fastest of 43 settings at T = 1 .. 64 on the H200 and
# 4.7-5.5x the row kernels (bench/results/h200/sweep-mx-moe-decode.json); "swap" (MXFP4 only): False selects the
# row kernels. "pair" (swapped kernels): gate and up rows of the same outputs in one tile, twice the gate-up programs;
# None (the default) pairs when the unpaired grid would give each SM fewer than two programs: on the H200 V4-Flash
# at T = 1 (192 programs for 132 SMs) 47.1 -> 42.8 us, and slower from T = 2 (sweep-mx-moe-decode.json, "grid_v3").
# "split_x" (swapped kernels): x split by k mod 4 by a launch before them (True), or (None, the default) read as it
# is by the gate-up kernel at one token, one launch fewer (on the H100 V4-Flash at T = 1 40.1 against 40.7 us,
# h100/sweep-mx-moe-decode-l2.json), split from two tokens.
CONFIGS = {
    ("mxfp4", "decode"): {"block_m": 8, "block_n": 64, "block_k": 256, "num_warps": 4, "num_stages": 3,
                          "swap": True},
    ("mxfp4", "prefill"): {"block_m": 64, "block_n": 64, "block_k": 128, "num_warps": 4, "num_stages": 3},
    ("fp8_block", "decode"): {"block_m": 16, "block_n": 32, "block_k": 128, "num_warps": 4, "num_stages": 3},
    ("fp8_block", "prefill"): {"block_m": 128, "block_n": 64, "block_k": 64, "num_warps": 4, "num_stages": 3},
}
FP8_BLOCK = 128
# MXFP4 past the decode class keeps the decode tiles (the swapped kernels) while the experts average at most this
# many routes each: a block of 8 routes reads its expert's weights once, so the weight traffic stays about one read
# an expert, where the row kernels' prefill tiles are ~5x slower at these sizes. V4-Flash (256 experts, top-6):
# up to 341 tokens, an MTP verify step of 64 requests x 4 tokens included.
SWAP_ROUTES_PER_EXPERT = 8
ROW_DECODE_TILES = {"block_m": 16, "block_n": 64, "block_k": 64}  # the row kernels' decode tiles


@dataclass(frozen=True)
class TritonMoeWeights(ExpertTensors):
    """Payload of weights prepared for triton_fused_moe (layout triton-moe-v2, see the module doc): w13 uint8
    [E, 2I, H/2] (mxfp4, elements reordered: MX_BITS) or [E, 2I, H] FP8 bytes, w13_scale uint8 [E, 2I, H/32] or
    fp32 [E, ceil(2I/128), ceil(H/128)]; w2 uint8 [E, H, I/2] or [E, H, I], w2_scale uint8 [E, H, I/32] or fp32
    [E, ceil(H/128), ceil(I/128)]."""

    format: str  # "mxfp4" or "fp8_block"
    fnuz: bool  # fp8_block only: e4m3fnuz codes (bias 8) rather than e4m3fn
    narrow_scales: bool = False  # mxfp4 only: every scale byte <= MX_NARROW_SCALE_MAX


def prepare_weights(w: ExpertWeights) -> TritonMoeWeights:
    """Logical ExpertWeights -> TritonMoeWeights: FP8 uncopied (made contiguous), MXFP4 nibbles reordered. The MXFP4
    scale bytes are read once here (a host sync at load time) to record whether all are narrow."""
    def raw(t: torch.Tensor) -> torch.Tensor:
        t = t.contiguous()
        return t if t.dtype == torch.uint8 or t.dtype == torch.float32 else t.view(torch.uint8)

    mx = w.format == "mxfp4"
    if mx:
        s13, s2 = raw(w.w13_scale), raw(w.w2_scale)
        narrow = max(int(s13.max()), int(s2.max())) <= MX_NARROW_SCALE_MAX if s13.numel() and s2.numel() else True
        return TritonMoeWeights(
            format=w.format, fnuz=False, narrow_scales=narrow, w13=reorder_mxfp4(raw(w.w13)), w13_scale=s13,
            w2=reorder_mxfp4(raw(w.w2)), w2_scale=s2, num_experts=w.num_experts, hidden=w.hidden,
            intermediate=w.intermediate)
    return TritonMoeWeights(
        format=w.format, fnuz=w.fp8 == "e4m3fnuz", w13=raw(w.w13), w13_scale=w.w13_scale.float().contiguous(),
        w2=raw(w.w2), w2_scale=w.w2_scale.float().contiguous(), num_experts=w.num_experts, hidden=w.hidden,
        intermediate=w.intermediate)


def tile_class(fmt: str, num_tokens: int, top_k: int, num_experts: int) -> str:
    """The CONFIGS class of a call: "decode" for the op's few and decode token classes (ops.moe.token_class), and
    for MXFP4 while the experts average at most SWAP_ROUTES_PER_EXPERT routes each; "prefill" past that."""
    if fmt == "mxfp4" and num_tokens * top_k <= SWAP_ROUTES_PER_EXPERT * num_experts:
        return "decode"
    return "prefill" if token_class(num_tokens) == "prefill" else "decode"


def _config(fmt: str, num_tokens: int, top_k: int, num_experts: int, config: dict | None) -> dict:
    base = CONFIGS[(fmt, tile_class(fmt, num_tokens, top_k, num_experts))]
    cfg = {**base, **(config or {})}
    bk, bn, bm = cfg["block_k"], cfg["block_n"], cfg["block_m"]
    if fmt == "mxfp4" and cfg.get("swap"):
        if bk & (bk - 1) or not SWAP_MIN_BLOCK_K <= bk <= SWAP_MAX_BLOCK_K:
            raise ValueError(f"block_k of the swapped MXFP4 kernels must be a power of two in [{SWAP_MIN_BLOCK_K}, "
                             f"{SWAP_MAX_BLOCK_K}] (four dots of K >= 16 a step); got {bk}")
    elif bk & (bk - 1) or not (64 if fmt == "mxfp4" else 32) <= bk <= FP8_BLOCK:
        raise ValueError(f"block_k must be a power of two in [32, {FP8_BLOCK}] (it divides the 128 FP8 block), for "
                         f"MXFP4 in [64, {FP8_BLOCK}] (four dots of K >= 16 a step); got {bk}")
    min_m = 8 if fmt == "mxfp4" and cfg.get("swap") else 16  # the swapped kernels' tokens are the dot's N
    for key, what in (("pair", "the swapped gate-up kernel's gate and up rows in one tile"),
                      ("split_x", "x split by k mod 4 by a launch before the swapped kernels")):
        if cfg.get(key) is not None and type(cfg[key]) is not bool:
            raise ValueError(f"{key} ({what}) must be True, False or None (auto); got {cfg[key]!r}")
    if bn & (bn - 1) or bn < 16 or bm & (bm - 1) or bm < min_m:
        raise ValueError(f"block_m and block_n must be powers of two >= {min_m} and 16; got {bm}, {bn}")
    down = cfg.get("down") or {}
    dbn, dbk = down.get("block_n", bn), down.get("block_k", bk)
    if down and (set(down) - set(DOWN_KEYS) or dbn & (dbn - 1) or dbn < 16 or dbk & (dbk - 1) or not (
            SWAP_MIN_BLOCK_K <= dbk <= SWAP_MAX_BLOCK_K)):
        raise ValueError(f"down (the swapped down kernel's own tiles) takes {', '.join(DOWN_KEYS)}: block_n a power "
                         f"of two >= 16, block_k one in [{SWAP_MIN_BLOCK_K}, {SWAP_MAX_BLOCK_K}]; got {down!r}")
    return cfg


def fused_moe(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, weights: TritonMoeWeights,
              swiglu_limit: float = 10.0, *, config: dict | None = None) -> torch.Tensor:
    """moe_experts on prepared weights with an optional tile config (block_m/n/k, num_warps, num_stages)."""
    t, hid = x.shape
    k = topk_ids.shape[1]
    e, inter = weights.num_experts, weights.intermediate
    dev = x.device
    p = t * k
    cfg = _config(weights.format, t, k, e, config)
    mx = weights.format == "mxfp4"
    swapped = mx and bool(cfg.get("swap")) and hid % SWAP_MIN_BLOCK_K == 0 and inter % SWAP_MIN_BLOCK_K == 0
    if mx and cfg.get("swap") and not swapped:  # shapes the swapped kernels do not take: the row kernels and tiles
        cfg = {**cfg, **ROW_DECODE_TILES}
    bm, bn, bk = cfg["block_m"], cfg["block_n"], cfg["block_k"]
    if p == 0:
        return torch.zeros(t, hid, dtype=torch.bfloat16, device=dev)
    # "direct" (swapped kernels, one token): no alignment, block b is route b (a token's routes rarely share an
    # expert, and one that does is read twice, still correct)
    direct = swapped and t == 1 and cfg.get("direct", True)
    if direct:
        block_expert = sorted_pairs = topk_ids.reshape(-1).contiguous()  # (sorted_pairs is not read)
    else:
        routes = align_routes(topk_ids, e, bm)
        sorted_pairs, block_expert = routes.sorted_routes, routes.block_expert
    nb = block_expert.numel()
    x = x.contiguous()
    tw = topk_weights.reshape(-1).float().contiguous()
    h = torch.empty(nb * bm, inter, dtype=torch.bfloat16, device=dev)
    limit, clamp = swiglu_limit_args(swiglu_limit)
    w13, s13, w2, s2 = weights.w13, weights.w13_scale, weights.w2, weights.w2_scale
    if mx:  # 16-bit elements of four codes each; the activations split by k mod 4: [T, 4, H / 4]
        w13, w2 = w13.view(torch.int16), w2.view(torch.int16)
        split_x = cfg.get("split_x")  # None: split from two tokens; one token is read as it is (one launch fewer)
        if not swapped or (not direct if split_x is None else split_x):
            x = x.view(t, hid // 4, 4).transpose(1, 2).contiguous()
    # "ptx": False runs the plain Triton decode on an NVIDIA GPU too (to measure what ROCm runs)
    asm = dict(ASM=mx and _MX_ASM and cfg.get("ptx", True), NARROW=weights.narrow_scales)
    meta = dict(BLOCK_M=bm, BLOCK_N=bn, DOT_F32=_DOT_F32, num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
                **asm)
    if swapped:
        tiles = dict(BLOCK_K=min(bk, pow2_divisor(math.gcd(hid, inter))), DIRECT=direct, **meta)  # K tiles end at K
        return launch_swapped(x, w13, s13, w2, s2, h, tw, sorted_pairs, block_expert, k, e, cfg, tiles, limit, clamp)
    return launch_rows(x, w13, s13, w2, s2, h, tw, sorted_pairs, block_expert, k, limit, clamp,
                       dict(MXFP4=mx, FNUZ=weights.fnuz, BLOCK_K=bk, **meta))


def moe_experts(x: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor, weights: TritonMoeWeights,
                swiglu_limit: float = 10.0) -> torch.Tensor:
    """x bf16 [T, H], topk_ids int32 [T, k], topk_weights fp32 [T, k], weights from prepare_weights ->
    bf16 [T, H]: sum over slots of weight * clamped-SwiGLU expert (ids < 0 contribute nothing)."""
    if not isinstance(weights, TritonMoeWeights):
        raise TypeError(f"triton_fused_moe needs weights from its prepare_weights (layout {LAYOUT}); "
                        f"got {type(weights).__name__}")
    return fused_moe(x, topk_ids, topk_weights, weights, swiglu_limit)
