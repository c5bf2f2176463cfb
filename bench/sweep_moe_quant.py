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

    python3 bench/sweep_moe_quant.py --json out.json [--tokens 4096] [--grid second] [--call]"""

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


def call_rows(t: int, gen: torch.Generator) -> list[dict]:
    """The FP8 psum call at T tokens: whole, its launches alone, and with other expected_m values. The launches are
    grouped_fp8_moe's steps called one by one (that function runs them in one go), so each can be timed alone."""
    import deep_gemm

    import dsv4hal
    from dsv4hal.bench.common import bound_op
    from dsv4hal.conformance.cases_moe import _expert_weights, _experts_params
    from dsv4hal.kernels.grouped_fp8_moe import grouped_fp8_moe, psum_expected_m
    from dsv4hal.kernels.triton.moe_combine import combine_routes

    p = _experts_params("flash", t, "fp8_block")
    op = bound_op(dsv4hal.select_platform(), "moe_experts", "deepgemm_fp8_psum_sm90")
    prepared = op.prepare_weights(_expert_weights(p, torch.device("cuda"), gen))
    w = prepared.payload  # DeepGemmWeights
    x = torch.randn(t, HIDDEN, generator=gen, device="cuda").to(torch.bfloat16)
    ids = torch.rand(t, EXPERTS, generator=gen, device="cuda").argsort(1)[:, :TOP_K].to(torch.int32)
    tw = torch.rand(t, TOP_K, generator=gen, device="cuda") + 0.5
    n = t * TOP_K
    rows: list[dict] = [{"T": t, "part": "call", "us": graph_us(lambda: op(x, ids, tw, prepared), inner=5, reps=15)}]
    want = op(x, ids, tw, prepared)
    routes = align_routes(ids, EXPERTS, w.alignment)
    a1, s1 = quantize_routed_rows(x, routes.sorted_routes, n, TOP_K, HIDDEN, gather=True,
                                  block_expert=routes.block_expert)
    m = routes.sorted_routes.numel()
    d1 = torch.empty(m, 2 * INTER, dtype=torch.bfloat16, device="cuda")
    d2 = torch.empty(m, HIDDEN, dtype=torch.bfloat16, device="cuda")
    em = psum_expected_m(n, EXPERTS)
    kw = {"use_psum_layout": True, "expected_m_for_psum_layout": em}
    gemm = deep_gemm.m_grouped_fp8_gemm_nt_contiguous
    gemm((a1.view(torch.float8_e4m3fn), s1), (w.w13, w.w13_scale), d1, routes.expert_end, **kw)
    a2, s2 = quantize_routed_rows(d1, routes.sorted_routes, n, TOP_K, INTER, gather=False, swiglu_limit=10.0)
    parts = {
        "align": lambda: align_routes(ids, EXPERTS, w.alignment),
        "quant_gather": lambda: quantize_routed_rows(x, routes.sorted_routes, n, TOP_K, HIDDEN, gather=True,
                                                     block_expert=routes.block_expert),
        "gemm1": lambda: gemm((a1.view(torch.float8_e4m3fn), s1), (w.w13, w.w13_scale), d1, routes.expert_end,
                              **kw),
        "quant_swiglu": lambda: quantize_routed_rows(d1, routes.sorted_routes, n, TOP_K, INTER, gather=False,
                                                     swiglu_limit=10.0),
        "gemm2": lambda: gemm((a2.view(torch.float8_e4m3fn), s2), (w.w2, w.w2_scale), d2, routes.expert_end, **kw),
        "combine": lambda: combine_routes(d2, routes.row_of_route.view(t, TOP_K), tw, m),
    }
    for name, fn in parts.items():
        rows.append({"T": t, "part": name, "us": graph_us(fn, inner=5, reps=15)})
    rows.append({"T": t, "part": "sum of parts", "us": sum(r["us"] for r in rows[1:])})
    # the call and its two quantizer launches with the former tiles (16 rows x 1 group, one stage: the eleventh
    # session's start), beside the current ones in this run, and the call's outputs compared
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", required=True)
    ap.add_argument("--tokens", default="4096", help="comma-separated token counts")
    ap.add_argument("--grid", choices=tuple(GRIDS), default="first")
    ap.add_argument("--call", action="store_true", help="also the whole FP8 call, its launches, expected_m")
    ap.add_argument("--call-only", action="store_true", help="the --call rows only (no quantizer grid)")
    args = ap.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    copy = copy_bandwidth()
    out: dict = {"device": torch.cuda.get_device_name(), "copy_GBps": copy / 1e9, "rows": []}
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
