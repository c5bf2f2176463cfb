"""Portable Triton compressor (spec 4.1): the prefill form `compress` and the decode form `compress_decode`.

One program per compressed row. It reads the window's kv and score halves once (HBM), adds the positional
bias, pools with a per-channel online softmax over chunks of window rows, then RMSNorm, RoPE on the last 64
dims at the group's first position and, for the indexer (hd 128), the Walsh-Hadamard transform, and writes
the row once. The Hadamard transform uses H_128 = H_8 (x) H_16 on the row viewed as [8, 16] (3K FMAs instead
of 16K).

Decode: program b copies its kv_score row into its ring (state[slot, pos % ring], in place, as the contract
says); when its token closes a group it pools the window, taking the newest row from kv_score and the older ones
from the ring (the same values as reading back the ring row it writes), else it writes a zero row. Fixed grid,
fixed-size output, no host sync: CUDA-graph safe. Rows that share a slot share a ring: as with the reference's
scatter on a GPU, which of their writes lands is unspecified. Unchecked indices stay inside the buffers: a slot
outside [0, S) skips its row (no ring read or write, a zero row out), a position outside [0, max_pos) is clamped
into the RoPE table (its ring row and whether it closes a group follow the clamped position).

Prefill: the output has M = sum_b L_b // ratio rows, a count that lives on the device: reading it is the one host
sync, unless the caller passes num_groups (M known on the host): then there is none and the call is graph-safe.
A program past the true M (a num_groups too large, in unchecked mode) writes a zero row and reads nothing. A group
position past the RoPE table (unchecked cu_seqlens on a GPU) reads the table's last row."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dsv4hal.errors import InvalidArgumentError
from dsv4hal.ops.compress import num_groups_of

ROPE_PAIRS = 32
HADAMARD_DIM = 128
# globals a kernel reads must be constexpr (compiled Triton refuses other globals; the interpreter does not)
_ROPE_PAIRS = tl.constexpr(ROPE_PAIRS)
_NEG_INF = tl.constexpr(float("-inf"))


@triton.jit
def _sylvester(N: tl.constexpr, LOG: tl.constexpr):
    """[N, N] +-1 Sylvester Hadamard matrix: (-1)^popcount(i & j)."""
    v = tl.arange(0, N)[:, None] & tl.arange(0, N)[None, :]
    parity = tl.zeros([N, N], dtype=tl.int32)
    for bit in tl.static_range(LOG):
        parity = parity ^ ((v >> bit) & 1)
    return 1.0 - 2.0 * parity.to(tl.float32)


@triton.jit
def hadamard128(y):
    """Orthonormal Walsh-Hadamard of a [128] vector: index i = 16a + b, so H_128[i, k] = H_8[a, c] * H_16[b, d].
    Its sums run in another order than the reference's butterfly (compared within the compressor's tolerance);
    the decode and prefill forms give the same bits with it. A butterfly here made the H200's compiler contract
    RoPE's products into the first stage's adds differently in the two forms (decode != prefill bit for bit):
    indexer_q_prep, which needs the reference's bits, keeps its own butterfly and compiles without contraction."""
    x = tl.reshape(y, [8, 16])
    z = tl.sum(x[:, :, None] * _sylvester(16, 4)[None, :, :], axis=1)  # z[a, d] = sum_b x[a, b] H16[b, d]
    o = tl.sum(_sylvester(8, 3)[:, :, None] * z[:, None, :], axis=0)  # o[c, d] = sum_a H8[a, c] z[a, d]
    return tl.reshape(o, [128]) * 0.08838834764831845  # 128 ** -0.5


@triton.jit
def table_row(pos, max_pos):
    """pos clamped into a RoPE table of max_pos >= 1 rows (rope_table): an unchecked position never reads outside."""
    return tl.minimum(tl.maximum(pos, 0), max_pos - 1)


