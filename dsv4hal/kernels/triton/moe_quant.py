"""Per-token 1x128 FP8 quantization of routed rows, the activations of FP8 grouped GEMMs (DeepGEMM's contiguous
layout): e4m3fn codes and fp32 scales for every sorted row that holds a route, padding rows skipped.

Two sources: GATHER (row r takes x[token of route r], the input of GEMM1) or SWIGLU (row r is GEMM1's output
[gate | up] at row r; it becomes min(g, limit) -> silu times clamp(u, -limit, limit), the input of GEMM2).
Scales are amax / 448 (amax floored at 1e-4, as DeepGEMM's per_token_cast_to_fp8) and are written MN-major,
sf[g, r], so the [rows, K/128] view DeepGEMM wants on SM90 needs no per-call transform. The FP8 codes are
made with integer arithmetic (fp8_codec), so the interpreter gives the GPU's bytes.

A program quantizes a tile of BLOCK_R rows x BLOCK_G 128-groups at a time (BLOCK_R * BLOCK_G = TILE pairs):
many rows when routes are dense (prefill: 16-byte accesses, few programs), many groups of one row when they are
sparse (decode: a row's K/128 groups in a few steps instead of K/128 dependent ones). The GATHER pass can also
write DeepGEMM's per-row grouped_layout (the row's expert, -1 for padding), which saves the torch ops that built
it from block_expert; the LAYOUT flag turns that store off (DeepGEMM's psum layout needs no per-row layout).

Many tokens (prefill): the GATHER source is quantized once a token, a token's k routes sharing one quantization
instead of k (the same bytes, since a row's codes depend on its source row only): stored straight into its routes'
rows (_quant_scatter_kernel, given AlignedRoutes.row_of_route) where no padding row needs writing, else quantized
(DIRECT) and then copied by each route's row (_gather_codes_kernel), which also writes the padding rows.

A NaN in the source is carried as FP8's NaN code (_group_codes), never quantized to a finite one."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dsv4hal.kernels.triton.fp8_codec import fp8_bits, hardware_fp8
from dsv4hal.kernels.triton.moe_activation import _swiglu_f32, _swiglu_f32_fast, _to_bf16, swiglu_limit_args

GROUP = 128
TILE = 16  # (row, group) pairs a program quantizes at once: 2048 elements, 16 a thread at 4 warps
# Rows a tile holds at most. H200, T = 4096 (V4-Flash, top-6; sweep-moe-quant.json, "tiles"): 4 rows x 4 groups
# with the loads pipelined over 3 stages take the gather pass 71.9 -> 61.2 us and the SwiGLU pass 133.4 -> 97.2
# against 16 x 1 in one stage (the best of 70 settings: 60.0 and 95.9). The SwiGLU pass is then bound by its
# instructions (libdevice expf and an IEEE division an element, torch's roundings), not by bandwidth (0.62 of copy).
MAX_BLOCK_R = 4
DENSE_STAGES = 3  # the pipeline stages of tiles of several rows; a decode tile (one row) keeps one
# The DIRECT pass splits each row's 128-groups over grid axis 1 until about this many programs run: at T = 64 one
# program per 4 rows made 16 programs, each stepping through the whole row in turn (latency-bound).
DIRECT_PROGRAMS = 256
# From this many tokens the GATHER source is quantized a token, then copied to its routes' rows (two launches);
# fewer tokens quantize each route's row directly (one launch). H200, V4-Flash, top-6, CUDA graphs, 3 rounds
# (sweep-moe-quant.json, "per_token_few", "per_token"): one launch -> two, us: T = 1 3.6 -> 5.9-6.4, 8 6.0-6.1
# -> 6.8-6.9, 16 9.6-9.7 -> 7.6-7.7, 32 17.1-17.2 -> 9.5-9.6, 64 21.6-22.3 -> 10.1-10.9, 1024 22.4-25.2 ->
# 18.8-19.3, 4096 64.0-118.6 -> 59.0-71.5; the same bytes. Where no padding row needs writing (the psum layout, no
# pow2 scales) the tokens' codes go straight to their routes' rows instead (_quant_scatter_kernel, one launch): T =
# 4096 58.8-60.4 -> 50.1-50.3 us (sweep-moe-quant.json, "swiglu_fast", 3 rounds).
PER_TOKEN_MIN_TOKENS = 16
# The SWIGLU source with the hardware's approximate exp and division (moe_activation._swiglu_f32_fast) instead of
# torch's exact roundings (libdevice expf, an IEEE division): the pass is bound by those instructions (see MAX_BLOCK_R).
# A code can then differ from the exact form's by one FP8 step (an element's bf16 value one ulp off moves a code only
# when it sits on a rounding boundary); moe_experts' tolerance is set for activation quantization as a whole. H200,
# GEMM1's real output at T = 4096 (sweep-moe-quant.json, "swiglu_fast", 3 rounds): 94.5-128.4 -> 67.0-78.0 us, and 0 of
# its 50.3M codes and 393K scales differed. fast=False in quantize_routed_rows keeps torch's roundings.
FAST_SWIGLU = True
# The scatter's tile: one token a program, this many 128-groups a step. H200, V4-Flash top-6, CUDA graphs
# (sweep-moe-quant.json, "scatter_grid"; every tile gave the same bytes), us for (BLOCK_T, BLOCK_G) at 4 warps: T = 4096
# (4, 4) 50.1, (1, 16) 51.1, (1, 32) 49.5; T = 256 (4, 4) 9.5, (2, 8) 6.6, (1, 16) 5.6, (1, 32) 5.5 (more programs).
SCATTER_GROUPS = 32
COPY_ROWS = 4  # rows a program of the copy pass moves
COPY_WORDS = 1024  # 4-byte words of codes a step of the copy pass moves a row (4 KiB)


@triton.jit
def _group_codes(v, POW2: tl.constexpr, HW_FP8: tl.constexpr, FNUZ: tl.constexpr = False,
                 EXACT: tl.constexpr = False):
    """fp32 [pairs, 128] (one 128-group a row) -> (e4m3 codes uint8 [pairs, 128], scales fp32 [pairs]): scale
    max(amax, 1e-4) / FP8_MAX (POW2: rounded up to a power of two, UE8M0, exactly representable), codes v / scale.
    FP8_MAX is 448 for e4m3fn codes, 240 for e4m3fnuz (FNUZ). EXACT: both divisions IEEE (div_rn), so the codes and
    scales are torch's (dsv4hal.formats.fp8_block.act_quant_1x128) on the GPU too; off, they are the GPU's
    approximate division (up to 2 ulp: a code may sit one FP8 step off where the quotient is at a rounding tie).

    amax skips NaNs (tl.max does, on the GPU and in the interpreter), so a NaN element keeps its group's scale and
    must reach the codec as NaN: its code is FP8's NaN and the GEMM or the output carries it on. The hardware cast
    saturates (satfinite) and keeps NaN; the integer encoder wants values within +-FP8_MAX."""
    FP8_MAX: tl.constexpr = 240.0 if FNUZ else 448.0
    amax = tl.maximum(tl.max(tl.abs(v), axis=1), 1e-4)
    if EXACT:
        scale = tl.math.div_rn(amax, tl.full(amax.shape, FP8_MAX, tl.float32))
    else:
        scale = amax / FP8_MAX
    if POW2:
        bits = scale.to(tl.int32, bitcast=True)
        inexact = (bits & 0x7FFFFF) != 0
        scale = ((bits & 0x7F800000) + tl.where(inexact, 0x800000, 0)).to(tl.float32, bitcast=True)
    if EXACT:
        y = tl.math.div_rn(v, tl.broadcast_to(scale[:, None], v.shape))
    else:
        y = v / scale[:, None]
    if FNUZ or not HW_FP8:
        y = tl.minimum(tl.maximum(y, -FP8_MAX, propagate_nan=tl.PropagateNan.ALL), FP8_MAX,
                       propagate_nan=tl.PropagateNan.ALL)
    return fp8_bits(y, FNUZ, HW_FP8), scale


# sizes that change with T are not specialised on (K and the strides are: their divisibility vectorises accesses)
@triton.jit(do_not_specialize=["rows", "num_routes"])
def _quant_rows_kernel(src_ptr, stride_src, sorted_ptr, q_ptr, sf_ptr, stride_sf_g, layout_ptr, block_expert_ptr,
                       rows, num_routes, top_k, K, align, limit, groups_per_program, row_groups, group_stride,
                       BLOCK_R: tl.constexpr, BLOCK_G: tl.constexpr, GATHER: tl.constexpr, SWIGLU: tl.constexpr,
                       CLAMP: tl.constexpr, POW2: tl.constexpr, LAYOUT: tl.constexpr, HW_FP8: tl.constexpr,
                       STAGES: tl.constexpr, DIRECT: tl.constexpr, FAST: tl.constexpr, EXACT: tl.constexpr):
    # pair i of the tile: row r0 + i // BLOCK_G, group g0 + i % BLOCK_G (a row's BLOCK_G pairs share its loads);
    # grid axis 1 splits a row's groups into runs of groups_per_program (a multiple of BLOCK_G)
    i = tl.arange(0, BLOCK_R * BLOCK_G)
    g_first = tl.program_id(1) * groups_per_program
    r = tl.program_id(0) * BLOCK_R + i // BLOCK_G
    lane = i % BLOCK_G
    in_rows = r < rows
    if DIRECT:  # row r is source row r (a token, quantized once for all its routes): no sorted rows
        route = r
        valid = in_rows
    else:
        route = tl.load(sorted_ptr + r, mask=in_rows, other=num_routes)
        valid = route < num_routes
    if LAYOUT:  # every row, tail included: DeepGEMM reads the expert of a block's first row, skips -1 sub-blocks
        first = in_rows & (lane + g_first == 0)  # one store a row: its first program, first lane
        expert = tl.load(block_expert_ptr + r // align, mask=first & valid, other=-1)
        tl.store(layout_ptr + r, tl.where(valid, expert, -1), mask=first)
    # POW2: padding rows get zero codes and scale 1, as the GEMM may read (and pack) every row
    write = in_rows if POW2 else valid
    if tl.max(write.to(tl.int32), axis=0) == 0:
        return
    src_row = (route // top_k) if GATHER else r
    base = src_ptr + src_row.to(tl.int64) * stride_src
    q_row = q_ptr + r.to(tl.int64) * K
    cols = tl.arange(0, 128)
    num_groups = K // 128
    g_last = tl.minimum(g_first + groups_per_program, num_groups)
    for g0 in tl.range(g_first, g_last, BLOCK_G, num_stages=STAGES):  # STAGES > 1: the next groups load meanwhile
        g = g0 + lane
        load = valid & (g < g_last)
        c = (g * 128)[:, None] + cols[None, :]
        if SWIGLU:  # bf16 activations, as the other paths
            gate = tl.load(base[:, None] + c, mask=load[:, None], other=0.0).to(tl.float32)
            up = tl.load(base[:, None] + K + c, mask=load[:, None], other=0.0).to(tl.float32)
            if FAST:
                v = _to_bf16(_swiglu_f32_fast(gate, up, limit, CLAMP)).to(tl.float32)
            else:
                v = _to_bf16(_swiglu_f32(gate, up, limit, CLAMP)).to(tl.float32)
        else:
            v = tl.load(base[:, None] + c, mask=load[:, None], other=0.0).to(tl.float32)
        q, scale = _group_codes(v, POW2, HW_FP8, False, EXACT)
        if POW2:
            scale = tl.where(valid, scale, 1.0)  # padding rows loaded zeros: codes 0 with scale 1
        store = write & (g < g_last)
        tl.store(q_row[:, None] + c, q, mask=store[:, None])
        # row r = (t, j) of row_groups rows a token keeps its scales in block j of group_stride: r's column t
        tl.store(sf_ptr + g * stride_sf_g + (r % row_groups) * group_stride + r // row_groups, scale, mask=store)


@triton.jit(do_not_specialize=["rows", "num_routes", "tokens"])
def _gather_codes_kernel(qt_ptr, sft_ptr, tokens, sorted_ptr, q_ptr, sf_ptr, stride_sf_g, layout_ptr,
                         block_expert_ptr, rows, num_routes, top_k, W, NG, align, BLOCK_R: tl.constexpr,
                         BLOCK_W: tl.constexpr, BLOCK_G: tl.constexpr, POW2: tl.constexpr, LAYOUT: tl.constexpr):
    """Row r of the sorted routes <- the codes (W 4-byte words) and NG scales of its route's token, quantized by
    the DIRECT pass: qt [tokens, W] int32, sft [NG, tokens] MN-major. Padding rows as _quant_rows_kernel leaves
    them: untouched, or with POW2 zero codes and scale 1; LAYOUT as there."""
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    in_rows = r < rows
    route = tl.load(sorted_ptr + r, mask=in_rows, other=num_routes)
    valid = route < num_routes
    if LAYOUT:
        expert = tl.load(block_expert_ptr + r // align, mask=in_rows & valid, other=-1)
        tl.store(layout_ptr + r, tl.where(valid, expert, -1), mask=in_rows)
    write = in_rows if POW2 else valid
    if tl.max(write.to(tl.int32), axis=0) == 0:
        return
    token = tl.where(valid, route // top_k, 0).to(tl.int64)
    g = tl.arange(0, BLOCK_G)
    gm = write[:, None] & (g < NG)[None, :]
    scale = tl.load(sft_ptr + g[None, :] * tokens + token[:, None], mask=valid[:, None] & gm, other=1.0)
    tl.store(sf_ptr + g[None, :] * stride_sf_g + r[:, None], scale, mask=gm)
    src = qt_ptr + token * W
    dst = q_ptr + r.to(tl.int64) * W
    w = tl.arange(0, BLOCK_W)
    for w0 in range(0, W, BLOCK_W):
        c = w0 + w
        cm = (c < W)[None, :]
        words = tl.load(src[:, None] + c[None, :], mask=valid[:, None] & cm, other=0)
        tl.store(dst[:, None] + c[None, :], words, mask=write[:, None] & cm)


@triton.jit(do_not_specialize=["tokens", "rows"])
def _quant_scatter_kernel(x_ptr, stride_x, row_of_route_ptr, q_ptr, sf_ptr, stride_sf_g, tokens, rows, top_k, K,
                          BLOCK_T: tl.constexpr, BLOCK_G: tl.constexpr, HW_FP8: tl.constexpr, STAGES: tl.constexpr):
    """The gather pass in one launch from the tokens' side: each token's row of x quantized once (as the DIRECT
    pass) and its codes and scales stored straight into the sorted rows of its routes (row_of_route [T*k]; a
    dropped route's row is `rows`: skipped). No per-token buffer, no copy launch; padding rows are left alone."""
    i = tl.arange(0, BLOCK_T * BLOCK_G)
    t = tl.program_id(0) * BLOCK_T + i // BLOCK_G
    lane = i % BLOCK_G
    valid = t < tokens
    base = x_ptr + t.to(tl.int64) * stride_x
    route0 = row_of_route_ptr + t.to(tl.int64) * top_k
    cols = tl.arange(0, 128)
    num_groups = K // 128
    for g0 in tl.range(0, num_groups, BLOCK_G, num_stages=STAGES):
        g = g0 + lane
        load = valid & (g < num_groups)
        c = (g * 128)[:, None] + cols[None, :]
        v = tl.load(base[:, None] + c, mask=load[:, None], other=0.0).to(tl.float32)
        q, scale = _group_codes(v, False, HW_FP8)
        for j in range(0, top_k):
            row = tl.load(route0 + j, mask=load, other=rows)
            ok = load & (row < rows)
            tl.store(q_ptr + row[:, None] * K + c, q, mask=ok[:, None])
            tl.store(sf_ptr + g * stride_sf_g + row, scale, mask=ok)


def row_tile(num_rows: int, num_routes: int, k_dim: int, block: int = 128) -> tuple[int, int]:
    """-> (BLOCK_R, BLOCK_G) for num_rows sorted rows holding num_routes routes.

    Routes sit at the start of blocks of `block` rows (one expert's each, DeepGEMM's M alignment), so
    num_routes * block / num_rows estimates the routes a block starts with: that many rows a program (a power of
    two, at most MAX_BLOCK_R, or more when a row has too few groups to fill the tile) keeps programs busy without
    leaving most of their rows empty; the rest of the tile goes to 128-groups of the same rows, so a decode row is
    quantized in K/128/BLOCK_G steps."""
    groups = triton.next_power_of_2(max(k_dim // GROUP, 1))
    dense = num_routes * block // max(num_rows, 1)
    block_r = 1 << max(0, min(dense, max(MAX_BLOCK_R, TILE // groups)).bit_length() - 1)
    return block_r, min(TILE // block_r, groups)


def quantize_routed_rows(src: torch.Tensor, sorted_routes: torch.Tensor, num_routes: int, top_k: int, k_dim: int,
                         *, gather: bool, swiglu_limit: float | None = None, pow2_scales: bool = False,
                         layout: torch.Tensor | None = None, block_expert: torch.Tensor | None = None,
                         tile: tuple[int, int] | None = None, warps: int = 4, stages: int | None = None,
                         per_token: bool | None = None, fast: bool | None = None,
                         row_of_route: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (codes uint8 [rows, K] (view as float8_e4m3fn), scales fp32 [rows, K/128] with strides (1, rows)).

    rows = sorted_routes.numel() (a multiple of 4, so the MN-major scales are TMA-aligned); padding rows
    (sorted_routes >= num_routes) are left unwritten, or with pow2_scales (scales rounded up to powers of two,
    as SM100's UE8M0 packing needs) written as zeros with scale 1. src: x [T, K] (gather) or GEMM1's output
    [rows, 2K]. block_expert int32 [rows / block] (AlignedRoutes'): gives row_tile the block; with layout int32
    [rows] (which needs it) also filled with each row's expert, -1 for padding rows (DeepGEMM's per-row
    grouped_layout). tile (the one-launch and scatter passes'): (BLOCK_R, BLOCK_G), else row_tile's; warps, stages:
    the launch's (stages > 1 pipelines the loads of a row's 128-groups; default DENSE_STAGES for tiles of several
    rows, else 1).
    per_token (gather only; default: from PER_TOKEN_MIN_TOKENS tokens, a shape-only choice): quantize each token
    once and copy its codes to its routes' rows, two launches and the same bytes; with row_of_route (AlignedRoutes',
    int64 [T*k]) and neither pow2_scales nor layout (which write padding rows too), one launch that stores each
    token's codes straight into its routes' rows (_quant_scatter_kernel), the same bytes. fast (swiglu only; default
    FAST_SWIGLU): the SwiGLU with approximate exp and division, within one FP8 step of the exact form's codes."""
    if k_dim % GROUP:
        raise ValueError(f"quantize_routed_rows: K={k_dim} is not a multiple of {GROUP}")
    rows = sorted_routes.numel()
    if layout is not None and block_expert is None:
        raise ValueError("quantize_routed_rows: pass layout and block_expert together")
    align = GROUP  # DeepGEMM's M alignment, for row_tile's estimate when no blocks are given
    if block_expert is not None:
        nb = block_expert.numel()
        if rows and (nb == 0 or rows % nb):
            raise ValueError(f"quantize_routed_rows: {rows} rows are no whole number of block_expert's {nb} blocks")
        if layout is not None and (layout.shape != (rows,) or layout.dtype != torch.int32):
            raise ValueError(f"quantize_routed_rows: layout must be int32 [{rows}]")
        align = rows // max(nb, 1)
    tokens = src.shape[0]
    if per_token is None:
        per_token = gather and tokens >= PER_TOKEN_MIN_TOKENS
    if per_token and rows:
        if not gather:
            raise ValueError("quantize_routed_rows: per_token applies to the gather pass only")
        if row_of_route is not None and not pow2_scales and layout is None:
            return _scatter_from_tokens(src, row_of_route, rows, top_k, k_dim, tile, warps)
        return _per_token_then_copy(src, sorted_routes, num_routes, top_k, k_dim, pow2_scales, layout, block_expert,
                                    align, warps)
    q = torch.empty(rows, k_dim, dtype=torch.uint8, device=src.device)
    sf = torch.empty(k_dim // GROUP, rows, dtype=torch.float32, device=src.device)
    if rows:
        limit, clamp = swiglu_limit_args(swiglu_limit)
        block_r, block_g = tile or row_tile(rows, num_routes, k_dim, align)
        stages = stages or (DENSE_STAGES if block_r > 1 else 1)
        has_layout = layout is not None  # LAYOUT: the per-row layout store, off for psum (and SWIGLU) passes
        _quant_rows_kernel[(triton.cdiv(rows, block_r),)](
            src, src.stride(0), sorted_routes, q, sf, sf.stride(0), layout if has_layout else sorted_routes,
            block_expert if has_layout else sorted_routes, rows, num_routes, top_k, k_dim, align, limit,
            k_dim // GROUP, 1, 0, BLOCK_R=block_r, BLOCK_G=block_g, GATHER=gather, SWIGLU=swiglu_limit is not None,
            CLAMP=clamp, POW2=pow2_scales, LAYOUT=has_layout, HW_FP8=hardware_fp8(src.device), STAGES=stages,
            num_warps=warps, DIRECT=False, FAST=swiglu_limit is not None and (FAST_SWIGLU if fast is None else fast),
            EXACT=False)
    return q, sf.t()


def _scatter_from_tokens(x: torch.Tensor, row_of_route: torch.Tensor, rows: int, top_k: int, k_dim: int,
                         tile: tuple[int, int] | None, warps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The gather pass in one launch from the tokens' side (_quant_scatter_kernel); tile (BLOCK_T, BLOCK_G)."""
    tokens, dev = x.shape[0], x.device
    if row_of_route.shape != (tokens * top_k,) or row_of_route.dtype != torch.int64:
        raise ValueError(f"quantize_routed_rows: row_of_route must be int64 [{tokens * top_k}] (AlignedRoutes')")
    q = torch.empty(rows, k_dim, dtype=torch.uint8, device=dev)
    sf = torch.empty(k_dim // GROUP, rows, dtype=torch.float32, device=dev)
    block_t, block_g = tile or (1, min(SCATTER_GROUPS, triton.next_power_of_2(k_dim // GROUP)))
    _quant_scatter_kernel[(triton.cdiv(tokens, block_t),)](
        x, x.stride(0), row_of_route, q, sf, sf.stride(0), tokens, rows, top_k, k_dim, BLOCK_T=block_t,
        BLOCK_G=block_g, HW_FP8=hardware_fp8(dev), STAGES=DENSE_STAGES if block_t > 1 else 1, num_warps=warps)
    return q, sf.t()


def _quantize_tokens(x: torch.Tensor, k_dim: int, pow2_scales: bool, exact: bool, pitch: int, warps: int,
                     groups: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """x's rows quantized 1x128 in one launch (DIRECT): (codes uint8 [rows, K], scales fp32 [groups, K/128, pitch],
    MN-major: row r = t * groups + j keeps its scales in column t of block j; columns past rows / groups
    unwritten)."""
    tokens, dev = x.shape[0], x.device
    kb = k_dim // GROUP
    qt = torch.empty(tokens, k_dim, dtype=torch.uint8, device=dev)
    sft = torch.empty(groups, kb, pitch, dtype=torch.float32, device=dev)
    if tokens:
        unused = qt.view(torch.int32)  # the route and layout pointers: DIRECT reads none of them
        block_r, block_g = row_tile(tokens, tokens, k_dim, GROUP)  # every row dense
        row_programs = triton.cdiv(tokens, block_r)
        steps = triton.cdiv(kb, block_g)  # BLOCK_G-group steps a row takes
        per_program = triton.cdiv(steps, max(1, min(steps, triton.cdiv(DIRECT_PROGRAMS, row_programs)))) * block_g
        _quant_rows_kernel[(row_programs, triton.cdiv(kb, per_program))](
            x, x.stride(0), unused, qt, sft, pitch, unused, unused, tokens, tokens, 1,
            k_dim, GROUP, 0.0, per_program, groups, kb * pitch, BLOCK_R=block_r, BLOCK_G=block_g, GATHER=False,
            SWIGLU=False, CLAMP=False, POW2=pow2_scales, LAYOUT=False, HW_FP8=hardware_fp8(dev),
            STAGES=DENSE_STAGES if block_r > 1 else 1, num_warps=warps, DIRECT=True, FAST=False, EXACT=exact)
    return qt, sft


def quantize_grouped_tokens(x: torch.Tensor, *, pow2_scales: bool = False, exact: bool = True, warps: int = 4
                            ) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, G, K] (K a multiple of 128; x.reshape(T * G, K) a view with unit stride along K) -> (codes uint8
    [T, G, K] (view as float8_e4m3fn), scales fp32 [T, G, K/128]): the 1x128 activation quantization of
    quantize_routed_rows on every (token, group) row in one launch, the scales laid out per group MN-major with a
    pitch of T rounded up to 4 (strides (1, K/128 * pitch, pitch)): the [G, T, K/128] TMA-aligned layout DeepGEMM's
    SM90 fp8_einsum (and for G = 1 its fp8_gemm_nt) takes without a per-call transform. exact (the default): IEEE
    divisions, the bytes of dsv4hal.formats.fp8_block.act_quant_1x128."""
    t, g, k = x.shape
    if k % GROUP:
        raise ValueError(f"quantize_grouped_tokens: K={k} is not a multiple of {GROUP}")
    q, sft = _quantize_tokens(x.reshape(t * g, k), k, pow2_scales, exact, -(-t // 4) * 4, warps, groups=g)
    return q.view(t, g, k), sft.permute(2, 0, 1)[:t]


def quantize_tokens(x: torch.Tensor, *, pow2_scales: bool = False, exact: bool = True, warps: int = 4
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, K] -> (codes uint8 [T, K], scales fp32 [T, K/128] of strides (1, pitch)): quantize_grouped_tokens with
    one group, the TMA-aligned layout DeepGEMM's SM90 fp8_gemm_nt takes."""
    q, sx = quantize_grouped_tokens(x.unsqueeze(1), pow2_scales=pow2_scales, exact=exact, warps=warps)
    return q.view(x.shape), sx[:, 0]


def _per_token_then_copy(x: torch.Tensor, sorted_routes: torch.Tensor, num_routes: int, top_k: int, k_dim: int,
                         pow2_scales: bool, layout: torch.Tensor | None, block_expert: torch.Tensor | None,
                         align: int, warps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The gather pass in two launches: x's T rows quantized (DIRECT), then each sorted row copies its token's."""
    tokens, rows, dev = x.shape[0], sorted_routes.numel(), x.device
    qt, sft = _quantize_tokens(x, k_dim, pow2_scales, False, tokens, warps)
    sft = sft.view(k_dim // GROUP, tokens)  # one group of rows
    q = torch.empty(rows, k_dim, dtype=torch.uint8, device=dev)
    sf = torch.empty(k_dim // GROUP, rows, dtype=torch.float32, device=dev)
    has_layout = layout is not None
    ng = k_dim // GROUP
    _gather_codes_kernel[(triton.cdiv(rows, COPY_ROWS),)](
        qt.view(torch.int32), sft, tokens, sorted_routes, q.view(torch.int32), sf, sf.stride(0),
        layout if has_layout else sorted_routes, block_expert if has_layout else sorted_routes, rows, num_routes,
        top_k, k_dim // 4, ng, align, BLOCK_R=COPY_ROWS, BLOCK_W=min(COPY_WORDS, triton.next_power_of_2(k_dim // 4)),
        BLOCK_G=triton.next_power_of_2(ng), POW2=pow2_scales, LAYOUT=has_layout, num_warps=warps)
    return q, sf.t()
