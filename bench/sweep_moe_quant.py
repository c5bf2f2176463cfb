"""Launch sweep of the FP8 MoE activation quantizers (dsv4hal.kernels.triton.moe_quant) at the FP8 prefill shape
where DeepGEMM's grouped MoE misses its 600 TFLOP/s goal (H200, V4-Flash: T = 4096, H 4096, I 2048, E 256, top-6;
`dsv4hal bench moe`): the gather pass (x's rows to GEMM1's FP8 input) and the SwiGLU pass (GEMM1's output to
GEMM2's), each timed alone in CUDA graphs over (BLOCK_R, BLOCK_G) tiles, warps and pipeline stages. Every setting's
codes and scales are compared byte for byte with the default launch's. The moved bytes (rows of valid routes read
and written, scales) over the time give each setting's share of copy bandwidth.

--grid second: a finer grid around the first's best (small BLOCK_R, more groups). --call: the whole FP8 psum call
(deepgemm_fp8_psum_sm90) and each of its launches alone, in graphs (what a call costs beyond its kernels), and
the call with other expected_m_for_psum_layout values (the rows an expert is expected to get, which picks
DeepGEMM's GEMM config; dsv4hal passes ceil(T*k/E)), every output compared with the default's.

--real-swiglu: the SwiGLU pass on GEMM1's real output against randn rows, over tiles and warps, and the whole call
with DeepGEMM's programmatic dependent launch off and on.

--fast-swiglu: the SwiGLU pass with torch's exact roundings against the approximate exp and division (codes compared),
the gather pass as per token + copy against the scatter from the tokens' side, and the whole FP8 psum call before and
after each change, rounds alternating. --scatter-grid: the scatter over tiles and warps.

--per-token: the gather pass in one launch (each route's row quantized) against two (each token quantized once,
then copied to its routes' rows; moe_quant.PER_TOKEN_MIN_TOKENS picks between them) at every --tokens, alone and,
with --call, inside the whole FP8 psum call, rounds alternating; bytes and outputs compared.

    python3 bench/sweep_moe_quant.py --json out.json [--tokens 4096] [--grid second] [--call] [--per-token]"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path

import torch

from dsv4hal.bench.timing import copy_bandwidth, graph_us
from dsv4hal.kernels.moe_align import align_routes
from dsv4hal.kernels.triton import moe_quant
from dsv4hal.kernels.triton.moe_quant import DENSE_STAGES, GROUP, quantize_routed_rows, row_tile

HIDDEN, INTER, EXPERTS, TOP_K, ALIGN = 4096, 2048, 256, 6, 128
GRIDS = {"first": (((16, 1), (16, 2), (8, 2), (8, 4), (4, 4), (32, 1)), (4, 8), (1, 2, 3)),
         "second": (((4, 4), (2, 8), (4, 8), (2, 4), (1, 16), (8, 4), (1, 8)), (2, 4), (1, 3)),
         "pair": (((16, 1), (4, 4)), (4,), (1, 3))}  # the former default and the current one
EXPECTED_M = (96, 128, 192, 256, 512, 1024, 4096)


def settings(grid: str) -> list[dict]:
    tiles, warps, stages = GRIDS[grid]
    return [{"tile": t, "warps": w, "stages": s} for t, w, s in itertools.product(tiles, warps, stages)]


def fp8_call(t: int, gen: torch.Generator) -> tuple:
    """(the bound moe_experts op with deepgemm_fp8_psum_sm90 forced, its prepared V4-Flash FP8 weights, and
    fp8_inputs): the FP8 psum call at T tokens the sweeps below time."""
    import dsv4hal
    from dsv4hal.bench.common import bound_op
    from dsv4hal.conformance.cases_moe import _expert_weights, _experts_params

    op = bound_op(dsv4hal.select_platform(), "moe_experts", "deepgemm_fp8_psum_sm90")
    prepared = op.prepare_weights(_expert_weights(_experts_params("flash", t, "fp8_block"), torch.device("cuda"),
                                                  gen))
    return (op, prepared, *fp8_inputs(t, gen))


def fp8_inputs(t: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x bf16 [T, H], distinct top-6 expert ids per token, routing weights in [0.5, 1.5)."""
    x = torch.randn(t, HIDDEN, generator=gen, device="cuda").to(torch.bfloat16)
    ids = torch.rand(t, EXPERTS, generator=gen, device="cuda").argsort(1)[:, :TOP_K].to(torch.int32)
    tw = torch.rand(t, TOP_K, generator=gen, device="cuda") + 0.5
    return x, ids, tw


