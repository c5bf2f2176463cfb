"""fp8_linear and fp8_grouped_linear (dsv4hal.ops.linear) in Triton: one launch, or two with split-K.

One kernel serves both: fp8_linear is the grouped op with G = 1. The first grid axis runs over (group, column tile),
group-major, so a group's column tiles are adjacent programs reading the same rows of x. A program owns a
[BLOCK_M, BLOCK_N] output tile of one group and a run of K's 128-column blocks. For each block it loads x's
[BLOCK_M, 128] bf16 rows and quantizes them in registers with the MoE's 1x128 quantizer (moe_quant._group_codes,
EXACT: IEEE divisions, so codes and scales are the reference's), loads the weight's [BLOCK_N, 128] FP8 bytes, dots
the two and adds dot * sx * sw to an fp32 accumulator. BLOCK_N is 128, the weight's block: a tile's weight scale is
one value a k-block, applied after the dot as DeepGEMM does.

Decode (T <= 64) is bound by the weight's bytes, read once: BLOCK_M covers every token (16, 32 or 64 rows). When the
G * N/128 column tiles leave SMs idle (wkv: N = 512 is 4 tiles; wo_a: 8 groups of 8) K is split: S splits write fp32
partials to a workspace [S, T, G, N] and a second launch sums them in split order and casts to bf16
(deterministic). The launch is a function of the shape and the device's SM count only (config): no host sync, no
data-dependent size, CUDA-graph safe.
Prefill (T > 64) tiles 64 rows; every column tile quantizes its rows of x again (N/128 times in all), a cost of
the one launch that grows with N (on Hopper DeepGEMM's binding, ranked above, quantizes once).

Dot operands: e4m3fn on NVIDIA GPUs as the FP8 type itself (Triton's FP8 dot: wgmma e4m3 on sm_90 from 64 rows,
fp16 MMAs below); e4m3fnuz, ROCm and the interpreter decode the codes with the integer codec (fp8_codec) to exact
values, fp16 on a GPU, fp32 under the interpreter (whose bf16/fp16 dot is unreliable), the format's NaN code as
NaN. Accumulation is fp32 either way."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from dsv4hal.kernels.triton.device import sm_count
from dsv4hal.kernels.triton.fp8_codec import _decode_fp8, hardware_fp8
from dsv4hal.kernels.triton.moe_activation import _to_bf16
from dsv4hal.kernels.triton.moe_quant import _group_codes

BLOCK = 128  # K's quantization group and the weight's block: the k-step and BLOCK_N
DECODE_MAX_TOKENS = 64  # up to this many tokens one row tile holds them all (the weight is read once)
PREFILL_BLOCK_M = 64
SPLIT_ROWS = 2048  # split-K only while splits * T <= this: the workspace stays within 8 KiB a column of the output
STAGES = 3
_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


@dataclass(frozen=True)
class Config:
    block_m: int
    splits: int  # K split this many ways (1: no workspace, one launch)
    blocks_per_split: int  # 128-column blocks of K a split sums
    warps: int = 4


def config(t: int, n: int, k: int, sms: int, groups: int = 1) -> Config:
    """The launch for x [t, (groups,) k] and a weight [(groups,) n, k] on a device of `sms` SMs: BLOCK_M holds every
    token up to 64 (a power of two, at least 16, the dot's smallest M), else 64; K is split only while the tiles
    (every group's) are fewer than the SMs, into at most one split a k-block and SPLIT_ROWS / t splits, enough for
    two programs an SM."""
    block_m = max(16, triton.next_power_of_2(t)) if t <= DECODE_MAX_TOKENS else PREFILL_BLOCK_M
    kb = k // BLOCK
    tiles = groups * triton.cdiv(n, BLOCK) * triton.cdiv(max(t, 1), block_m)
    splits = 1
    if tiles < sms:
        splits = max(1, min(triton.cdiv(2 * sms, tiles), kb, SPLIT_ROWS // max(t, 1)))
    per = triton.cdiv(kb, splits)
    return Config(block_m, triton.cdiv(kb, per), per)


@triton.jit
def _operand(raw, NATIVE: tl.constexpr, FNUZ: tl.constexpr, DOT: tl.constexpr):
    """uint8 FP8 codes -> a dot operand: the FP8 type (NATIVE: e4m3fn on NVIDIA), else the codes' exact values in
    DOT from the integer codec, the NaN code (e4m3fn 0x7F/0xFF, e4m3fnuz 0x80) as NaN."""
    if NATIVE:  # one return: the compiler refuses returns of different types even in untaken constexpr branches
        v = raw.to(tl.float8e4nv, bitcast=True)
    else:
        if FNUZ:
            nan = raw == 0x80
        else:
            nan = (raw & 0x7F) == 0x7F
        v = tl.where(nan, float("nan"), _decode_fp8(raw, FNUZ)).to(DOT)
    return v


@triton.jit(do_not_specialize=["T"])
def _fp8_linear_kernel(x_ptr, stride_xt, stride_xg, w_ptr, stride_wg, stride_wn, s_ptr, stride_sg, stride_sn,
                       stride_sk, out_ptr, T, G, N, KB, blocks_per_split, BLOCK_M: tl.constexpr,
                       BLOCK_N: tl.constexpr, FNUZ: tl.constexpr, HW_FP8: tl.constexpr, NATIVE: tl.constexpr,
                       DOT: tl.constexpr, SPLIT: tl.constexpr, STAGES: tl.constexpr):
    n_tiles = tl.cdiv(N, BLOCK_N)
    g = tl.program_id(0) // n_tiles
    pid_n = tl.program_id(0) % n_tiles
    pid_m = tl.program_id(1)
    split = tl.program_id(2)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    k = tl.arange(0, BLOCK_N)  # BLOCK_N == 128: one k-block a step
    in_rows = rows < T
    in_cols = cols < N
    x_rows = x_ptr + g.to(tl.int64) * stride_xg + rows.to(tl.int64)[:, None] * stride_xt + k[None, :]
    w_rows = w_ptr + g.to(tl.int64) * stride_wg + cols.to(tl.int64)[:, None] * stride_wn + k[None, :]
    s_row = s_ptr + g * stride_sg + pid_n * stride_sn  # the tile is one 128-row block of the group's weight
    first = split * blocks_per_split
    last = tl.minimum(first + blocks_per_split, KB)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for b in tl.range(first, last, num_stages=STAGES):
        xv = tl.load(x_rows + b * BLOCK_N, mask=in_rows[:, None], other=0.0).to(tl.float32)
        codes, sx = _group_codes(xv, False, HW_FP8, FNUZ, True)
        wb = tl.load(w_rows + b * BLOCK_N, mask=in_cols[:, None], other=0)
        sw = tl.load(s_row + b * stride_sk)
        part = tl.dot(_operand(codes, NATIVE, FNUZ, DOT), tl.trans(_operand(wb, NATIVE, FNUZ, DOT)))
        acc += part * (sx * sw)[:, None]
    offs = (rows.to(tl.int64)[:, None] * G + g) * N + cols[None, :]  # out [T, G, N]
    mask = in_rows[:, None] & in_cols[None, :]
    if SPLIT:  # fp32 partials [S, T, G, N], summed by _sum_splits_kernel
        tl.store(out_ptr + split.to(tl.int64) * T * G * N + offs, acc, mask=mask)
    else:
        tl.store(out_ptr + offs, _to_bf16(acc), mask=mask)


@triton.jit
def _sum_splits_kernel(ws_ptr, out_ptr, numel, S, BLOCK: tl.constexpr):
    """out[i] = bf16(sum over s of ws[s, i]), s in order (deterministic)."""
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = i < numel
    acc = tl.zeros([BLOCK], tl.float32)
    for s in range(S):
        acc += tl.load(ws_ptr + s * numel + i, mask=mask, other=0.0)
    tl.store(out_ptr + i, _to_bf16(acc), mask=mask)


def launch(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor, cfg: Config) -> torch.Tensor:
    """fp8_linear (x [T, K], weight [N, K]) or fp8_grouped_linear (x [T, G, K], weight [G, N, K]) with the launch
    `cfg` (config's, or another for tests)."""
    grouped = x.dim() == 3
    if not grouped:  # one group
        x, weight, weight_scale = x.unsqueeze(1), weight.unsqueeze(0), weight_scale.unsqueeze(0)
    t, g, k = x.shape
    n = weight.shape[1]
    dev = x.device
    out = torch.empty(t, g, n, dtype=torch.bfloat16, device=dev)
    if t:
        fnuz = weight.dtype == torch.float8_e4m3fnuz
        native = not (_INTERPRET or fnuz or torch.version.hip is not None)
        split = cfg.splits > 1
        dst = torch.empty(cfg.splits, t, g, n, dtype=torch.float32, device=dev) if split else out
        grid = (g * triton.cdiv(n, BLOCK), triton.cdiv(t, cfg.block_m), cfg.splits)
        _fp8_linear_kernel[grid](
            x, x.stride(0), x.stride(1), weight.view(torch.uint8), weight.stride(0), weight.stride(1), weight_scale,
            weight_scale.stride(0), weight_scale.stride(1), weight_scale.stride(2), dst, t, g, n, k // BLOCK,
            cfg.blocks_per_split, BLOCK_M=cfg.block_m, BLOCK_N=BLOCK, FNUZ=fnuz, HW_FP8=hardware_fp8(dev),
            NATIVE=native, DOT=tl.float32 if _INTERPRET else tl.float16, SPLIT=split, STAGES=STAGES,
            num_warps=cfg.warps)
        if split:
            numel = t * g * n
            _sum_splits_kernel[(triton.cdiv(numel, 1024),)](dst, out, numel, cfg.splits, BLOCK=1024, num_warps=4)
    return out if grouped else out.view(t, n)


def fp8_linear(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor) -> torch.Tensor:
    """bf16 [T, N] per dsv4hal.ops.linear."""
    return launch(x, weight, weight_scale, config(x.shape[0], weight.shape[0], x.shape[1], sm_count(x.device)))


def fp8_grouped_linear(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor) -> torch.Tensor:
    """bf16 [T, G, N] per dsv4hal.ops.linear."""
    t, g, k = x.shape
    return launch(x, weight, weight_scale, config(t, weight.shape[1], k, sm_count(x.device), groups=g))
