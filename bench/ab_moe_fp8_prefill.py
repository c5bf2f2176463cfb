"""The FP8 psum MoE call at prefill sizes (deepgemm_fp8_psum_sm90; H200, V4-Flash: H 4096, I 2048, E 256, top-6),
where its 600 TFLOP/s goal at T = 4096 sits at the line: one change measured against the code before it, in turns,
and DeepGEMM's own launch settings.

--old FILE: a copy of dsv4hal/kernels/triton/moe_quant.py from before the change (e.g. `git show
REV:dsv4hal/kernels/triton/moe_quant.py > .kernels/old_moe_quant.py`). The gather pass alone (x's rows quantized
to GEMM1's FP8 input) one way and the other at every --tokens, and the whole call with each module's quantizers,
rounds alternating; codes, scales and call outputs compared byte for byte.

--knobs: the call and its two GEMMs alone under DeepGEMM's process-wide settings, each restored afterwards:
set_num_sms (the persistent grid) and set_block_size_multiple_of (the BLOCK_N steps its config heuristic picks
from); outputs compared with the default's. Run with DG_PRINT_CONFIGS=1 to log each chosen config.

--block-n T:DROPPED,...: deepgemm_moe.PSUM_BLOCK_N None (DeepGEMM's heuristic) against 128, the call and its two
GEMMs alone, rounds alternating, at each token count and share of dropped routes.

    python3 bench/ab_moe_fp8_prefill.py --json out.json --old .kernels/old_moe_quant.py [--knobs]
    python3 bench/ab_moe_fp8_prefill.py --json out.json --block-n 4096:0,4096:0.5,1024:0,64:0"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import torch

from dsv4hal.bench.timing import copy_bandwidth, graph_us
from dsv4hal.kernels import grouped_fp8_moe as gfm
from dsv4hal.kernels.moe_align import align_routes
from dsv4hal.kernels.triton import moe_quant

sys.path.insert(0, str(Path(__file__).parent))
from sweep_moe_quant import fp8_gemm_operands, fp8_inputs  # noqa: E402 (a sibling script: its inputs)

HIDDEN, INTER, EXPERTS, TOP_K = 4096, 2048, 256, 6
NUM_SMS = (128, 120, 112)
BLOCK_N_MULTIPLE = (32, 64, 128)


def _load(path: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location("old_moe_quant", path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def gather_rows(old: ModuleType, t: int, gen: torch.Generator, rounds: int) -> list[dict]:
    """The gather pass before and after at T tokens (the psum call's arguments), in turns."""
    x, ids, _ = fp8_inputs(t, gen)
    routes = align_routes(ids, EXPERTS, 128)
    n = t * TOP_K
    valid = routes.sorted_routes < n

    def run(mod: ModuleType) -> tuple[torch.Tensor, torch.Tensor]:
        return mod.quantize_routed_rows(x, routes.sorted_routes, n, TOP_K, HIDDEN, gather=True,
                                        block_expert=routes.block_expert, row_of_route=routes.row_of_route)

    (qa, sa), (qb, sb) = run(old), run(moe_quant)
    equal = bool(torch.equal(qa[valid], qb[valid]) and torch.equal(sa[valid], sb[valid]))
    out = []
    for r in range(rounds):
        for name, mod in (("before", old), ("after", moe_quant)):
            out.append({"T": t, "part": "gather pass", "version": name, "round": r, "equal": equal,
                        "us": graph_us(lambda mod=mod: run(mod), inner=5, reps=15)})
            print(json.dumps(out[-1]), flush=True)
    return out


def call_rows(old: ModuleType, op: Callable, prepared: object, t: int, gen: torch.Generator,
              rounds: int) -> list[dict]:
    """The whole psum call with the old module's quantizers and with the current ones, in turns."""
    x, ids, tw = fp8_inputs(t, gen)
    current = gfm.quantize_routed_rows

    def call(mod: ModuleType) -> torch.Tensor:
        gfm.quantize_routed_rows = mod.quantize_routed_rows
        try:
            return op(x, ids, tw, prepared)
        finally:
            gfm.quantize_routed_rows = current

    equal = bool(torch.equal(call(old), call(moe_quant)))
    flop = 2 * t * TOP_K * 3 * HIDDEN * INTER
    out = []
    for r in range(rounds):
        for name, mod in (("before", old), ("after", moe_quant)):
            us = graph_us(lambda mod=mod: call(mod), inner=5, reps=15)
            out.append({"T": t, "part": "call", "version": name, "round": r, "equal": equal, "us": us,
                        "tflops": flop / us / 1e6})
            print(json.dumps(out[-1]), flush=True)
    return out


def _gemm_inputs(prepared: object, t: int, gen: torch.Generator, dropped: float = 0.0) -> dict:
    """fp8_gemm_operands on the call's inputs at T tokens (x, ids, tw added), a share of routes dropped (expert
    parallelism)."""
    x, ids, tw = fp8_inputs(t, gen)
    if dropped:
        ids = torch.where(torch.rand(t, TOP_K, device="cuda", generator=gen) < dropped, -1, ids)
    return {"x": x, "ids": ids, "tw": tw, **fp8_gemm_operands(prepared, x, ids)}


def _parts(op: Callable, prepared: object, t: int, gen: torch.Generator, dropped: float = 0.0,
           ) -> tuple[Callable[[Callable], dict[str, Callable[[], object]]], Callable[[], torch.Tensor], int]:
    """(parts(gemm) -> {"call", "gemm1", "gemm2": launchers}, the call, its FLOPs) at T tokens."""
    g = _gemm_inputs(prepared, t, gen, dropped)
    w, layout, kw = g["w"], g["routes"].expert_end, g["kw"]

    def call() -> torch.Tensor:
        return op(g["x"], g["ids"], g["tw"], prepared)

    def parts(gemm: Callable) -> dict[str, Callable[[], object]]:
        return {"call": call,
                "gemm1": lambda: gemm(g["a1"], (w.w13, w.w13_scale), g["d1"], layout, **kw),
                "gemm2": lambda: gemm(g["a2"], (w.w2, w.w2_scale), g["d2"], layout, **kw)}

    return parts, call, g["flop"]


def _timed(parts: dict[str, Callable[[], object]], flop: int) -> dict:
    row = {f"{part}_us": graph_us(fn, inner=5, reps=15) for part, fn in parts.items()}
    row["call_tflops"] = flop / row["call_us"] / 1e6
    return row


def knob_rows(op: Callable, prepared: object, t: int, gen: torch.Generator) -> list[dict]:
    """The call (its heuristic GEMMs, PSUM_BLOCK_N None) and its GEMMs alone under DeepGEMM's num_sms and BLOCK_N
    multiple settings."""
    import deep_gemm
    from dsv4hal_cuda_sm90 import deepgemm_moe

    parts, call, flop = _parts(op, prepared, t, gen)
    saved, deepgemm_moe.PSUM_BLOCK_N = deepgemm_moe.PSUM_BLOCK_N, None
    want = call()
    sms = deep_gemm.get_num_sms()
    settings = [("default", None, None)] + [(f"num_sms {s}", s, None) for s in NUM_SMS] + \
               [(f"block_n multiple of {b}", None, b) for b in BLOCK_N_MULTIPLE] + [("default (again)", None, None)]
    out = []
    try:
        for name, num_sms, multiple in settings:
            try:
                if num_sms is not None:
                    deep_gemm.set_num_sms(num_sms)
                if multiple is not None:
                    deep_gemm.set_block_size_multiple_of((1, multiple))
                row = {"T": t, "setting": name, "equal": bool(torch.equal(call(), want)),
                       **_timed(parts(deep_gemm.m_grouped_fp8_gemm_nt_contiguous), flop)}
            except Exception as exc:  # a setting DeepGEMM refuses is recorded, not fatal
                row = {"T": t, "setting": name, "error": f"{type(exc).__name__}: {str(exc)[:300]}"}
            finally:
                deep_gemm.set_num_sms(sms)
                deep_gemm.set_block_size_multiple_of((1, 1))
            out.append(row)
            print(json.dumps(row), flush=True)
    finally:
        deepgemm_moe.PSUM_BLOCK_N = saved
    return out


def block_n_rows(op: Callable, prepared: object, cases: list[tuple[int, float]], gen: torch.Generator,
                 rounds: int) -> list[dict]:
    """The call and its GEMMs with DeepGEMM's heuristic BLOCK_N (PSUM_BLOCK_N None) and with 128, in turns, at
    each (T, dropped share); the call's outputs compared."""
    from dsv4hal_cuda_sm90 import deepgemm_moe

    saved = deepgemm_moe.PSUM_BLOCK_N
    out = []
    try:
        for t, dropped in cases:
            parts, call, flop = _parts(op, prepared, t, gen, dropped)
            outputs = {}
            for block_n in (None, 128):
                deepgemm_moe.PSUM_BLOCK_N = block_n
                outputs[block_n] = call()
            equal = bool(torch.equal(outputs[None], outputs[128]))
            for r in range(rounds):
                for block_n in (None, 128):
                    deepgemm_moe.PSUM_BLOCK_N = block_n
                    row = {"T": t, "dropped": dropped, "block_n": block_n or "heuristic", "round": r, "equal": equal,
                           **_timed(parts(deepgemm_moe._psum_gemm(block_n)), flop)}
                    out.append(row)
                    print(json.dumps(row), flush=True)
    finally:
        deepgemm_moe.PSUM_BLOCK_N = saved
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", required=True)
    ap.add_argument("--old", help="moe_quant.py from before the change (the A/B's 'before')")
    ap.add_argument("--tokens", default="256,1024,4096", help="gather pass token counts")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--knobs", action="store_true", help="DeepGEMM's num_sms and BLOCK_N multiple")
    ap.add_argument("--block-n", help="T:DROPPED,... cases of the heuristic BLOCK_N against 128 in turns")
    args = ap.parse_args()
    import dsv4hal
    from dsv4hal.bench.common import bound_op
    from dsv4hal.conformance.cases_moe import _expert_weights, _experts_params

    gen = torch.Generator(device="cuda").manual_seed(0)
    out: dict = {"device": torch.cuda.get_device_name(), "copy_GBps": copy_bandwidth() / 1e9}
    path = Path(args.json)
    if args.old:
        old = _load(args.old)
        out["gather"] = [r for t in args.tokens.split(",") for r in gather_rows(old, int(t), gen, args.rounds)]
        path.write_text(json.dumps(out, indent=1) + "\n")
    op = bound_op(dsv4hal.select_platform(), "moe_experts", "deepgemm_fp8_psum_sm90")
    prepared = op.prepare_weights(_expert_weights(_experts_params("flash", 4096, "fp8_block"), torch.device("cuda"),
                                                  gen))
    if args.old:
        out["call"] = call_rows(old, op, prepared, 4096, gen, args.rounds)
        path.write_text(json.dumps(out, indent=1) + "\n")
    if args.knobs:
        out["knobs"] = knob_rows(op, prepared, 4096, gen)
        path.write_text(json.dumps(out, indent=1) + "\n")
    if args.block_n:
        cases = [(int(t), float(d)) for t, d in (c.split(":") for c in args.block_n.split(","))]
        out["block_n"] = block_n_rows(op, prepared, cases, gen, args.rounds)
        path.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