def fp8_gemm_operands(prepared: object, x: torch.Tensor, ids: torch.Tensor) -> dict:
    """The psum call's steps up to its GEMMs on inputs x, ids: routes, DeepGEMM's psum keywords (kw), GEMM1's
    operands a1 = (codes, scales) and its real output d1 (DeepGEMM's plain psum GEMM), GEMM2's operands a2, an
    output buffer d2, the rows holding routes (valid), the FLOPs of the kept routes (flop) and the weights (w)."""
    import deep_gemm

    from dsv4hal.kernels.grouped_fp8_moe import psum_expected_m

    w = prepared.payload  # type: ignore[attr-defined]  # DeepGemmWeights
    t = x.shape[0]
    n = t * TOP_K
    routes = align_routes(ids, EXPERTS, w.alignment)
    a1, s1 = quantize_routed_rows(x, routes.sorted_routes, n, TOP_K, HIDDEN, gather=True,
                                  block_expert=routes.block_expert)
    m = routes.sorted_routes.numel()
    d1 = torch.empty(m, 2 * INTER, dtype=torch.bfloat16, device="cuda")
    kw = {"use_psum_layout": True, "expected_m_for_psum_layout": psum_expected_m(n, EXPERTS)}
    a1 = (a1.view(torch.float8_e4m3fn), s1)
    deep_gemm.m_grouped_fp8_gemm_nt_contiguous(a1, (w.w13, w.w13_scale), d1, routes.expert_end, **kw)
    a2, s2 = quantize_routed_rows(d1, routes.sorted_routes, n, TOP_K, INTER, gather=False, swiglu_limit=10.0)
    return {"w": w, "routes": routes, "kw": kw, "a1": a1, "d1": d1, "a2": (a2.view(torch.float8_e4m3fn), s2),
            "d2": torch.empty(m, HIDDEN, dtype=torch.bfloat16, device="cuda"), "valid": routes.sorted_routes < n,
            "flop": 2 * int((ids >= 0).sum()) * 3 * HIDDEN * INTER}


