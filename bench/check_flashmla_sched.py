"""On the H200: the SM90 sparse-decode plan of dsv4hal.kernels.flashmla_sched against the plan sgl-flash-mla 1.0.0's
decode op makes itself (its tile_scheduler_metadata columns 0-6 and num_splits, bit for bit), over batches, heads,
widths with and without extra keys, and lengths (none, random, zeros, mixed); the decode's output with either plan
(bit for bit); and the times side by side (CUDA graphs): the op planning itself, the op given a plan, the plan alone.

    python3 bench/check_flashmla_sched.py --json out/check-flashmla-sched.json
    python3 bench/check_flashmla_sched.py --json out/sweep-flashmla-sched.json --warps  # the plan's warps only
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import torch

import dsv4hal
from dsv4hal.bench.timing import graph_us
from dsv4hal.kernels import flashmla_glue
from dsv4hal.kernels import flashmla_sched as fs

BATCHES = (1, 3, 64, 133, 1000)
HEADS = (64, 128)
WIDTHS = ((128, 0), (128, 512), (512, 0), (64, 64), (2048, 0))
MODES = ("none", "random", "mixed")
TIMED = ((64, 64, 128, 0), (64, 64, 128, 512), (64, 64, 128, 256), (128, 128, 128, 512))


def _lengths(mode: str, b: int, width: int, rng: random.Random) -> torch.Tensor | None:
    if mode == "none":
        return None
    pick = {"random": lambda: rng.randint(0, width), "zeros": lambda: 0,
            "mixed": lambda: rng.choice([0, 1, 63, 64, 65, width, rng.randint(0, width)])}[mode]
    return torch.tensor([min(width, pick()) for _ in range(b)], dtype=torch.int32, device="cuda")


def _call(b: int, h: int, width: int, xwidth: int, mode: str, rng: random.Random, filled: bool = False) -> dict:
    """The op's arguments for one case (caches of 64 pages of 64 tokens; indices into them)."""
    platform = dsv4hal.select_platform()
    swa = dsv4hal.V4PagedCache.empty(64, 64, platform.info.fp8, "cuda")
    extra = dsv4hal.V4PagedCache.empty(64, 64, platform.info.fp8, "cuda") if xwidth else None
    if filled:  # real rows, so the outputs say something
        for cache in (swa, extra):
            if cache is not None:
                rows = torch.randn(64 * 64, 512, device="cuda").bfloat16()
                platform.ops.pack_store(rows, torch.arange(64 * 64, device="cuda"), cache)
    q = torch.randn(b, h, 512, device="cuda").bfloat16()
    return dict(q=q, swa=swa, ind=torch.randint(0, 64 * 64, (b, width), dtype=torch.int32, device="cuda"),
                lens=_lengths(mode, b, width, rng),
                extra=extra, xind=torch.randint(0, 64 * 64, (b, xwidth), dtype=torch.int32, device="cuda")
                if xwidth else None, xlens=_lengths(mode, b, xwidth, rng) if xwidth else None)


def _op(a: dict, md: torch.Tensor | None, splits: torch.Tensor | None) -> tuple:
    op = flashmla_glue.decode_op("sgl")
    return op(a["q"].unsqueeze(1), a["swa"].flashmla_view(), a["ind"].unsqueeze(1), a["lens"],
              torch.zeros(a["q"].shape[1], device="cuda"), md, splits,
              None if a["extra"] is None else a["extra"].flashmla_view(),
              None if a["xind"] is None else a["xind"].unsqueeze(1), a["xlens"], 512, 0.0625, None)


def _ours(a: dict) -> tuple[torch.Tensor, torch.Tensor] | None:
    """dsv4hal's plan (metadata, splits) without the clamped lengths it also returns."""
    made = fs.plan(a["q"], a["lens"], a["ind"].shape[-1], a["xlens"], 0 if a["xind"] is None else a["xind"].shape[-1])
    return None if made is None else made[:2]