def rope_table(cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The tables a kernel reads: unit column stride, and one identity row (cos 1, sin 0) for an empty table, so that
    a clamped position always has a row to read (no call with rows passes checked mode with an empty table)."""
    if cos.shape[0] == 0:
        return (torch.ones(1, cos.shape[1], dtype=cos.dtype, device=cos.device),
                torch.zeros(1, sin.shape[1], dtype=sin.dtype, device=sin.device))
    return _unit_cols(cos), _unit_cols(sin)


@triton.jit
def rope_last64(y, cos_row_ptr, sin_row_ptr, HD: tl.constexpr):
    """y [HD] fp32 with RoPE on its last 64 dims (32 interleaved (re, im) pairs, as reference.rope.apply_rope);
    cos/sin_row_ptr point at the position's 32 table values."""
    re, im = tl.split(tl.reshape(y, [HD // 2, 2]))
    k = tl.arange(0, HD // 2) - (HD // 2 - _ROPE_PAIRS)  # rope pair index; negative: NoPE
    rope = k >= 0
    cs = tl.load(cos_row_ptr + k, mask=rope, other=1.0)
    sn = tl.load(sin_row_ptr + k, mask=rope, other=0.0)
    return tl.reshape(tl.join(re * cs - im * sn, re * sn + im * cs), [HD])


@triton.jit
def _compress_kernel(ks_ptr, stride_ks, ring_ptr, ring_len, n_slots, cu_ptr, n_req, slots_ptr, pos_ptr, ape_ptr,
                     w_ptr, cos_ptr, sin_ptr, stride_rope, max_pos, out_ptr, eps,
                     RATIO: tl.constexpr, WINDOW: tl.constexpr, HD: tl.constexpr, COFF: tl.constexpr,
                     DECODE: tl.constexpr, HADAMARD: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_B: tl.constexpr,
                     STAGES: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    width: tl.constexpr = 2 * COFF * HD
    d = tl.arange(0, HD)
    if DECODE:
        slot = tl.load(slots_ptr + pid).to(tl.int64)
        live = (slot >= 0) & (slot < n_slots)  # a slot outside the state: the row is skipped, its ring untouched
        pos = table_row(tl.load(pos_ptr + pid).to(tl.int64), max_pos)
        row_ptr = ks_ptr + pid * stride_ks
        ring_base = ring_ptr + tl.where(live, slot, 0) * ring_len * width
        # the new token's row, stored into its ring at the end: its ring row is outside the window's older rows
        # (ring >= window), so the window's loads need not wait behind this store
        wcols = tl.arange(0, width)
        new_row = tl.load(row_ptr + wcols)
        closes = live & ((pos + 1) % RATIO == 0)
        first = pos + 1 - RATIO
        out_row = pid
        row0 = pid * 0  # unused by the decode loads
    else:
        # request b of group m: the number of requests whose groups all end at or before m (ends: the inclusive
        # cumsum of each request's group count, from cu_seqlens here: no planning launch), and the groups before b
        m = pid.to(tl.int32)
        req = tl.zeros([BLOCK_B], dtype=tl.int32)
        below = tl.zeros([BLOCK_B], dtype=tl.int32)
        carry = m * 0
        for s0 in range(0, n_req, BLOCK_B):
            j = s0 + tl.arange(0, BLOCK_B)
            jm = j < n_req
            groups = tl.where(jm, (tl.load(cu_ptr + j + 1, mask=jm, other=0) - tl.load(cu_ptr + j, mask=jm, other=0))
                              // RATIO, 0)
            ends = tl.where(jm, carry + tl.cumsum(groups, axis=0), 2147483647)
            done = ends <= m
            req += done.to(tl.int32)
            below += tl.where(done, groups, 0)
            carry += tl.sum(groups, axis=0)
        b = tl.sum(req, axis=0)
        before = tl.sum(below, axis=0)
        first = ((m - before) * RATIO).to(tl.int64)
        row0 = tl.load(cu_ptr + b, mask=b < n_req, other=0).to(tl.int64)
        closes = b < n_req  # past the last request's groups (num_groups > M): a zero row
        out_row = pid
        row_ptr = ks_ptr
        ring_base = ring_ptr
        pos = first
    if closes:
        m_i = tl.full([HD], _NEG_INF, tl.float32)
        l_i = tl.zeros([HD], dtype=tl.float32)
        acc = tl.zeros([HD], dtype=tl.float32)
        for r0 in tl.range(0, WINDOW, BLOCK_R, num_stages=STAGES):  # C128: the next chunk loads meanwhile
            r = r0 + tl.arange(0, BLOCK_R)
            p = first + (RATIO - WINDOW) + r  # the window row's position in its request
            valid = p >= 0  # C4's first group has no previous group
            cur = r >= WINDOW - RATIO  # C4: rows 4..7 read the cur halves, rows 0..3 the ov halves
            kv_col = tl.where(cur, (COFF - 1) * HD, 0)
            sc_col = COFF * HD + kv_col
            if DECODE:  # older rows from the ring; the newest joins after the loop, from kv_score
                valid = valid & (r < WINDOW - 1)
                ring_rows = ring_base + (tl.where(valid, p, 0) % ring_len)[:, None] * width
                kv = tl.load(ring_rows + kv_col[:, None] + d[None, :], mask=valid[:, None], other=0.0)
                sc = tl.load(ring_rows + sc_col[:, None] + d[None, :], mask=valid[:, None], other=0.0)
            else:
                rows = ks_ptr + (row0 + tl.where(valid, p, 0))[:, None] * stride_ks
                kv = tl.load(rows + kv_col[:, None] + d[None, :], mask=valid[:, None], other=0.0)
                sc = tl.load(rows + sc_col[:, None] + d[None, :], mask=valid[:, None], other=0.0)
            ape = tl.load(ape_ptr + (r % RATIO)[:, None] * (COFF * HD) + kv_col[:, None] + d[None, :])
            sc = tl.where(valid[:, None], sc + ape, _NEG_INF)
            m_new = tl.maximum(m_i, tl.max(sc, axis=0))
            m_safe = tl.where(m_new == _NEG_INF, 0.0, m_new)  # a chunk of -inf scores adds nothing, never NaN
            alpha = tl.exp(m_i - m_safe)
            pexp = tl.exp(sc - m_safe[None, :])
            l_i = l_i * alpha + tl.sum(pexp, axis=0)
            acc = acc * alpha + tl.sum(pexp * kv, axis=0)
            m_i = m_new
        if DECODE:  # window row WINDOW - 1: this token, a cur half with the last ape row
            last = (COFF - 1) * HD
            kv_n = tl.load(row_ptr + last + d)
            sc_n = tl.load(row_ptr + COFF * HD + last + d) + tl.load(ape_ptr + (RATIO - 1) * (COFF * HD) + last + d)
            m_new = tl.maximum(m_i, sc_n)
            m_safe = tl.where(m_new == _NEG_INF, 0.0, m_new)
            alpha = tl.exp(m_i - m_safe)
            pexp = tl.exp(sc_n - m_safe)
            l_i = l_i * alpha + pexp
            acc = acc * alpha + pexp * kv_n
        c = acc / l_i
        y = c * tl.rsqrt(tl.sum(c * c, axis=0) / HD + eps) * tl.load(w_ptr + d)
        rope_row = table_row(first, max_pos)
        y = rope_last64(y, cos_ptr + rope_row * stride_rope, sin_ptr + rope_row * stride_rope, HD)
        if HADAMARD:
            y = hadamard128(y)
        tl.store(out_ptr + out_row * HD + d, y)
    else:
        tl.store(out_ptr + out_row * HD + d, tl.zeros([HD], dtype=tl.float32))
    if DECODE:
        # a mask compared per column (the interpreter refuses a scalar bool and-ed into a block mask)
        tl.store(ring_base + (pos % ring_len) * width + wcols, new_row, mask=wcols < tl.where(live, width, 0))


def _config(ratio: int, hd: int, decode: bool) -> tuple[int, int, int, int]:
    """(window rows, rows per chunk, warps, pipeline stages): C4 pools its 8 rows in one chunk; C128 streams
    its 128 rows in chunks, loading the next while it pools the current one. Prefill: the fastest of a sweep over
    32K tokens on the H200 (profile-compress.txt: C4 hd 128 one warp 22.9 us against 39.1 for two; C4 hd 512
    two warps 71.2 against 75.0 for four; C128 hd 512 chunks of 8 rows, four warps, three stages 35.1 against 41.6);
    decode keeps the settings it was measured with (bench-compress.json)."""
    if ratio == 4:
        if not decode:
            return 8, 8, (1 if hd == 128 else 2), 1
        return 8, 8, (2 if hd == 128 else 4), 1
    if not decode and hd == 512:
        return ratio, 8, 4, 3
    return ratio, (16 if hd == 512 else 32), (4 if hd == 128 else 8), 2


def _unit_cols(t: torch.Tensor) -> torch.Tensor:
    """Kernels take row strides; a column stride other than 1 is copied (a fixed-size copy: graph-safe)."""
    return t if t.stride(-1) == 1 else t.contiguous()


def _launch(grid: int, kv_score: torch.Tensor, ring: torch.Tensor, cu: torch.Tensor,
            slots: torch.Tensor, positions: torch.Tensor, ape: torch.Tensor, norm_weight: torch.Tensor,
            cos: torch.Tensor, sin: torch.Tensor, out: torch.Tensor, ratio: int, eps: float, hadamard: bool,
            decode: bool, config: tuple[int, int, int, int] | None = None) -> None:
    hd = norm_weight.shape[0]
    if hadamard and hd != HADAMARD_DIM:  # the contract refuses it too; the kernel's transform is 128 wide
        raise InvalidArgumentError("compress_decode" if decode else "compress", "hadamard", f"False for hd {hd}",
                                   "True", remedy="only the indexer compressor (hd 128) rotates")
    window, block_r, warps, stages = config or _config(ratio, hd, decode)
    if cos.stride() != sin.stride():  # the kernel indexes both tables with one row stride
        cos, sin = cos.contiguous(), sin.contiguous()
    cos, sin = rope_table(cos, sin)
    coff = 2 if ratio == 4 else 1
    _compress_kernel[(grid,)](
        kv_score, kv_score.stride(0), ring, ring.shape[1] if decode else 1, ring.shape[0] if decode else 1, cu,
        cu.shape[0] - 1, slots, positions, ape.contiguous(), norm_weight.contiguous(), cos, sin, cos.stride(0),
        cos.shape[0], out, float(eps),
        RATIO=ratio, WINDOW=window, HD=hd, COFF=coff, DECODE=decode, HADAMARD=bool(hadamard), BLOCK_R=block_r,
        BLOCK_B=256, STAGES=stages, num_warps=warps)


def compress_into(out: torch.Tensor, kv_score: torch.Tensor, cu_seqlens: torch.Tensor, ape: torch.Tensor,
                  norm_weight: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, ratio: int, eps: float = 1e-6,
                  hadamard: bool = False, config: tuple[int, int, int, int] | None = None) -> None:
    """The prefill kernel into out [M, hd] (M rows: one launch, no sync, graph-safe). config: (window rows, rows
    per chunk, warps, stages) instead of _config's (bench sweeps)."""
    if out.shape[0]:
        kv_score = _unit_cols(kv_score)
        cu = cu_seqlens.contiguous()
        _launch(out.shape[0], kv_score, kv_score, cu, cu, cu, ape, norm_weight, cos, sin, out, ratio, eps, hadamard,
                decode=False, config=config)


def compress(kv_score: torch.Tensor, cu_seqlens: torch.Tensor, ape: torch.Tensor, norm_weight: torch.Tensor,
             cos: torch.Tensor, sin: torch.Tensor, ratio: int, eps: float = 1e-6, hadamard: bool = False,
             num_groups: int | None = None) -> torch.Tensor:
    """fp32 [M, hd], M = sum_b L_b // ratio, or num_groups rows when given (contract: dsv4hal.ops.compress)."""
    total = num_groups_of(cu_seqlens, ratio) if num_groups is None else num_groups
    out = torch.empty(total, norm_weight.shape[0], dtype=torch.float32, device=kv_score.device)
    compress_into(out, kv_score, cu_seqlens, ape, norm_weight, cos, sin, ratio, eps, hadamard)
    return out


def compress_decode(kv_score: torch.Tensor, state: torch.Tensor, slots: torch.Tensor, positions: torch.Tensor,
                    ape: torch.Tensor, norm_weight: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, ratio: int,
                    eps: float = 1e-6, hadamard: bool = False) -> torch.Tensor:
    """fp32 [B, hd]; writes each row into its ring in place (contract: dsv4hal.ops.compress, decode form)."""
    b, hd = kv_score.shape[0], norm_weight.shape[0]
    out = torch.empty(b, hd, dtype=torch.float32, device=kv_score.device)
    if b == 0:
        return out
    if not state.is_contiguous():  # the contract refuses it too: the ring is updated in place
        raise InvalidArgumentError("compress_decode", "state", "a contiguous tensor", "a strided view",
                                   remedy="keep the rings in one contiguous buffer (new_state)")
    slots, positions = slots.contiguous(), positions.contiguous()
    _launch(b, _unit_cols(kv_score), state, slots, slots, positions, ape, norm_weight, cos, sin, out, ratio,
            eps, hadamard, decode=True)
    return out