def call_rows(t: int, gen: torch.Generator) -> list[dict]:
    """The FP8 psum call at T tokens: whole, its launches alone, and with other expected_m values. The launches are
    grouped_fp8_moe's steps called one by one (that function runs them in one go), so each can be timed alone."""
    import deep_gemm

    from dsv4hal.kernels.grouped_fp8_moe import grouped_fp8_moe
    from dsv4hal.kernels.triton.moe_combine import combine_routes

    op, prepared, x, ids, tw = fp8_call(t, gen)
    n = t * TOP_K
    rows: list[dict] = [{"T": t, "part": "call", "us": graph_us(lambda: op(x, ids, tw, prepared), inner=5, reps=15)}]
    want = op(x, ids, tw, prepared)
    g = fp8_gemm_operands(prepared, x, ids)
    w, routes, kw, d1, d2, m = g["w"], g["routes"], g["kw"], g["d1"], g["d2"], g["routes"].sorted_routes.numel()
    em = kw["expected_m_for_psum_layout"]
    gemm = deep_gemm.m_grouped_fp8_gemm_nt_contiguous
    parts = {
        "align": lambda: align_routes(ids, EXPERTS, w.alignment),
        "quant_gather": lambda: quantize_routed_rows(x, routes.sorted_routes, n, TOP_K, HIDDEN, gather=True,
                                                     block_expert=routes.block_expert),
        "gemm1": lambda: gemm(g["a1"], (w.w13, w.w13_scale), d1, routes.expert_end, **kw),
        "quant_swiglu": lambda: quantize_routed_rows(d1, routes.sorted_routes, n, TOP_K, INTER, gather=False,
                                                     swiglu_limit=10.0),
        "gemm2": lambda: gemm(g["a2"], (w.w2, w.w2_scale), d2, routes.expert_end, **kw),
        "combine": lambda: combine_routes(d2, routes.row_of_route.view(t, TOP_K), tw, m),
    }
    for name, fn in parts.items():
        rows.append({"T": t, "part": name, "us": graph_us(fn, inner=5, reps=15)})
    rows.append({"T": t, "part": "sum of parts", "us": sum(r["us"] for r in rows[1:])})
    # the call and its two quantizer launches with the former tiles (16 rows x 1 group, one stage), beside the
    # current ones in this run, and the call's outputs compared
    saved = moe_quant.MAX_BLOCK_R, moe_quant.DENSE_STAGES
    moe_quant.MAX_BLOCK_R, moe_quant.DENSE_STAGES = 16, 1
    try:
        former = [{"T": t, "part": "call, former quantizer tiles (16 x 1, one stage)",
                   "equal": bool(torch.equal(op(x, ids, tw, prepared), want)),
                   "us": graph_us(lambda: op(x, ids, tw, prepared), inner=5, reps=15)}]
        former += [{"T": t, "part": f"{name}, former tiles", "us": graph_us(parts[name], inner=5, reps=15)}
                   for name in ("quant_gather", "quant_swiglu")]
    finally:
        moe_quant.MAX_BLOCK_R, moe_quant.DENSE_STAGES = saved
    rows += former + [{"T": t, "part": "call, current tiles (again)",
                       "us": graph_us(lambda: op(x, ids, tw, prepared), inner=5, reps=15)}]
    rows += [{"T": t, "part": f"{name}, current tiles (again)", "us": graph_us(parts[name], inner=5, reps=15)}
             for name in ("quant_gather", "quant_swiglu")]
    for e in EXPECTED_M:
        def with_m(*a: object, e: int = e, **k: object) -> None:
            gemm(*a, **{**k, "expected_m_for_psum_layout": e})

        def run(e: int = e) -> torch.Tensor:
            return grouped_fp8_moe(with_m, x, ids, tw, w, 10.0, psum=True)

        row = {"T": t, "part": f"call expected_m {e}", "default": e == em}
        try:
            row["equal"] = bool(torch.equal(run(), want))
            row["us"] = graph_us(run, inner=5, reps=15)
        except Exception as exc:
            row["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
        rows.append(row)
    return rows


def per_token_rows(t: int, gen: torch.Generator, call: bool, rounds: int = 3) -> list[dict]:
    """The gather pass one way and the other at T tokens (and the whole FP8 psum call with each), alternating."""
    op, prepared, x, ids, tw = fp8_call(t, gen) if call else (None, None, *fp8_inputs(t, gen))
    routes = align_routes(ids, EXPERTS, ALIGN)
    p = t * TOP_K
    valid = routes.sorted_routes < p

    def gather(per_token: bool) -> tuple[torch.Tensor, torch.Tensor]:
        return quantize_routed_rows(x, routes.sorted_routes, p, TOP_K, HIDDEN, gather=True,
                                    block_expert=routes.block_expert, per_token=per_token)

    (q0, s0), (q1, s1) = gather(False), gather(True)
    equal = bool(torch.equal(q0[valid], q1[valid]) and torch.equal(s0[valid], s1[valid]))
    rows: list[dict] = []
    fns = {"gather, one launch": lambda: gather(False), "gather, per token + copy": lambda: gather(True)}
    if call:
        saved = moe_quant.PER_TOKEN_MIN_TOKENS

        def with_min(m: int) -> torch.Tensor:
            moe_quant.PER_TOKEN_MIN_TOKENS = m
            try:
                return op(x, ids, tw, prepared)
            finally:
                moe_quant.PER_TOKEN_MIN_TOKENS = saved

        equal = equal and bool(torch.equal(with_min(1 << 30), with_min(0)))
        fns["call, one launch"] = lambda: with_min(1 << 30)
        fns["call, per token + copy"] = lambda: with_min(0)
    for r in range(rounds):
        for name, fn in fns.items():
            rows.append({"T": t, "part": name, "round": r, "equal": equal,
                         "us": graph_us(fn, inner=5, reps=15)})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def gemm1_output(t: int, gen: torch.Generator) -> tuple:
    """(op, prepared, x, ids, tw, routes, GEMM1's real output [rows, 2I] bf16, the rows holding routes): the FP8
    psum call's inputs at T tokens (fp8_call) and GEMM1 run on them through DeepGEMM's psum layout."""
    op, prepared, x, ids, tw = fp8_call(t, gen)
    g = fp8_gemm_operands(prepared, x, ids)
    return op, prepared, x, ids, tw, g["routes"], g["d1"], g["valid"]


def real_swiglu_rows(t: int, gen: torch.Generator) -> list[dict]:
    """The SwiGLU pass at T tokens on GEMM1's real output against randn rows of the same shape, over tiles and
    warps (bytes compared with the default's on the same input); then the whole FP8 psum call with DeepGEMM's PDL
    (deep_gemm.set_pdl) off and on, rounds alternating."""
    import deep_gemm

    op, prepared, x, ids, tw, routes, real, valid = gemm1_output(t, gen)
    n, m = t * TOP_K, real.shape[0]
    rand = torch.randn(m, 2 * INTER, generator=gen, device="cuda").to(torch.bfloat16)
    stats = {"real_abs_max": float(real[valid].float().abs().max()), "real_std": float(real[valid].float().std())}
    rows: list[dict] = [{"T": t, "part": "GEMM1 output", **stats}]
    default = row_tile(m, n, INTER, ALIGN)
    for name, src in (("real", real), ("randn", rand)):
        want = quantize_routed_rows(src, routes.sorted_routes, n, TOP_K, INTER, gather=False, swiglu_limit=10.0)
        for tile in ((4, 4), (2, 8), (1, 16), (8, 2), (4, 8), (2, 16)):
            for warps in (4, 8):
                def run(tile: tuple[int, int] = tile, warps: int = warps, src: torch.Tensor = src) -> object:
                    return quantize_routed_rows(src, routes.sorted_routes, n, TOP_K, INTER, gather=False,
                                                swiglu_limit=10.0, tile=tile, warps=warps)
                q, sf = run()
                rows.append({"T": t, "part": f"swiglu pass, {name} input", "tile": list(tile), "warps": warps,
                             "default": tile == default and warps == 4,
                             "equal": bool(torch.equal(q[valid], want[0][valid])
                                           and torch.equal(sf[valid], want[1][valid])),
                             "us": graph_us(run, inner=5, reps=15)})
                print(json.dumps(rows[-1]), flush=True)
    want = op(x, ids, tw, prepared)
    saved = deep_gemm.get_pdl()
    try:
        for r in range(3):
            for pdl in (False, True):
                deep_gemm.set_pdl(pdl)
                got = op(x, ids, tw, prepared)
                rows.append({"T": t, "part": f"call, DeepGEMM PDL {'on' if pdl else 'off'}", "round": r,
                             "equal": bool(torch.equal(got, want)),
                             "us": graph_us(lambda: op(x, ids, tw, prepared), inner=5, reps=15)})
                print(json.dumps(rows[-1]), flush=True)
    finally:
        deep_gemm.set_pdl(saved)
    return rows


def fast_swiglu_rows(t: int, gen: torch.Generator, rounds: int = 3) -> list[dict]:
    """The SwiGLU pass with torch's exact roundings (fast=False) against the approximate exp and division
    (moe_quant.FAST_SWIGLU) on GEMM1's real output at T tokens, rounds alternating: time, and how the codes differ
    (share of codes, largest difference in FP8 steps of the exact code's binade, scales). Then the gather pass two
    ways alone (each token quantized, then copied to its routes' rows; or stored straight into them from the tokens'
    side, row_of_route: bytes compared), its token quantization alone, and the whole FP8 psum call as before (exact
    SwiGLU, copy), with the scatter, and with both changes (outputs' relative L2 difference against before)."""
    from dsv4hal.kernels import grouped_fp8_moe

    op, prepared, x, ids, tw, routes, d1, valid = gemm1_output(t, gen)
    n = t * TOP_K

    def swiglu(fast: bool) -> tuple[torch.Tensor, torch.Tensor]:
        return quantize_routed_rows(d1, routes.sorted_routes, n, TOP_K, INTER, gather=False, swiglu_limit=10.0,
                                    fast=fast)

    (qe, se), (qf, sf) = swiglu(False), swiglu(True)
    qe, se, qf, sf = qe[valid], se[valid], qf[valid], sf[valid]
    deq_e = qe.view(torch.float8_e4m3fn).float() * se.repeat_interleave(GROUP, 1)
    deq_f = qf.view(torch.float8_e4m3fn).float() * sf.repeat_interleave(GROUP, 1)
    unit = se.repeat_interleave(GROUP, 1)
    step = unit * torch.exp2((deq_e.abs() / unit).clamp(min=2.0 ** -6).log2().floor() - 3)
    diff = {"codes": qe.numel(), "codes_differing": int((qe != qf).sum()),
            "share_differing": float((qe != qf).float().mean()),
            "max_steps": float(((deq_f - deq_e).abs() / step).max()),
            "scales_differing": int((se != sf).sum()), "scales": se.numel(),
            "max_scale_rel": float(((sf - se).abs() / se).max()),
            "nan": int(deq_f.isnan().sum() + deq_e.isnan().sum())}
    rows: list[dict] = [{"T": t, "part": "swiglu pass, fast against exact codes", **diff}]
    print(json.dumps(rows[-1]), flush=True)
    qt = torch.empty(t, HIDDEN, dtype=torch.uint8, device="cuda")
    fns = {"swiglu pass, exact (torch's roundings)": lambda: swiglu(False),
           "swiglu pass, fast (approximate exp, division)": lambda: swiglu(True),
           "gather pass (per token + copy)": lambda: quantize_routed_rows(
               x, routes.sorted_routes, n, TOP_K, HIDDEN, gather=True, block_expert=routes.block_expert),
           "gather pass (scatter from tokens, one launch)": lambda: quantize_routed_rows(
               x, routes.sorted_routes, n, TOP_K, HIDDEN, gather=True, block_expert=routes.block_expert,
               row_of_route=routes.row_of_route),
           "gather pass, tokens quantized only (direct)": lambda: quantize_routed_rows(
               x, torch.arange(t, device="cuda", dtype=torch.int32), t, 1, HIDDEN, gather=False, per_token=False),
           "read x, write T rows of codes (torch copy, for scale)": lambda: qt.copy_(x.view(torch.uint8)[:, :HIDDEN])}
    gq = [quantize_routed_rows(x, routes.sorted_routes, n, TOP_K, HIDDEN, gather=True,
                               block_expert=routes.block_expert, row_of_route=rr) for rr in (None, routes.row_of_route)]
    rows.append({"T": t, "part": "gather pass, scatter against copy",
                 "equal": bool(torch.equal(gq[0][0][valid], gq[1][0][valid])
                               and torch.equal(gq[0][1][valid], gq[1][1][valid]))})
    print(json.dumps(rows[-1]), flush=True)
    saved = moe_quant.FAST_SWIGLU
    quant = grouped_fp8_moe.quantize_routed_rows

    def copy_gather(*a: object, **k: object) -> tuple[torch.Tensor, torch.Tensor]:
        return quant(*a, **{**k, "row_of_route": None})

    def call(fast: bool, scatter: bool = True) -> torch.Tensor:
        moe_quant.FAST_SWIGLU = fast
        grouped_fp8_moe.quantize_routed_rows = quant if scatter else copy_gather
        try:
            return op(x, ids, tw, prepared)
        finally:
            moe_quant.FAST_SWIGLU = saved
            grouped_fp8_moe.quantize_routed_rows = quant

    ye, yf = call(False, False), call(True)
    rel = float((yf.float() - ye.float()).norm() / ye.float().norm())
    rows.append({"T": t, "part": "call, scatter gather and exact swiglu against copy gather",
                 "equal": bool(torch.equal(call(False), ye))})
    fns["call, exact swiglu, copy gather (before)"] = lambda: call(False, False)
    fns["call, exact swiglu, scatter gather"] = lambda: call(False)
    fns["call, fast swiglu, scatter gather (now)"] = lambda: call(True)
    for r in range(rounds):
        for name, fn in fns.items():
            rows.append({"T": t, "part": name, "round": r, "us": graph_us(fn, inner=5, reps=15)})
            if name.startswith("call"):
                rows[-1]["rel_l2_fast_vs_exact"] = rel
            print(json.dumps(rows[-1]), flush=True)
    return rows


def scatter_grid_rows(t: int, gen: torch.Generator) -> list[dict]:
    """The gather pass's scatter from the tokens' side at T tokens over (BLOCK_T, BLOCK_G) tiles and warps, every
    setting's bytes compared with the default's (rows of routes)."""
    x, ids, _ = fp8_inputs(t, gen)
    routes = align_routes(ids, EXPERTS, ALIGN)
    n = t * TOP_K
    valid = routes.sorted_routes < n

    def run(tile: tuple[int, int] | None = None, warps: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
        return quantize_routed_rows(x, routes.sorted_routes, n, TOP_K, HIDDEN, gather=True,
                                    block_expert=routes.block_expert, row_of_route=routes.row_of_route, tile=tile,
                                    warps=warps)

    want = run()
    default = row_tile(t, t, HIDDEN, GROUP)
    rows = []
    for tile in ((4, 4), (2, 8), (1, 16), (8, 2), (1, 32), (2, 16)):
        for warps in (4, 8):
            q, sf = run(tile, warps)
            rows.append({"T": t, "part": "scatter", "tile": list(tile), "warps": warps,
                         "default": tile == default and warps == 4,
                         "equal": bool(torch.equal(q[valid], want[0][valid])
                                       and torch.equal(sf[valid], want[1][valid])),
                         "us": graph_us(lambda tile=tile, warps=warps: run(tile, warps), inner=5, reps=15)})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", required=True)
    ap.add_argument("--tokens", default="4096", help="comma-separated token counts")
    ap.add_argument("--grid", choices=tuple(GRIDS), default="first")
    ap.add_argument("--call", action="store_true", help="also the whole FP8 call, its launches, expected_m")
    ap.add_argument("--call-only", action="store_true", help="the --call rows only (no quantizer grid)")
    ap.add_argument("--per-token", action="store_true", help="the gather pass one launch against two (see above)")
    ap.add_argument("--fast-swiglu", action="store_true",
                    help="the SwiGLU pass exact against fast on GEMM1's output, gather launches, the call both ways")
    ap.add_argument("--scatter-grid", action="store_true", help="the gather pass's scatter over tiles and warps")
    ap.add_argument("--real-swiglu", action="store_true",
                    help="the SwiGLU pass on GEMM1's real output against randn, tiles and warps; PDL in the call")
    args = ap.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    copy = copy_bandwidth()
    out: dict = {"device": torch.cuda.get_device_name(), "copy_GBps": copy / 1e9, "rows": []}
    if args.scatter_grid:
        out["scatter"] = [r for v in args.tokens.split(",") for r in scatter_grid_rows(int(v), gen)]
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
        return
    if args.fast_swiglu:
        out["fast_swiglu"] = fast_swiglu_rows(int(args.tokens.split(",")[0]), gen)
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
        return
    if args.real_swiglu:
        out["real_swiglu"] = real_swiglu_rows(int(args.tokens.split(",")[0]), gen)
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
        return
    if args.per_token:
        for t in (int(v) for v in args.tokens.split(",")):
            out["per_token"] = out.get("per_token", []) + per_token_rows(t, gen, args.call)
            Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
        return
    for t in (int(v) for v in args.tokens.split(",")):
        ids = torch.rand(t, EXPERTS, generator=gen, device="cuda").topk(TOP_K, dim=1).indices.to(torch.int32)
        routes = align_routes(ids, EXPERTS, ALIGN)
        p = t * TOP_K
        x = torch.randn(t, HIDDEN, generator=gen, device="cuda").to(torch.bfloat16)
        rows = routes.sorted_routes.numel()
        d1 = torch.randn(rows, 2 * INTER, generator=gen, device="cuda").to(torch.bfloat16)
        passes = {
            "gather": (dict(src=x, k_dim=HIDDEN, gather=True), p * HIDDEN * 3 + p * HIDDEN // GROUP * 4),
            "swiglu": (dict(src=d1, k_dim=INTER, gather=False, swiglu_limit=10.0),
                       p * INTER * 5 + p * INTER // GROUP * 4),
        }
        for name, (kw, nbytes) in passes.items() if not args.call_only else ():
            fixed = dict(kw, sorted_routes=routes.sorted_routes, num_routes=p, top_k=TOP_K,
                         block_expert=routes.block_expert)

            def run(s: dict | None = None, fixed: dict = fixed) -> tuple[torch.Tensor, torch.Tensor]:
                return quantize_routed_rows(**fixed, **(s or {}))

            want = run()
            tile = row_tile(rows, p, kw["k_dim"], ALIGN)
            default = {"tile": tile, "warps": 4, "stages": DENSE_STAGES if tile[0] > 1 else 1}
            valid = routes.sorted_routes < p  # padding rows are left unwritten: compare the rows of routes
            for s in settings(args.grid):
                row = {"T": t, "pass": name, "tile": list(s["tile"]), "warps": s["warps"], "stages": s["stages"],
                       "default": s == default}
                try:
                    q, sf = run(s)
                    row["equal"] = bool(torch.equal(q[valid], want[0][valid])
                                        and torch.equal(sf[valid], want[1][valid]))
                    row["us"] = graph_us(lambda s=s: run(s), inner=5, reps=15)
                    row["copy_share"] = nbytes / (row["us"] * 1e-6) / copy
                except Exception as exc:  # a setting that does not compile or fit is recorded, not fatal
                    row["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
                out["rows"].append(row)
                print(json.dumps(row), flush=True)
                Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
        if args.call or args.call_only:
            out["call"] = out.get("call", []) + call_rows(t, gen)
            for row in out["call"]:
                print(json.dumps(row), flush=True)
            Path(args.json).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
