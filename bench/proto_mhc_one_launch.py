"""A measured and rejected design, kept to reproduce its numbers: mHC's gated ops (mhc_pre, mhc_head,
mhc_post_pre) at decode sizes in ONE launch, with grid-wide barriers between the phases, instead of the library's
two launches (dsv4hal.kernels.triton.mhc: split-K partials, then the gates and the weighted sum).

Program p of G (at most one per SM, so that all are resident) owns columns [p * DB, p * DB + DB) of each of the 4
streams, all tokens:
  phase 1: (post_pre: the new stream x' of its columns, stored) partial mixes and sums of squares, to ws [G, T, NPAD];
  barrier;
  phase 2: tokens p, p + G, ...: the G partials reduced, the gates; pre to lg_ws for phase 3, post and comb out (the
           Sinkhorn on 16 scalars that every thread computes: no reduction between warps);
  barrier;
  phase 3: y of its columns for every token, the stream read back from L2.
The barrier (grid_sync): the last program to arrive resets the arrival count, then bumps a generation the others
poll; two int32 words per launch, one pair per stream for eager calls and one per captured call, from a zeroed
buffer per device. Without words the phases run as three launches of the same kernel (bit-identical outputs).

H200 (bench/results/h200/bench-mhc-one-launch.json, profile-mhc-phases.json; the tenth session): correct (equal to
its three-launch form bit for bit at every shape, on two streams at once, within the reference's tolerance), and
SLOWER than the two-launch paths at every decode shape: mhc_pre at T = 64, d 4096: 13.2 us against 11.7 (Triton,
two launches) and 9.4 (DeepGEMM's GEMM + the Triton apply). A grid barrier alone costs 1.6-1.7 us (both polling
schemes, 32 or 128 programs): no less than the kernel boundary it replaces, so one launch saves nothing, and the
phases, each shaped for the barrier, are slower than the kernels they replace.

    python3 bench/bench_mhc_one_launch.py --json out/bench-mhc-one-launch.json
    python3 bench/profile_mhc_phases.py --json out/profile-mhc-phases.json
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import torch
import triton
import triton.language as tl

from dsv4hal.kernels.triton.mhc import (
    _dot_split,
    _interpreting,
    _new_stream,
    _npad,
    _precision,
    _store_and_mix,
    _to_bf16,
    gated_outputs,
    sm_count,
)

SLOTS = 1 << 15  # word pairs a device hands out: one per stream, one per captured call
SPIN_LIMIT = tl.constexpr(1 << 22)  # polls before a program gives up waiting (it then writes NaN)


@triton.jit
def grid_sync(words, nprog):
    """Wait until all nprog programs of the launch arrive here; 1 if this program gave up waiting, else 0."""
    tl.debug_barrier()  # every thread's stores are issued before the arrival, which releases them at GPU scope
    gen = tl.atomic_add(words + 1, 0, sem="acquire", scope="gpu")
    arrived = tl.atomic_add(words, 1, sem="acq_rel", scope="gpu")
    stalled = 0
    if arrived == nprog - 1:
        tl.atomic_xchg(words, 0, sem="relaxed", scope="gpu")
        tl.atomic_add(words + 1, 1, sem="release", scope="gpu")
    else:
        polls = 0
        while (tl.atomic_add(words + 1, 0, sem="acquire", scope="gpu") == gen) & (polls < SPIN_LIMIT):
            polls += 1
        stalled = (polls >= SPIN_LIMIT).to(tl.int32)
    tl.debug_barrier()
    return stalled


@dataclass
class _DeviceWords:
    words: torch.Tensor  # int32 [SLOTS, 2], at rest between launches
    used: int = 0
    by_stream: dict[int, int] = field(default_factory=dict)


_devices: dict[int, _DeviceWords] = {}
_lock = threading.Lock()


def barrier_words(device: torch.device) -> torch.Tensor | None:
    """int32 [2] barrier words for one launch on `device` from the current stream, or None (see the module doc:
    then launch the phases one by one)."""
    if device.type != "cuda":
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    capturing = torch.cuda.is_current_stream_capturing()
    with _lock:
        state = _devices.get(index)
        if state is None:
            if capturing:
                return None
            state = _devices[index] = _DeviceWords(torch.zeros(SLOTS, 2, dtype=torch.int32, device=device))
        slot = None if capturing else state.by_stream.get(torch.cuda.current_stream(device).cuda_stream)
        if slot is None:
            if state.used >= SLOTS:
                return None
            slot, state.used = state.used, state.used + 1
            if not capturing:
                state.by_stream[torch.cuda.current_stream(device).cuda_stream] = slot
        return state.words[slot]


@triton.jit
def _norm4(a, b, c, d, eps):
    s = 1.0 / (a + b + c + d + eps)
    return a * s, b * s, c * s, d * s


@triton.jit
def _softmax4(a, b, c, d, eps):
    m = tl.maximum(tl.maximum(a, b), tl.maximum(c, d))
    a, b, c, d = tl.exp(a - m), tl.exp(b - m), tl.exp(c - m), tl.exp(d - m)
    s = 1.0 / (a + b + c + d)
    return a * s + eps, b * s + eps, c * s + eps, d * s + eps


@triton.jit
def _sinkhorn_scalars(lg_ptr, comb_ptr, eps, iters, bad):
    """comb of one token from its 16 logits lg_ptr[0:16] (row-major [j, k]) as 16 scalars: row softmax, then
    Sinkhorn, columns first (as _comb_tile and DeepSeek's reference); NaN where `bad`."""
    c00, c01, c02, c03 = _softmax4(tl.load(lg_ptr + 0), tl.load(lg_ptr + 1), tl.load(lg_ptr + 2),
                                   tl.load(lg_ptr + 3), eps)
    c10, c11, c12, c13 = _softmax4(tl.load(lg_ptr + 4), tl.load(lg_ptr + 5), tl.load(lg_ptr + 6),
                                   tl.load(lg_ptr + 7), eps)
    c20, c21, c22, c23 = _softmax4(tl.load(lg_ptr + 8), tl.load(lg_ptr + 9), tl.load(lg_ptr + 10),
                                   tl.load(lg_ptr + 11), eps)
    c30, c31, c32, c33 = _softmax4(tl.load(lg_ptr + 12), tl.load(lg_ptr + 13), tl.load(lg_ptr + 14),
                                   tl.load(lg_ptr + 15), eps)
    c00, c10, c20, c30 = _norm4(c00, c10, c20, c30, eps)
    c01, c11, c21, c31 = _norm4(c01, c11, c21, c31, eps)
    c02, c12, c22, c32 = _norm4(c02, c12, c22, c32, eps)
    c03, c13, c23, c33 = _norm4(c03, c13, c23, c33, eps)
    for _ in range(iters - 1):
        c00, c01, c02, c03 = _norm4(c00, c01, c02, c03, eps)
        c10, c11, c12, c13 = _norm4(c10, c11, c12, c13, eps)
        c20, c21, c22, c23 = _norm4(c20, c21, c22, c23, eps)
        c30, c31, c32, c33 = _norm4(c30, c31, c32, c33, eps)
        c00, c10, c20, c30 = _norm4(c00, c10, c20, c30, eps)
        c01, c11, c21, c31 = _norm4(c01, c11, c21, c31, eps)
        c02, c12, c22, c32 = _norm4(c02, c12, c22, c32, eps)
        c03, c13, c23, c33 = _norm4(c03, c13, c23, c33, eps)
    nan = float("nan")
    tl.store(comb_ptr + 0, tl.where(bad, nan, c00))
    tl.store(comb_ptr + 1, tl.where(bad, nan, c01))
    tl.store(comb_ptr + 2, tl.where(bad, nan, c02))
    tl.store(comb_ptr + 3, tl.where(bad, nan, c03))
    tl.store(comb_ptr + 4, tl.where(bad, nan, c10))
    tl.store(comb_ptr + 5, tl.where(bad, nan, c11))
    tl.store(comb_ptr + 6, tl.where(bad, nan, c12))
    tl.store(comb_ptr + 7, tl.where(bad, nan, c13))
    tl.store(comb_ptr + 8, tl.where(bad, nan, c20))
    tl.store(comb_ptr + 9, tl.where(bad, nan, c21))
    tl.store(comb_ptr + 10, tl.where(bad, nan, c22))
    tl.store(comb_ptr + 11, tl.where(bad, nan, c23))
    tl.store(comb_ptr + 12, tl.where(bad, nan, c30))
    tl.store(comb_ptr + 13, tl.where(bad, nan, c31))
    tl.store(comb_ptr + 14, tl.where(bad, nan, c32))
    tl.store(comb_ptr + 15, tl.where(bad, nan, c33))


@triton.jit
def _token_tile(t0, T, c, cmask, D, BLOCK_T: tl.constexpr):
    """Tokens [t0, t0 + BLOCK_T) x the program's columns c: (t64, tmask, the 2-D mask, offsets in stream 0)."""
    t = t0 + tl.arange(0, BLOCK_T)
    tmask = t < T
    t64 = t.to(tl.int64)
    return t64, tmask, tmask[:, None] & cmask[None, :], t64[:, None] * (4 * D) + c[None, :]


@triton.jit
def _one_launch_kernel(x_ptr, f_ptr, post_in, comb_in, xo_ptr, fn_ptr, base_ptr, scale_ptr, y_ptr, post_ptr,
                       comb_ptr, ws, sq_ws, lg_ws, bar_ptr, T, D, G, rms_eps, hc_eps, iters,
                       ROWS: tl.constexpr, NPAD: tl.constexpr, G_BLOCK: tl.constexpr, BLOCK_T: tl.constexpr,
                       DB: tl.constexpr, PHASE: tl.constexpr, POST: tl.constexpr, HEAD: tl.constexpr,
                       PRECISION: tl.constexpr, INTERPRET: tl.constexpr):
    """mhc_pre (HEAD: mhc_head; POST: mhc_post_pre) in one launch of G programs; PHASE 0 runs the three phases with
    barriers between them, PHASE 1-3 one phase (the interpreter). lg_ws fp32 [T, NPAD]: the token's gate logits
    (columns 0-3 become its pre gates after phase 2)."""
    p = tl.program_id(0)
    n = tl.arange(0, NPAD)
    nmask = n < ROWS
    c = p * DB + tl.arange(0, DB)
    cmask = c < D
    bad = 0
    if (PHASE == 0) | (PHASE == 1):
        for t0 in range(0, T, BLOCK_T):
            t64, tmask, m2, off = _token_tile(t0, T, c, cmask, D, BLOCK_T)
            acc = tl.zeros([BLOCK_T, NPAD], dtype=tl.float32)
            sq = tl.zeros([BLOCK_T], dtype=tl.float32)
            if POST:  # x' = post * f + comb^T x for these columns of the 4 streams, stored, then mixed as stored
                x0 = tl.load(x_ptr + off, mask=m2, other=0.0).to(tl.float32)
                x1 = tl.load(x_ptr + off + D, mask=m2, other=0.0).to(tl.float32)
                x2 = tl.load(x_ptr + off + 2 * D, mask=m2, other=0.0).to(tl.float32)
                x3 = tl.load(x_ptr + off + 3 * D, mask=m2, other=0.0).to(tl.float32)
                f = tl.load(f_ptr + t64[:, None] * D + c[None, :], mask=m2, other=0.0).to(tl.float32)
                for k in tl.static_range(4):
                    out = _new_stream(x0, x1, x2, x3, f, comb_in, post_in, t64, tmask, k)
                    acc, sq = _store_and_mix(out, xo_ptr, fn_ptr, off, c, m2, acc, sq, n, nmask, cmask, D, k,
                                             PRECISION, INTERPRET)
            else:
                for k in tl.static_range(4):
                    xk = tl.load(x_ptr + off + k * D, mask=m2, other=0.0).to(tl.float32)
                    w = tl.load(fn_ptr + n[None, :].to(tl.int64) * (4 * D) + k * D + c[:, None],
                                mask=nmask[None, :] & cmask[:, None], other=0.0)
                    acc += _dot_split(xk, w, PRECISION)
                    sq += tl.sum(xk * xk, axis=1)
            row = p * T + t64
            tl.store(ws + row[:, None] * NPAD + n[None, :], acc, mask=tmask[:, None])
            tl.store(sq_ws + row, sq, mask=tmask)
    if PHASE == 0:
        bad = grid_sync(bar_ptr, G)
    if (PHASE == 0) | (PHASE == 2):
        g = tl.arange(0, G_BLOCK)
        gmask = g < G
        s_row = tl.where(n < 4, 0, tl.where(n < 8, 1, 2))
        scl = tl.load(scale_ptr + s_row, mask=nmask, other=0.0)
        bse = tl.load(base_ptr + n, mask=nmask, other=0.0)
        for tt in range(p, T, G):
            rows = g.to(tl.int64) * T + tt
            mix = tl.sum(tl.load(ws + rows[:, None] * NPAD + n[None, :], mask=gmask[:, None], other=0.0,
                                 cache_modifier=".cg"), axis=0)
            sq = tl.sum(tl.load(sq_ws + rows, mask=gmask, other=0.0, cache_modifier=".cg"), axis=0)
            r = 1.0 / tl.sqrt(sq / (4 * D) + rms_eps)
            logit = mix * r * scl + bse
            gate = tl.where(n < 4, tl.sigmoid(logit) + hc_eps, 2.0 * tl.sigmoid(logit))
            lg = lg_ws + tt * NPAD
            # pre gates (0-3) for phase 3, post (4-7) as is, the comb logits (8-23) for the Sinkhorn below
            tl.store(lg + n, tl.where(n < 8, gate, logit), mask=nmask)
            if not HEAD:
                tl.store(post_ptr + tt * 4 + n - 4, tl.where(bad != 0, float("nan"), gate),
                         mask=(n >= 4) & (n < 8))
                tl.debug_barrier()  # the logits just stored, read back as scalars by every thread
                _sinkhorn_scalars(lg + 8, comb_ptr + tt * 16, hc_eps, iters, bad != 0)
    if PHASE == 0:
        bad = bad | grid_sync(bar_ptr, G)
    if (PHASE == 0) | (PHASE == 3):
        src = xo_ptr if POST else x_ptr
        for t0 in range(0, T, BLOCK_T):
            t64, tmask, m2, off = _token_tile(t0, T, c, cmask, D, BLOCK_T)
            y = tl.zeros([BLOCK_T, DB], dtype=tl.float32)
            for k in tl.static_range(4):
                pre = tl.load(lg_ws + t64 * NPAD + k, mask=tmask, other=0.0, cache_modifier=".cg")
                y += pre[:, None] * tl.load(src + off + k * D, mask=m2, other=0.0).to(tl.float32)
            y = tl.where(bad != 0, float("nan"), y)
            tl.store(y_ptr + t64[:, None] * D + c[None, :], _to_bf16(y, INTERPRET), mask=m2)


def one_launch_config(t: int, d: int, device: torch.device) -> dict[str, int]:
    """Columns a program owns per stream (DB), programs (at most one per SM: the barrier needs them all resident)
    and the token block (DB x BLOCK_T <= 2048: four fp32 stream tiles in registers)."""
    sms = sm_count(device)
    db = 16  # tl.dot's least K
    while triton.cdiv(d, db) > sms:
        db *= 2
    return {"db": db, "programs": triton.cdiv(d, db), "block_t": max(16, min(triton.next_power_of_2(t), 2048 // db))}


def _one_launch(x: torch.Tensor, fn: torch.Tensor, base: torch.Tensor, scale: torch.Tensor, rms_eps: float,
                hc_eps: float, iters: int, head: bool, fused: tuple[torch.Tensor, ...] | None,
                split_phases: bool = False) -> tuple[torch.Tensor, ...]:
    """The gated ops through _one_launch_kernel: x contiguous [T >= 1, 4, d]. split_phases: three launches even
    where barrier words are available (benchmarks compare the two)."""
    t, _, d = x.shape
    dev = x.device
    rows = fn.shape[0]
    npad = _npad(rows)
    stream, y, post, comb = gated_outputs(x, head, fused is not None)
    f, p_in, c_in = (v.contiguous() for v in fused) if fused is not None else (x, x, x)
    cfg = one_launch_config(t, d, dev)
    g = cfg["programs"]
    ws = torch.empty(g, t, npad, dtype=torch.float32, device=dev)
    sq_ws = torch.empty(g, t, dtype=torch.float32, device=dev)
    lg_ws = torch.empty(t, npad, dtype=torch.float32, device=dev)
    words = None if split_phases or _interpreting() else barrier_words(dev)
    for phase in (0,) if words is not None else (1, 2, 3):
        _one_launch_kernel[(g,)](x, f, p_in, c_in, stream, fn.contiguous(), base.contiguous(), scale.contiguous(),
                                 y, post, comb, ws, sq_ws, lg_ws, words if words is not None else sq_ws, t, d, g,
                                 float(rms_eps), float(hc_eps), int(iters), ROWS=rows, NPAD=npad,
                                 G_BLOCK=max(2, triton.next_power_of_2(g)), BLOCK_T=cfg["block_t"], DB=cfg["db"],
                                 PHASE=phase, POST=fused is not None, HEAD=head, PRECISION=_precision(),
                                 INTERPRET=_interpreting(), num_warps=4)
    return stream, y, post, comb

