"""A measurement, not a kernel dsv4hal binds: how close a plain Triton MXFP4 GEMV gets to copy bandwidth for
few-token routed experts on the H200, beside Marlin (the best MXFP4 path at T <= 8, whose two GEMM launches take
45.0 of its 53.0 us at T = 1; profile-moe-decode.json). Issue 16's decode goals (>= 0.50 of copy at T = 1, 0.75 at
T = 8) need a GEMM faster than Marlin's; this says whether the obvious Triton design is one.

Design: no route alignment. Launch 1, grid (T*k routes, I / BN): route r = (token t, slot j) multiplies token t by
expert ids[t, j]'s gate and up rows [BN, H] (MXFP4 bytes decoded in registers: e2m1 from bit arithmetic, the UE8M0
scale applied per 32-group after the partial dot) and stores silu(g) * u as bf16 h [T*k, I]. Launch 2, grid (T,
H / BN): token t sums its k routes' w_tj * (W2[e] rows [BN, I] . h[route]) in one program and stores y bf16: no
atomics, no combine. Routes sharing an expert read its rows once each (at T = 8, 48 routes over ~40 experts).
Checked against Marlin's output (relative RMS; not clamped: timing only). Each launch's settings are swept alone.

    python3 bench/proto_mxfp4_gemv.py --json out/proto-mxfp4-gemv.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import triton
import triton.language as tl

from dsv4hal.kernels.triton.fused_moe import _e2m1, _ue8m0


@triton.jit
def _mx_dot(w_rows, s_rows, xe, xo, kb0, stride_w, stride_s, n, BN: tl.constexpr, BKB: tl.constexpr):
    """sum over BKB bytes (2*BKB values) of rows n: [BN] fp32, the scale of each 16-byte group applied to its
    partial sum."""
    kb = kb0 + tl.arange(0, BKB)
    b = tl.load(w_rows + n[:, None] * stride_w + kb[None, :]).to(tl.int32)
    prod = _e2m1(b & 15) * xe[None, :] + _e2m1(b >> 4) * xo[None, :]
    part = tl.sum(tl.reshape(prod, [BN, BKB // 16, 16]), axis=2)
    g = kb0 // 16 + tl.arange(0, BKB // 16)
    s = _ue8m0(tl.load(s_rows + n[:, None] * stride_s + g[None, :]).to(tl.int32))
    return tl.sum(part * s, axis=1)


@triton.jit
def _gate_up_kernel(x_ptr, ids_ptr, w_ptr, s_ptr, h_ptr, H, I, top_k, stride_we, stride_se,
                    BN: tl.constexpr, BKB: tl.constexpr):
    r = tl.program_id(0)
    n = tl.program_id(1) * BN + tl.arange(0, BN)
    e = tl.load(ids_ptr + r)
    if e >= 0:
        t = r // top_k
        w = w_ptr + e.to(tl.int64) * stride_we
        s = s_ptr + e.to(tl.int64) * stride_se
        acc_g = tl.zeros([BN], dtype=tl.float32)
        acc_u = tl.zeros([BN], dtype=tl.float32)
        for kb0 in range(0, H // 2, BKB):
            xv = tl.load(x_ptr + t * H + 2 * kb0 + tl.arange(0, 2 * BKB)).to(tl.float32)
            xe, xo = tl.split(tl.reshape(xv, [BKB, 2]))
            acc_g += _mx_dot(w, s, xe, xo, kb0, H // 2, H // 32, n, BN, BKB)
            acc_u += _mx_dot(w, s, xe, xo, kb0, H // 2, H // 32, n + I, BN, BKB)
        h = acc_g / (1.0 + tl.exp(-acc_g)) * acc_u
        tl.store(h_ptr + r.to(tl.int64) * I + n, h.to(tl.bfloat16))


@triton.jit
def _down_kernel(h_ptr, ids_ptr, tw_ptr, w_ptr, s_ptr, y_ptr, H, I, top_k, stride_we, stride_se,
                 BN: tl.constexpr, BKB: tl.constexpr):
    t = tl.program_id(0)
    n = tl.program_id(1) * BN + tl.arange(0, BN)
    acc = tl.zeros([BN], dtype=tl.float32)
    for j in range(0, top_k):
        r = t * top_k + j
        e = tl.load(ids_ptr + r)
        if e >= 0:
            w = w_ptr + e.to(tl.int64) * stride_we
            s = s_ptr + e.to(tl.int64) * stride_se
            part = tl.zeros([BN], dtype=tl.float32)
            for kb0 in range(0, I // 2, BKB):
                hv = tl.load(h_ptr + r.to(tl.int64) * I + 2 * kb0 + tl.arange(0, 2 * BKB)).to(tl.float32)
                he, ho = tl.split(tl.reshape(hv, [BKB, 2]))
                part += _mx_dot(w, s, he, ho, kb0, I // 2, I // 32, n, BN, BKB)
            acc += tl.load(tw_ptr + r) * part
    tl.store(y_ptr + t.to(tl.int64) * H + n, acc.to(tl.bfloat16))


def gate_up(x: torch.Tensor, ids: torch.Tensor, w13: torch.Tensor, s13: torch.Tensor, hbuf: torch.Tensor,
            cfg: dict) -> None:
    t, h = x.shape
    k, i = ids.shape[1], hbuf.shape[1]
    _gate_up_kernel[(t * k, i // cfg["bn"])](x, ids, w13, s13, hbuf, h, i, k, w13.stride(0), s13.stride(0),
                                             BN=cfg["bn"], BKB=cfg["bkb"], num_warps=cfg["w"])


def down(hbuf: torch.Tensor, ids: torch.Tensor, tw: torch.Tensor, w2: torch.Tensor, s2: torch.Tensor,
         y: torch.Tensor, cfg: dict) -> None:
    t, h = y.shape
    k, i = ids.shape[1], hbuf.shape[1]
    _down_kernel[(t, h // cfg["bn"])](hbuf, ids, tw, w2, s2, y, h, i, k, w2.stride(0), s2.stride(0),
                                      BN=cfg["bn"], BKB=cfg["bkb"], num_warps=cfg["w"])


def moe_gemv(x: torch.Tensor, ids: torch.Tensor, tw: torch.Tensor, w13: torch.Tensor, s13: torch.Tensor,
             w2: torch.Tensor, s2: torch.Tensor, cfg1: dict, cfg2: dict) -> torch.Tensor:
    i = w2.shape[2] * 2
    hbuf = torch.empty(ids.numel(), i, dtype=torch.bfloat16, device=x.device)
    y = torch.empty_like(x)
    gate_up(x, ids, w13, s13, hbuf, cfg1)
    down(hbuf, ids, tw, w2, s2, y, cfg2)
    return y


# launch settings of each launch, timed alone: rows a program (BN), bytes a step (BKB), warps
GATE_UP = [dict(bn=bn, bkb=bkb, w=w) for bn in (8, 16, 32) for bkb in (128, 256) for w in (2, 4)]
DOWN = [dict(bn=bn, bkb=bkb, w=w) for bn in (4, 8, 16) for bkb in (128, 256) for w in (2, 4)]


def _name(cfg: dict) -> str:
    return "bn{bn}-bkb{bkb}-w{w}".format(**cfg)


def main() -> None:
    import dsv4hal
    from dsv4hal.bench.common import bound_op
    from dsv4hal.bench.timing import copy_bandwidth, graph_us
    from dsv4hal.conformance.cases_moe import _expert_weights, _experts_params

    ap = argparse.ArgumentParser()
    ap.add_argument("--json", required=True)
    args = ap.parse_args()
    platform = dsv4hal.select_platform()
    gen = torch.Generator(device="cuda").manual_seed(0)
    p = _experts_params("flash", 1, "mxfp4")
    weights = _expert_weights(p, torch.device("cuda"), gen)
    w13, s13, w2, s2 = (getattr(weights, f).contiguous().view(torch.uint8)
                        for f in ("w13", "w13_scale", "w2", "w2_scale"))
    marlin = bound_op(platform, "moe_experts", "marlin_mxfp4_sm90")
    prepared = marlin.prepare_weights(weights)
    copy_bw = copy_bandwidth()
    out: dict = {"device": torch.cuda.get_device_name(), "copy_bytes_per_s": copy_bw, "rows": []}
    per_expert = (w13[0].numel() + s13[0].numel() + w2[0].numel() + s2[0].numel())
    for t in (1, 2, 4, 8):
        x = torch.randn(t, p["H"], device="cuda", generator=gen).to(torch.bfloat16)
        ids = torch.rand(t, p["E"], device="cuda", generator=gen).argsort(1)[:, :p["top_k"]].to(torch.int32)
        ids = ids.contiguous()
        tw = torch.rand(t, p["top_k"], device="cuda", generator=gen) + 0.5
        active = int(ids.unique().numel())
        floor_bytes = active * per_expert
        want = marlin(x, ids, tw, prepared).float()
        row: dict = {"T": t, "active_experts": active, "weight_bytes": floor_bytes,
                     "us": {"marlin": graph_us(lambda a=(x, ids, tw, prepared): marlin(*a))}, "gate_up_us": {},
                     "down_us": {}}
        hbuf = torch.empty(ids.numel(), p["I"], dtype=torch.bfloat16, device="cuda")
        y = torch.empty_like(x)
        for cfg in GATE_UP:
            row["gate_up_us"][_name(cfg)] = graph_us(lambda c=cfg, a=(x, ids, w13, s13, hbuf): gate_up(*a, c))
        for cfg in DOWN:
            row["down_us"][_name(cfg)] = graph_us(lambda c=cfg, a=(hbuf, ids, tw, w2, s2, y): down(*a, c))
        c1 = GATE_UP[min(range(len(GATE_UP)), key=lambda j: row["gate_up_us"][_name(GATE_UP[j])])]
        c2 = DOWN[min(range(len(DOWN)), key=lambda j: row["down_us"][_name(DOWN[j])])]
        got = moe_gemv(x, ids, tw, w13, s13, w2, s2, c1, c2).float()
        # no SwiGLU clamp here: the relative RMS difference from Marlin's clamped output (the clamp rarely acts)
        row["rel_rms_vs_marlin"] = float((got - want).pow(2).mean().sqrt() / want.pow(2).mean().sqrt())
        row["best"] = {"gate_up": c1, "down": c2}
        row["us"]["gemv (best of each launch)"] = graph_us(
            lambda a=(x, ids, tw, w13, s13, w2, s2, c1, c2): moe_gemv(*a))
        row["x_copy_bw"] = {k: floor_bytes / (v * 1e-6) / copy_bw for k, v in row["us"].items()}
        out["rows"].append(row)
        g = row["us"]["gemv (best of each launch)"]
        print(f"T={t}: marlin {row['us']['marlin']:.1f} us ({row['x_copy_bw']['marlin']:.2f} of copy); gemv {g:.1f} "
              f"us ({row['x_copy_bw']['gemv (best of each launch)']:.2f}), launches {_name(c1)} "
              f"{row['gate_up_us'][_name(c1)]:.1f} + {_name(c2)} {row['down_us'][_name(c2)]:.1f} us; rel. RMS vs "
              f"Marlin {row['rel_rms_vs_marlin']:.4f}", flush=True)
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
