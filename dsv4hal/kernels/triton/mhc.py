"""Portable Triton mHC: `mhc_pre`, `mhc_post`, `mhc_head` and the fused boundary `mhc_post_pre` (contracts:
dsv4hal.ops.mhc). Two launches for the gated ops, one for mhc_post; fixed-size outputs and workspaces (by shape
only) and no host sync: CUDA-graph safe.

Gated ops (pre, head, post_pre):
1. a split-K pre-norm GEMM: grid (token blocks, K splits) so that a few tokens still spread the [rows, 4d] fp32
   weight read over the whole GPU. Each program writes its partial mixes [T, rows] and partial sums of squares
   to a workspace [splits, T, ...] (no atomics: deterministic and nothing to zero first). For post_pre the
   program first forms the new stream x' = post * f + comb^T x for its columns of all 4 streams, stores it
   (bf16) and feeds the rounded values to the GEMM, so the stream is read once.
2. one program per (token, d block): reduce the partials, r = rsqrt(sumsq / 4d + eps), the sigmoid gates, the
   weighted sum of the 4 streams; the d block 0 program also writes post and the 4x4 Sinkhorn (in registers).

Precision: the stream is bf16 (exact in TF32) and fn is split into a TF32-exact high part and the remainder,
so two TF32 tensor-core dots give the fp32 product to ~2^-21 (plain TF32 would perturb the gate logits by
~2^-11 relative, the size of the 1e-3 conformance bound after 20 Sinkhorn rounds)."""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from dsv4hal.kernels.triton.device import sm_count

HC = 4
MIX = 24
# the apply launch's post and Sinkhorn in a program of their own up to this many tokens (apply_config)
COMB_APART_MAX_T = 64


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def _precision() -> str:
    # the interpreter computes fp32 dots exactly; ROCm's fp32 MFMA is exact too; NVIDIA uses TF32 tensor cores
    if _interpreting() or torch.version.hip is not None:
        return "ieee"
    return "tf32"


@triton.jit
def _to_bf16(v, INTERPRET: tl.constexpr):
    """fp32 -> bf16 rounded to nearest even; the interpreter's cast truncates, so there it is done on the bits
    first (finite values; the result is then exact in bf16)."""
    if INTERPRET:
        u = v.to(tl.uint32, bitcast=True)
        u = (u + (((u >> 16) & 1) + 0x7FFF)) & 0xFFFF0000
        v = u.to(tl.float32, bitcast=True)
    return v.to(tl.bfloat16)


@triton.jit
def _dot_split(x, fn, PRECISION: tl.constexpr):
    """x [M, K] fp32 holding bf16 values (exact in TF32) times fn [K, N] fp32 to ~fp32 accuracy."""
    hi = (fn.to(tl.uint32, bitcast=True) & 0xFFFFE000).to(tl.float32, bitcast=True)  # 10 mantissa bits
    lo = fn - hi  # exact; its own TF32 rounding errs by 2^-11 of a value 2^-10 below fn
    return tl.dot(x, hi, input_precision=PRECISION) + tl.dot(x, lo, input_precision=PRECISION)


@triton.jit
def _gemm_partials_kernel(x_ptr, fn_ptr, mix_ws, sq_ws, T, K, CHUNK,
                          ROWS: tl.constexpr, NPAD: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr,
                          PRECISION: tl.constexpr):
    """Partial (x @ fn^T, sum x^2) over columns [split * CHUNK, +CHUNK) of the flat [T, K = 4d] stream."""
    pid_t, pid_s = tl.program_id(0), tl.program_id(1)
    t = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
    tmask = t < T
    n = tl.arange(0, NPAD)
    nmask = n < ROWS
    t64 = t.to(tl.int64)
    acc = tl.zeros([BLOCK_T, NPAD], dtype=tl.float32)
    sq = tl.zeros([BLOCK_T], dtype=tl.float32)
    k_lo = pid_s * CHUNK
    k_hi = tl.minimum(k_lo + CHUNK, K)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        kmask = k < k_hi
        x = tl.load(x_ptr + t64[:, None] * K + k[None, :], mask=tmask[:, None] & kmask[None, :], other=0.0)
        x = x.to(tl.float32)
        w = tl.load(fn_ptr + n[None, :].to(tl.int64) * K + k[:, None], mask=nmask[None, :] & kmask[:, None],
                    other=0.0)
        acc += _dot_split(x, w, PRECISION)
        sq += tl.sum(x * x, axis=1)
    ws = (pid_s * T + t64)
    tl.store(mix_ws + ws[:, None] * NPAD + n[None, :], acc, mask=tmask[:, None])
    tl.store(sq_ws + ws, sq, mask=tmask)


