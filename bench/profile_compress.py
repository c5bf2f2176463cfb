"""Where the prefill compress op's time goes on the host (the op measured 0.04-0.14 of copy bandwidth while its
Triton kernel alone reached 0.44-0.92): each part timed on its own with a device sync around it, then the bound
op under cProfile (top functions by cumulative time). Then the kernel's launch settings swept per layer kind
(warps, rows a chunk, stages), each timed as a graph and checked against the default's output (--sweep).

    python3 bench/profile_compress.py [--sweep] > out/profile-compress.txt
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time
from collections.abc import Callable

import torch

import dsv4hal
from dsv4hal.bench.common import bound_op
from dsv4hal.bench.compress import CONFIGS, PREFILL_TOKENS, _layer
from dsv4hal.bench.timing import graph_us
from dsv4hal.conformance.cases_compress import COMPRESS_ROPE_BASE
from dsv4hal.kernels.triton.compress import _config, compress_into
from dsv4hal.ops.compress import num_groups_of
from dsv4hal.reference.rope import DSV4_YARN, make_rope_table


def _us(fn: Callable[[], object], reps: int = 20) -> float:
    """Median wall microseconds of a call, the device synchronised before and after each."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e6)
    return sorted(times)[reps // 2]


def _parts(op: Callable[..., object], args: dict, cu: torch.Tensor, ratio: int,
           out: torch.Tensor) -> dict[str, Callable[[], object]]:
    return {"bound op": lambda: op(**args), "bound op given num_groups": lambda: op(**args, num_groups=out.shape[0]),
            "num_groups_of (sync)": lambda: num_groups_of(cu, ratio),
            "compress_into (kernel, launch)": lambda: compress_into(out, **args),
            "validate": lambda: op.definition.validate(**args)}  # type: ignore[attr-defined]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sweep", action="store_true", help="also sweep the kernel's launch settings")
    sweep_settings = ap.parse_args().sweep
    platform = dsv4hal.select_platform()
    gen = torch.Generator(device="cuda").manual_seed(0)
    cos, sin = make_rope_table(PREFILL_TOKENS + 256, COMPRESS_ROPE_BASE, DSV4_YARN, device="cuda")
    cu = torch.tensor([0, PREFILL_TOKENS], dtype=torch.int32, device="cuda")
    for name, ratio, hd, hadamard in CONFIGS:
        args = {**_layer(ratio, hd, PREFILL_TOKENS, gen), "cos": cos, "sin": sin, "cu_seqlens": cu, "ratio": ratio,
                "hadamard": hadamard}
        op = bound_op(platform, "compress", "triton_compress")
        out = torch.empty(num_groups_of(cu, ratio), hd, device="cuda")
        parts = _parts(op, args, cu, ratio, out)
        print(name, {k: round(_us(f), 1) for k, f in parts.items()}, flush=True)
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(20):
            op(**args)
        torch.cuda.synchronize()
        prof.disable()
        pstats.Stats(prof).sort_stats("cumulative").print_stats(14)
        if not sweep_settings:
            continue
        window, block_r, warps, stages = _config(ratio, hd, False)
        want = out.clone()
        compress_into(want, **args)
        sweep = {}
        for w in (1, 2, 4, 8, 16):
            for br in sorted({block_r, min(window, 2 * block_r), max(8, block_r // 2)}):
                for st in (1, 2, 3):
                    cfg = (window, br, w, st)
                    got = torch.full_like(out, float("nan"))
                    try:
                        compress_into(got, **args, config=cfg)
                        us = graph_us(lambda got=got, cfg=cfg, a=args: compress_into(got, **a, config=cfg))
                    except Exception as exc:  # noqa: BLE001 (a setting that does not compile is reported)
                        sweep[str(cfg)] = f"{type(exc).__name__}"
                        continue
                    sweep[str(cfg)] = (round(us, 1), bool(torch.allclose(got, want, atol=1e-5, rtol=1e-5)))
        print(name, "sweep (window, rows a chunk, warps, stages) -> (us, same as default); default",
              (window, block_r, warps, stages), sweep, flush=True)


if __name__ == "__main__":
    main()
