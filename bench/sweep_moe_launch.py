"""Launch sweeps of the MXFP4 expert kernels at decode token counts (H200), V4-Flash experts, each timed in CUDA graphs
through dsv4hal's own binding, the library's own choice first, every result checked against that first one:

  * triton_kernels (`--impl oai`): matmul_ogs launch constraints (`update_opt_flags_constraints`: persistence,
    block_k, pipeline stages, split_k);
  * Marlin (`--impl marlin`): thread tile (thread_k, thread_n) and blocks per SM (`marlin_moe.LAUNCH`).

Prints one JSON row a setting; writes them all with the floor (the routed experts' bytes at copy bandwidth).

    python3 bench/sweep_moe_launch.py --impl oai --json out.json [--tokens 16,64]"""

from __future__ import annotations

import argparse
import itertools
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

import dsv4hal
from dsv4hal.bench.common import bound_op
from dsv4hal.bench.timing import copy_bandwidth, graph_us
from dsv4hal.conformance.cases_moe import _expert_weights, _experts_params
from dsv4hal.reference.moe import expert_nbytes

IMPLS = {"oai": "triton_kernels_mxfp4_sm90", "marlin": "marlin_mxfp4_sm90"}
TOKENS = {"oai": "16,64", "marlin": "1,8"}


def oai_settings() -> list[dict[str, object]]:
    out: list[dict[str, object]] = [{}]
    for stages in (None, 3, 4, 5, 6):
        out.append({"is_persistent": False, **({"num_stages": stages} if stages else {})})
    out += [{"is_persistent": True}, {"is_persistent": False, "block_k": 256}, {"is_persistent": False, "split_k": 2}]
    return out


def marlin_settings() -> list[dict[str, object]]:
    tiles = ((-1, -1), (128, 128), (64, 256), (128, 64), (64, 128))
    return [{"thread_k": k, "thread_n": n, "blocks_per_sm": b} for (k, n), b in itertools.product(tiles, (-1, 1, 2, 4))]


@contextmanager
def oai_applied(setting: dict[str, object]) -> Iterator[None]:
    from triton_kernels.matmul_ogs_details import opt_flags

    opt_flags.reset_opt_flags_constraints()
    opt_flags.update_opt_flags_constraints(dict(setting))
    try:
        yield
    finally:
        opt_flags.reset_opt_flags_constraints()


@contextmanager
def marlin_applied(setting: dict[str, object]) -> Iterator[None]:
    from dsv4hal_cuda_sm90 import marlin_moe

    old = marlin_moe.LAUNCH
    marlin_moe.LAUNCH = (setting.get("thread_k", -1), setting.get("thread_n", -1), setting.get("blocks_per_sm", -1))
    try:
        yield
    finally:
        marlin_moe.LAUNCH = old


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--impl", choices=sorted(IMPLS), required=True)
    ap.add_argument("--json", required=True)
    ap.add_argument("--tokens", help="comma-separated token counts (default: 16,64 for oai, 1,8 for marlin)")
    a = ap.parse_args()
    settings = oai_settings() if a.impl == "oai" else marlin_settings()
    applied: Callable[[dict[str, object]], object] = oai_applied if a.impl == "oai" else marlin_applied
    platform = dsv4hal.select_platform()
    gen = torch.Generator(device="cuda").manual_seed(0)
    p = _experts_params("flash", 64, "mxfp4")
    e, h, i, k = p["E"], p["H"], p["I"], p["top_k"]
    weights = _expert_weights(p, torch.device("cuda"), gen)
    op = bound_op(platform, "moe_experts", IMPLS[a.impl])
    tokens = [int(x) for x in (a.tokens or TOKENS[a.impl]).split(",")]
    prepared = op.prepare_weights(weights, tokens=tokens[0])
    copy = copy_bandwidth(1 << 30)
    res: dict[str, object] = {"impl": IMPLS[a.impl], "copy_bytes_per_s": copy, "rows": []}
    for t in tokens:
        x = torch.randn(t, h, device="cuda", generator=gen).to(torch.bfloat16)
        ids = torch.rand(t, e, device="cuda", generator=gen).argsort(1)[:, :k].to(torch.int32)
        tw = torch.rand(t, k, device="cuda", generator=gen) + 0.5
        floor_us = int(torch.unique(ids).numel()) * expert_nbytes("mxfp4", h, i) / copy * 1e6
        want = None
        for setting in settings:
            row: dict[str, object] = {"T": t, "setting": setting, "floor_us": floor_us}
            try:
                with applied(setting):
                    got = op(x, ids, tw, prepared)
                    torch.cuda.synchronize()
                    want = got if want is None else want
                    row["max_abs_vs_default"] = float((got.float() - want.float()).abs().max())
                    row["us"] = graph_us(lambda a=(x, ids, tw): op(*a, prepared), inner=5, reps=15)
                row["x_floor"] = row["us"] / floor_us
            except Exception as exc:  # noqa: BLE001  (a setting the library refuses: recorded)
                torch.cuda.synchronize()
                row["error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
            print(json.dumps(row), flush=True)
            res["rows"].append(row)  # type: ignore[union-attr]
    with open(a.json, "w") as f:
        json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