@triton.jit
def _new_stream(x0, x1, x2, x3, f, comb_ptr, post_ptr, t64, tmask, K: tl.constexpr):
    """Target stream K of mhc_post for a [BLOCK_T, BLOCK_C] tile: post_K f + sum_j comb[j, K] x_j (fp32)."""
    c0 = tl.load(comb_ptr + t64 * 16 + 0 * 4 + K, mask=tmask, other=0.0)
    c1 = tl.load(comb_ptr + t64 * 16 + 1 * 4 + K, mask=tmask, other=0.0)
    c2 = tl.load(comb_ptr + t64 * 16 + 2 * 4 + K, mask=tmask, other=0.0)
    c3 = tl.load(comb_ptr + t64 * 16 + 3 * 4 + K, mask=tmask, other=0.0)
    p = tl.load(post_ptr + t64 * 4 + K, mask=tmask, other=0.0)
    mixed = c0[:, None] * x0 + c1[:, None] * x1 + c2[:, None] * x2 + c3[:, None] * x3
    return p[:, None] * f + mixed


@triton.jit
def _store_and_mix(out, xo_ptr, fn_ptr, off, c, m2, acc, sq, n, nmask, cmask, D, K: tl.constexpr,
                   PRECISION: tl.constexpr, INTERPRET: tl.constexpr):
    """Store stream K of x' (bf16) and accumulate its columns into the GEMM as stored (rounded)."""
    xb = _to_bf16(out, INTERPRET)
    tl.store(xo_ptr + off + K * D, xb, mask=m2)
    xr = xb.to(tl.float32)
    w = tl.load(fn_ptr + n[None, :].to(tl.int64) * (4 * D) + K * D + c[:, None], mask=nmask[None, :] & cmask[:, None],
                other=0.0)
    return acc + _dot_split(xr, w, PRECISION), sq + tl.sum(xr * xr, axis=1)


