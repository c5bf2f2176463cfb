"""A/B in one run: the portable Triton kernels launched plainly, with programmatic dependent launch (PDL mode 1:
each kernel waits for the one ahead; mode 2: and lets the next one launch right after its wait), timed in turns
(CUDA-graph replays, each keeping its fastest round) on the same inputs. Every output under PDL is compared with
the plain launch's first (mHC bit for bit; the fused MoE's atomics within rounding).

    python3 bench/ab_pdl.py --json out/ab-pdl.json [--tokens 1,8,64] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable
from pathlib import Path

import torch

from dsv4hal.bench.timing import graph_us
from dsv4hal.conformance.cases_moe import _expert_weights, _experts_params
from dsv4hal.kernels import deepgemm_mhc
from dsv4hal.kernels.triton import fused_moe as tmoe
from dsv4hal.kernels.triton import mhc as tmhc
from dsv4hal.kernels.triton.pdl import MODES, pdl_mode

D = 4096


def _set_mode(mode: int) -> None:
    os.environ["DSV4HAL_PDL"] = str(mode)
    pdl_mode.cache_clear()


def _calls(t: int, gen: torch.Generator, moe_w: object, moe_shape: tuple[int, int]) -> dict[str, Callable]:
    dev = "cuda"
    x = torch.randn(t, 4, D, device=dev, generator=gen).bfloat16()
    f = torch.randn(t, D, device=dev, generator=gen).bfloat16()
    fn = torch.randn(24, 4 * D, device=dev, generator=gen) * 0.01
    base, scale = torch.randn(24, device=dev, generator=gen) * 0.1, torch.rand(3, device=dev, generator=gen)
    post, comb = torch.rand(t, 4, device=dev, generator=gen), torch.rand(t, 4, 4, device=dev, generator=gen)
    e, k = moe_shape
    xm = torch.randn(t, D, device=dev, generator=gen).bfloat16()
    ids = torch.rand(t, e, device=dev, generator=gen).argsort(1)[:, :k].to(torch.int32)
    tw = torch.rand(t, k, device=dev, generator=gen) + 0.5

    def chain():  # noqa: ANN202  a sublayer boundary: post, pre, the MoE, as a decode step runs them
        s = tmhc.mhc_post(f, x, post, comb)
        y, _, _ = tmhc.mhc_pre(s, fn, base, scale)
        return tmoe.fused_moe(y, ids, tw, moe_w, 10.0)

    calls = {
        "triton_mhc_pre": lambda: tmhc.mhc_pre(x, fn, base, scale),
        "mhc_post": lambda: tmhc.mhc_post(f, x, post, comb),
        "triton_mhc_post_then_pre": lambda: tmhc.mhc_post_then_pre(f, x, post, comb, fn, base, scale),
        "triton_fused_moe": lambda: tmoe.fused_moe(xm, ids, tw, moe_w, 10.0),
        "chain post+pre+moe": chain,
    }
    try:
        deepgemm_mhc._entry()
        calls["deepgemm_mhc_pre (apply launch PDL)"] = lambda: deepgemm_mhc.mhc_pre(x, fn, base, scale)
    except Exception as err:  # noqa: BLE001  (a machine without DeepGEMM: the Triton rows only)
        print(f"DeepGEMM mHC not timed: {err}")
    return calls


def _flat(out: object) -> list[torch.Tensor]:
    return [out] if isinstance(out, torch.Tensor) else [v for v in out if isinstance(v, torch.Tensor)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", required=True)
    ap.add_argument("--tokens", default="1,8,64")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    params = _experts_params("flash", 1, "mxfp4")
    moe_w = tmoe.prepare_weights(_expert_weights(params, torch.device("cuda"), gen))
    out: dict = {"command": f"python3 bench/ab_pdl.py --tokens {args.tokens} --rounds {args.rounds} --json ...",
                 "device": torch.cuda.get_device_name(), "modes": list(MODES), "rows": []}
    for t in map(int, args.tokens.split(",")):
        calls = _calls(t, gen, moe_w, (params["E"], params["top_k"]))
        _set_mode(0)
        want = {n: [v.clone() for v in _flat(fn())] for n, fn in calls.items()}
        diff: dict[str, dict[str, float]] = {}
        for mode in MODES[1:]:
            _set_mode(mode)
            for n, fn in calls.items():
                got = _flat(fn())
                torch.cuda.synchronize()
                diff.setdefault(n, {})[str(mode)] = max(float((a.float() - b.float()).abs().max()) if a.numel() else 0.0
                                                        for a, b in zip(got, want[n], strict=True))
        best: dict[str, dict[str, float]] = {}
        for _ in range(args.rounds):
            for mode in MODES:
                _set_mode(mode)
                for n, fn in calls.items():
                    us = graph_us(fn, inner=10, reps=15)
                    row = best.setdefault(n, {})
                    row[str(mode)] = min(row.get(str(mode), float("inf")), us)
        ratio = {n: {m: v / r["0"] for m, v in r.items()} for n, r in best.items()}
        out["rows"].append({"T": t, "us": best, "ratio_to_plain": ratio, "max_abs_diff_to_plain": diff})
        for n, r in best.items():
            print(f"T={t} {n}: " + ", ".join(f"mode {m} {v:.2f}us (x{ratio[n][m]:.3f}, diff {diff[n].get(m, 0):.1e})"
                                             for m, v in r.items()), flush=True)
    _set_mode(0)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