def _warps_row(b: int, h: int, width: int, xwidth: int, rng: random.Random) -> dict:
    """One timed shape: the plan with 1, 2, 4 and 8 warps, each checked against the vendor's, timed."""
    a = _call(b, h, width, xwidth, "random", rng)
    _, _, md, splits = _op(a, None, None)
    parts = fs.parts_sm90(torch.cuda.get_device_properties(0).multi_processor_count, 1, h)
    row: dict = {"b": b, "h": h, "width": width, "extra_width": xwidth,
                 "default_warps": fs.plan_warps(fs.line_block(b, width, xwidth)),
                 "us": {}, "same_as_vendor": {}}
    for w in (1, 2, 4, 8):
        def run(w: int = w) -> tuple:
            return fs.make_plan(b, parts, a["lens"], width, a["xlens"], xwidth, a["q"].device, num_warps=w)
        got = run()
        row["same_as_vendor"][w] = bool(torch.equal(got[0][:, :7], md[:, :7]) and torch.equal(got[1], splits))
        row["us"][w] = graph_us(run)
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", type=Path, required=True)
    ap.add_argument("--warps", action="store_true", help="only the plan's warps, swept at the timed shapes")
    args = ap.parse_args()
    rng = random.Random(0)
    if args.warps:
        args.json.write_text(json.dumps({"device": torch.cuda.get_device_name(), "plan_warps": [
            _warps_row(*shape, rng) for shape in TIMED]},
                                        indent=1))
        return
    checked = mismatches = 0
    first_mismatches: list[dict] = []
    left_to_op: list[dict] = []
    for b in BATCHES:
        for h in HEADS:
            for width, xwidth in WIDTHS:
                for mode in MODES:
                    a = _call(b, h, width, xwidth, mode, rng)
                    _, _, md, splits = _op(a, None, None)
                    ours = _ours(a)
                    if ours is None:  # a line longer than one program holds: the op plans itself
                        left_to_op.append({"b": b, "h": h, "width": width, "extra_width": xwidth})
                        continue
                    same = (ours[0].shape == md.shape and torch.equal(ours[0][:, :7], md[:, :7])
                            and torch.equal(ours[1], splits))
                    checked += 1
                    if not same:
                        mismatches += 1
                        if len(first_mismatches) < 5:
                            first_mismatches.append({"b": b, "h": h, "width": width, "extra_width": xwidth,
                                                     "mode": mode, "vendor": md[:4].tolist(),
                                                     "ours": ours[0][:4].tolist()})
        print(f"b={b}: plans checked {checked}, mismatches {mismatches}", flush=True)
    outputs_equal = []
    timed = []
    for b, h, width, xwidth in TIMED:
        a = _call(b, h, width, xwidth, "random", rng, filled=True)
        md, splits = _ours(a)  # type: ignore[misc]
        o_vendor = _op(a, None, None)
        o_ours = _op(a, md, splits)
        outputs_equal.append(bool(torch.equal(o_vendor[0], o_ours[0]) and torch.equal(o_vendor[1], o_ours[1])))
        row = {"b": b, "h": h, "width": width, "extra_width": xwidth,
               "op_planning_itself_us": graph_us(lambda a=a: _op(a, None, None)),
               "op_given_plan_us": graph_us(lambda a=a, m=md, s=splits: _op(a, m, s)),
               "parallel_plan_us": graph_us(lambda a=a: _ours(a)),
               "parallel_plan_then_op_us": graph_us(lambda a=a: _op(a, *_ours(a)))}  # type: ignore[misc]
        timed.append(row)
        print(json.dumps(row), flush=True)
    res = {"device": torch.cuda.get_device_name(), "plans_checked": checked, "plan_mismatches": mismatches,
           "first_mismatches": first_mismatches, "left_to_the_op": left_to_op,
           "outputs_bitwise_equal": outputs_equal, "timed": timed}
    print("outputs bitwise equal", outputs_equal, flush=True)
    args.json.write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