@triton.jit
def _post_gemm_partials_kernel(x_ptr, f_ptr, post_ptr, comb_ptr, xo_ptr, fn_ptr, mix_ws, sq_ws, T, D, CHUNK,
                               ROWS: tl.constexpr, NPAD: tl.constexpr, BLOCK_T: tl.constexpr,
                               BLOCK_C: tl.constexpr, PRECISION: tl.constexpr, INTERPRET: tl.constexpr):
    """mhc_post for columns [split * CHUNK, +CHUNK) of all 4 streams, stored, and the next pre's partials."""
    pid_t, pid_s = tl.program_id(0), tl.program_id(1)
    t = pid_t * BLOCK_T + tl.arange(0, BLOCK_T)
    tmask = t < T
    t64 = t.to(tl.int64)
    n = tl.arange(0, NPAD)
    nmask = n < ROWS
    acc = tl.zeros([BLOCK_T, NPAD], dtype=tl.float32)
    sq = tl.zeros([BLOCK_T], dtype=tl.float32)
    c_lo = pid_s * CHUNK
    c_hi = tl.minimum(c_lo + CHUNK, D)
    for c0 in range(c_lo, c_hi, BLOCK_C):
        c = c0 + tl.arange(0, BLOCK_C)
        cmask = c < c_hi
        m2 = tmask[:, None] & cmask[None, :]
        off = t64[:, None] * (4 * D) + c[None, :]
        x0 = tl.load(x_ptr + off, mask=m2, other=0.0).to(tl.float32)
        x1 = tl.load(x_ptr + off + D, mask=m2, other=0.0).to(tl.float32)
        x2 = tl.load(x_ptr + off + 2 * D, mask=m2, other=0.0).to(tl.float32)
        x3 = tl.load(x_ptr + off + 3 * D, mask=m2, other=0.0).to(tl.float32)
        f = tl.load(f_ptr + t64[:, None] * D + c[None, :], mask=m2, other=0.0).to(tl.float32)
        out = _new_stream(x0, x1, x2, x3, f, comb_ptr, post_ptr, t64, tmask, 0)
        acc, sq = _store_and_mix(out, xo_ptr, fn_ptr, off, c, m2, acc, sq, n, nmask, cmask, D, 0, PRECISION,
                                 INTERPRET)
        out = _new_stream(x0, x1, x2, x3, f, comb_ptr, post_ptr, t64, tmask, 1)
        acc, sq = _store_and_mix(out, xo_ptr, fn_ptr, off, c, m2, acc, sq, n, nmask, cmask, D, 1, PRECISION,
                                 INTERPRET)
        out = _new_stream(x0, x1, x2, x3, f, comb_ptr, post_ptr, t64, tmask, 2)
        acc, sq = _store_and_mix(out, xo_ptr, fn_ptr, off, c, m2, acc, sq, n, nmask, cmask, D, 2, PRECISION,
                                 INTERPRET)
        out = _new_stream(x0, x1, x2, x3, f, comb_ptr, post_ptr, t64, tmask, 3)
        acc, sq = _store_and_mix(out, xo_ptr, fn_ptr, off, c, m2, acc, sq, n, nmask, cmask, D, 3, PRECISION,
                                 INTERPRET)
    ws = (pid_s * T + t64)
    tl.store(mix_ws + ws[:, None] * NPAD + n[None, :], acc, mask=tmask[:, None])
    tl.store(sq_ws + ws, sq, mask=tmask)


@triton.jit
def _comb_tile(mix_ws, row, smask, r, s2, base_ptr, hc_eps, iters):
    """comb of one token as a [4, 4] tile: the 16 logits' partials summed over the splits in one reduction, the row
    softmax, then Sinkhorn (columns first, as DeepSeek's reference) with each normalisation one small reduction.
    Faster than 16 scalars, one reduction over the splits each, for every implementation at every T timed on the
    H200 (DeepGEMM mhc_pre at T = 8 / 64 / 512: 13.5 -> 11.6, 14.9 -> 14.4, 24.9 -> 16.8 us; sweep-mhc-apply.json,
    "comb_tile")."""
    i4 = tl.arange(0, 4)
    e = i4[:, None] * 4 + i4[None, :]  # row-major [j, k]
    m = tl.sum(tl.load(mix_ws + row[:, None, None] + 8 + e[None, :, :], mask=smask[:, None, None], other=0.0),
               axis=0)
    logit = m * r * s2 + tl.load(base_ptr + 8 + e)
    ex = tl.exp(logit - tl.max(logit, axis=1)[:, None])
    c = ex * (1.0 / tl.sum(ex, axis=1))[:, None] + hc_eps
    c = c * (1.0 / (tl.sum(c, axis=0) + hc_eps))[None, :]
    for _ in range(iters - 1):
        c = c * (1.0 / (tl.sum(c, axis=1) + hc_eps))[:, None]
        c = c * (1.0 / (tl.sum(c, axis=0) + hc_eps))[None, :]
    return c


@triton.jit
def _apply_kernel(x_ptr, mix_ws, sq_ws, base_ptr, scale_ptr, y_ptr, post_ptr, comb_ptr, T, D, S, rms_eps, hc_eps,
                  iters, NPAD: tl.constexpr, S_BLOCK: tl.constexpr, BLOCK_D: tl.constexpr, HEAD: tl.constexpr,
                  COMB_APART: tl.constexpr, INTERPRET: tl.constexpr):
    """One token, one block of d: gates from the reduced partials, y = sum_i pre_i x_i; post and the Sinkhorn
    of comb once per token: by d block 0 before its y, or (COMB_APART) by a program of its own after the d
    blocks, so that no y waits for the Sinkhorn's dependent chain."""
    t = tl.program_id(0).to(tl.int64)
    pid_d = tl.program_id(1)
    s = tl.arange(0, S_BLOCK)
    smask = s < S
    i4 = tl.arange(0, 4)
    row = (s.to(tl.int64) * T + t) * NPAD  # [S_BLOCK] workspace rows of this token
    sq = tl.sum(tl.load(sq_ws + s.to(tl.int64) * T + t, mask=smask, other=0.0), axis=0)
    r = 1.0 / tl.sqrt(sq / (4 * D) + rms_eps)
    m_pre = tl.sum(tl.load(mix_ws + row[:, None] + i4[None, :], mask=smask[:, None], other=0.0), axis=0) * r
    pre = tl.sigmoid(m_pre * tl.load(scale_ptr) + tl.load(base_ptr + i4)) + hc_eps
    if COMB_APART:
        comb_here = pid_d == tl.num_programs(1) - 1
    else:
        comb_here = pid_d == 0
    if not HEAD:
        if comb_here:
            m_post = tl.sum(tl.load(mix_ws + row[:, None] + 4 + i4[None, :], mask=smask[:, None], other=0.0),
                            axis=0) * r
            post = 2.0 * tl.sigmoid(m_post * tl.load(scale_ptr + 1) + tl.load(base_ptr + 4 + i4))
            tl.store(post_ptr + t * 4 + i4, post)
            c = _comb_tile(mix_ws, row, smask, r, tl.load(scale_ptr + 2), base_ptr, hc_eps, iters)
            tl.store(comb_ptr + t * 16 + i4[:, None] * 4 + i4[None, :], c)
    if not (COMB_APART and comb_here):  # COMB_APART only where post and comb are written (not HEAD)
        d = pid_d * BLOCK_D + tl.arange(0, BLOCK_D)
        dmask = d < D
        x = tl.load(x_ptr + t * 4 * D + i4[:, None] * D + d[None, :], mask=dmask[None, :], other=0.0)
        y = tl.sum(pre[:, None] * x.to(tl.float32), axis=0)
        tl.store(y_ptr + t * D + d, _to_bf16(y, INTERPRET), mask=dmask)


@triton.jit
def _post_kernel(f_ptr, x_ptr, post_ptr, comb_ptr, out_ptr, D, BLOCK_D: tl.constexpr, INTERPRET: tl.constexpr):
    """X'[k] = post_k f + sum_j comb[j, k] X[j] for one token and one block of d."""
    t = tl.program_id(0).to(tl.int64)
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    dmask = d < D
    i4 = tl.arange(0, 4)
    comb = tl.load(comb_ptr + t * 16 + i4[:, None] * 4 + i4[None, :])  # [j, k]
    post = tl.load(post_ptr + t * 4 + i4)
    off = t * 4 * D + i4[:, None] * D + d[None, :]
    x = tl.load(x_ptr + off, mask=dmask[None, :], other=0.0).to(tl.float32)  # [j, d]
    f = tl.load(f_ptr + t * D + d, mask=dmask, other=0.0).to(tl.float32)
    mixed = tl.sum(comb[:, :, None] * x[:, None, :], axis=0)  # [k, d]
    out = post[:, None] * f[None, :] + mixed
    tl.store(out_ptr + off, _to_bf16(out, INTERPRET), mask=dmask[None, :])


# ---------------------------------------------------------------- launch parameters (by shape only)

def _block_t(t: int) -> int:
    # small token blocks keep the partial workspace small (splits x T x 32 fp32); large T re-reads fn per block
    return 16 if t <= 128 else 64


def _block_d(t: int) -> int:
    return 256 if t <= 16 else 512 if t <= 256 else 1024


def _splits(t_blocks: int, width: int, block: int, device: torch.device) -> tuple[int, int]:
    """(splits, columns per split) so that token blocks x splits is about two programs per SM."""
    target = 2 * sm_count(device)
    most = triton.cdiv(width, block)
    s = max(1, min(most, triton.cdiv(target, t_blocks)))
    chunk = triton.cdiv(triton.cdiv(width, s), block) * block
    return triton.cdiv(width, chunk), chunk


def _npad(rows: int) -> int:
    return 16 if rows <= 16 else 32


def _pre_partials(x: torch.Tensor, fn: torch.Tensor, npad: int, prec: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch 1 of the unfused gated ops: x contiguous [T >= 1, 4, d], fn contiguous [rows, 4d]."""
    t, _, d = x.shape
    bt = _block_t(t)
    t_blocks = triton.cdiv(t, bt)
    bk = 128 if bt == 16 else 64
    s, chunk = _splits(t_blocks, HC * d, bk, x.device)
    mix_ws = torch.empty(s, t, npad, dtype=torch.float32, device=x.device)
    sq_ws = torch.empty(s, t, dtype=torch.float32, device=x.device)
    _gemm_partials_kernel[(t_blocks, s)](x, fn, mix_ws, sq_ws, t, HC * d, chunk, ROWS=fn.shape[0], NPAD=npad,
                                         BLOCK_T=bt, BLOCK_K=bk, PRECISION=prec, num_warps=4)
    return mix_ws, sq_ws


def prenorm_partials(x: torch.Tensor, fn: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """mhc_pre's (and mhc_head's) first launch alone, the same launch they make: for benchmarks, not an op.
    x bf16 [T, 4, d], fn fp32 [rows, 4d] -> (mix fp32 [splits, T, npad >= rows], sum of squares fp32
    [splits, T]); summed over dim 0, mix[..., :rows] is x.flatten(1) @ fn^T and the other x.flatten(1)^2 summed
    per row."""
    t = x.shape[0]
    npad = _npad(fn.shape[0])
    if t == 0:
        return (torch.empty(1, 0, npad, dtype=torch.float32, device=x.device),
                torch.empty(1, 0, dtype=torch.float32, device=x.device))
    return _pre_partials(x.contiguous(), fn.contiguous(), npad, _precision())


def gated_outputs(x: torch.Tensor, head: bool, fused: bool) -> tuple[torch.Tensor, ...]:
    """(stream, y, post, comb) of a gated op on x [T, 4, d]: the new stream only when fused (post_pre; else x
    itself), post and comb only unless head (else y stands in for their never-written pointers)."""
    t, _, d = x.shape
    y = torch.empty(t, d, dtype=torch.bfloat16, device=x.device)
    if head:
        post = comb = y
    else:
        post = torch.empty(t, HC, dtype=torch.float32, device=x.device)
        comb = torch.empty(t, HC, HC, dtype=torch.float32, device=x.device)
    return torch.empty_like(x) if fused else x, y, post, comb


def _gated(x: torch.Tensor, fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor, rms_eps: float,
           hc_eps: float, iters: int, head: bool, fused: tuple[torch.Tensor, ...] | None
           ) -> tuple[torch.Tensor, ...]:
    t, _, d = x.shape
    dev = x.device
    rows = fn.shape[0]
    npad = _npad(rows)
    stream, y, post, comb = gated_outputs(x, head, fused is not None)
    if t == 0:
        return stream, y, post, comb
    fn, base, scale = fn.contiguous(), base.contiguous(), scale.contiguous()
    bt = _block_t(t)
    t_blocks = triton.cdiv(t, bt)
    prec = _precision()
    if fused is None:
        mix_ws, sq_ws = _pre_partials(x, fn, npad, prec)
    else:
        f, p, c = (v.contiguous() for v in fused)
        bc = 64 if bt == 16 else 32
        s, chunk = _splits(t_blocks, d, bc, dev)
        mix_ws = torch.empty(s, t, npad, dtype=torch.float32, device=dev)
        sq_ws = torch.empty(s, t, dtype=torch.float32, device=dev)
        _post_gemm_partials_kernel[(t_blocks, s)](x, f, p, c, stream, fn, mix_ws, sq_ws, t, d, chunk, ROWS=rows,
                                                  NPAD=npad, BLOCK_T=bt, BLOCK_C=bc, PRECISION=prec,
                                                  INTERPRET=_interpreting(), num_warps=4)
    _apply(stream, mix_ws, sq_ws, npad, base, scale, y, post, comb, rms_eps, hc_eps, iters, head)
    return stream, y, post, comb


def apply_config(t: int, d: int) -> dict[str, int]:
    """The apply launch's d block and warps. One warp a program: the Sinkhorn's 39 dependent normalisations of a
    [4, 4] tile are then shuffles inside a warp, not round trips through shared memory between four warps. H200,
    DeepGEMM's partials, d = 4096 (sweep-mhc-apply.json, "warps"): the launch 8.8 -> 4.6 us at
    T = 1, 8.5 -> 5.3 at T = 8, 11.4 -> 6.1 at T = 64, 9.7 -> 7.2 at T = 512 (outputs within one bf16 rounding of
    y: the sum over the four streams is ordered otherwise). The Sinkhorn is ~1.9 us of the launch (20 iterations
    against 1); its variants (sweep-mhc-apply.json, "sinkhorn_variants_not_kept": the approximate division, 16
    scalars with no reduction in the loop, both) are within +-0.5 us of the tile at every T and slower at T = 512.
    Post and the Sinkhorn in a program of their own after the d blocks (comb_apart), so that no y waits for the
    Sinkhorn's chain, up to COMB_APART_MAX_T tokens (sweep-mhc-apply.json, "post_pre_apart"; same outputs bit for
    bit): the launch 4.92 -> 4.77 us at T = 1, 5.25 -> 4.82 at T = 8, 5.79 -> 5.26 at T = 64, and 7.06 -> 7.32 at
    T = 512 (there every d block waits anyway)."""
    return {"block_d": min(256 if t <= 16 else 1024, triton.next_power_of_2(d)), "num_warps": 1,
            "comb_apart": t <= COMB_APART_MAX_T}


def _apply(x: torch.Tensor, mix_ws: torch.Tensor, sq_ws: torch.Tensor, npad: int, base: torch.Tensor,
           scale: torch.Tensor, y: torch.Tensor, post: torch.Tensor, comb: torch.Tensor, rms_eps: float,
           hc_eps: float, iters: int, head: bool, config: dict[str, int] | None = None) -> None:
    """The last launch of the gated ops: gates from the split-K partials (mix_ws [S, T, npad], sq_ws [S, T]),
    y = sum_i pre_i x_i, and post and comb unless `head`."""
    t, _, d = x.shape
    s = mix_ws.shape[0]
    cfg = {**apply_config(t, d), **(config or {})}
    bd = cfg["block_d"]
    apart = bool(cfg["comb_apart"]) and not head
    _apply_kernel[(t, triton.cdiv(d, bd) + apart)](x, mix_ws, sq_ws, base, scale, y, post, comb, t, d, s,
                                                   float(rms_eps), float(hc_eps), int(iters), NPAD=npad,
                                                   S_BLOCK=max(2, triton.next_power_of_2(s)), BLOCK_D=bd, HEAD=head,
                                                   COMB_APART=apart, INTERPRET=_interpreting(),
                                                   num_warps=cfg["num_warps"])


def mhc_pre_from_partials(x: torch.Tensor, mix_ws: torch.Tensor, sq_ws: torch.Tensor, base: torch.Tensor,
                          scale: torch.Tensor, rms_eps: float = 1e-6, hc_eps: float = 1e-6,
                          sinkhorn_iters: int = 20, config: dict[str, int] | None = None
                          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """mhc_pre's outputs from split-K partials made elsewhere (a vendor's pre-norm GEMM): mix_ws fp32 [S, T, rows]
    contiguous, summed over S x.flatten(1) @ fn^T (rows >= 24: pre, post, comb), and sq_ws fp32 [S, T], summed
    over S the sum of x.flatten(1)^2 per token. x bf16 [T, 4, d] contiguous. config: the apply launch's
    (apply_config; benchmarks sweep it)."""
    t, _, d = x.shape
    dev = x.device
    y = torch.empty(t, d, dtype=torch.bfloat16, device=dev)
    post = torch.empty(t, HC, dtype=torch.float32, device=dev)
    comb = torch.empty(t, HC, HC, dtype=torch.float32, device=dev)
    if t == 0:
        return y, post, comb
    _apply(x, mix_ws, sq_ws, mix_ws.shape[2], base.contiguous(), scale.contiguous(), y, post, comb, rms_eps,
           hc_eps, sinkhorn_iters, False, config)
    return y, post, comb


# ---------------------------------------------------------------- ops

def mhc_pre(x: torch.Tensor, fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor, rms_eps: float = 1e-6,
            hc_eps: float = 1e-6, sinkhorn_iters: int = 20) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(y bf16 [T, d], post fp32 [T, 4], comb fp32 [T, 4, 4]) (contract: ops.mhc)."""
    _, y, post, comb = _gated(x.contiguous(), fn, base, scale, rms_eps, hc_eps, sinkhorn_iters, False, None)
    return y, post, comb


def mhc_head(x: torch.Tensor, fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor, rms_eps: float = 1e-6,
             hc_eps: float = 1e-6) -> torch.Tensor:
    """bf16 [T, d] (contract: ops.mhc)."""
    return _gated(x.contiguous(), fn, base, scale, rms_eps, hc_eps, 1, True, None)[1]


def mhc_post_pre(f: torch.Tensor, x: torch.Tensor, post: torch.Tensor, comb: torch.Tensor, fn: torch.Tensor,
                 base: torch.Tensor, scale: torch.Tensor, rms_eps: float = 1e-6, hc_eps: float = 1e-6,
                 sinkhorn_iters: int = 20) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x' bf16 [T, 4, d], y bf16 [T, d], post' fp32 [T, 4], comb' fp32 [T, 4, 4]) (contract: ops.mhc)."""
    stream, y, post2, comb2 = _gated(x.contiguous(), fn, base, scale, rms_eps, hc_eps, sinkhorn_iters, False,
                                     (f, post, comb))
    return stream, y, post2, comb2


def mhc_post_then_pre(f: torch.Tensor, x: torch.Tensor, post: torch.Tensor, comb: torch.Tensor, fn: torch.Tensor,
                      base: torch.Tensor, scale: torch.Tensor, rms_eps: float = 1e-6, hc_eps: float = 1e-6,
                      sinkhorn_iters: int = 20) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """mhc_post_pre as the contract defines it: mhc_post, then mhc_pre of the bf16 stream it stored (3 launches).
    Faster than the fused kernel at every T the H200 measured (bench-mhc.json: 14.8 vs 16.6 us at T = 1, 20.2 vs
    22.0 at T = 64, 315.8 vs 478.9 at T = 4096), whose split-K programs each redo the post-mix of their columns."""
    stream = mhc_post(f, x, post, comb)
    y, post2, comb2 = mhc_pre(stream, fn, base, scale, rms_eps, hc_eps, sinkhorn_iters)
    return stream, y, post2, comb2


def mhc_post(f: torch.Tensor, x: torch.Tensor, post: torch.Tensor, comb: torch.Tensor) -> torch.Tensor:
    """bf16 [T, 4, d] (contract: ops.mhc)."""
    t, _, d = x.shape
    x = x.contiguous()
    out = torch.empty_like(x)
    if t == 0 or d == 0:
        return out
    bd = min(_block_d(t), triton.next_power_of_2(d))
    _post_kernel[(t, triton.cdiv(d, bd))](f.contiguous(), x, post.contiguous(), comb.contiguous(), out, d,
                                          BLOCK_D=bd, INTERPRET=_interpreting(), num_warps=4)
    return out
