"""Compressor benchmark (V4-Flash layers): compress_decode at the demo's shape (batch 64 at 32K context) against
its bandwidth floor, and the prefill form over 32K tokens as a fraction of copy bandwidth.

Decode configurations: the C4 main compressor (hd 512), the C4 layer's indexer compressor (hd 128, Hadamard) and
the C128 main compressor (hd 512); each at a step where every row closes a group (the most work: the window is
read) and at one where none does (only the ring write). The floor counts bytes as the demo does
(`dsv4hal.demo.floor_bytes`): kv_score in, each row's whole ring, the output. Decode calls are timed as CUDA
graphs. The prefill form reads its row count on the host (one sync) unless the caller passes it (num_groups):
the bound op is timed eagerly without it, and as a graph with it (an engine's call: it knows the count), and the
Triton kernel alone (after planning) as a graph."""

from __future__ import annotations

from typing import Any

import torch

from dsv4hal.bench.common import bound_op, candidates
from dsv4hal.bench.timing import eager_us, graph_us
from dsv4hal.conformance.cases_compress import COMPRESS_ROPE_BASE
from dsv4hal.reference.compress import new_state
from dsv4hal.reference.rope import DSV4_YARN, make_rope_table

BATCH = 64
CONTEXT = 32768
PREFILL_TOKENS = 32768
CONFIGS = (("c4_main", 4, 512, False), ("c4_indexer", 4, 128, True), ("c128_main", 128, 512, False))
DECODE_GOAL = 3.0  # at most 3x the floor
PREFILL_GOAL = 0.6  # at least 0.6 of copy bandwidth


def _layer(ratio: int, hd: int, n: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
    coff = 2 if ratio == 4 else 1
    ks = torch.randn(n, 2 * coff * hd, device="cuda", generator=gen)
    return {"kv_score": ks, "ape": 0.5 * torch.randn(ratio, coff * hd, device="cuda", generator=gen),
            "norm_weight": 1.0 + 0.1 * torch.randn(hd, device="cuda", generator=gen)}


def _decode(platform: Any, copy_bw: float, rope: dict[str, torch.Tensor], gen: torch.Generator,
            reps: int) -> list[dict[str, Any]]:
    names = candidates(platform, "compress_decode", with_reference=True)
    rows = []
    for name, ratio, hd, hadamard in CONFIGS:
        layer = _layer(ratio, hd, BATCH, gen)
        width = layer["kv_score"].shape[1]
        state = new_state(BATCH, ratio, width, device="cuda")
        state.normal_(generator=gen)  # every ring full, as mid-decode
        slots = torch.arange(BATCH, dtype=torch.int32, device="cuda")
        out_bytes = BATCH * hd * 4
        floor_bytes = out_bytes + BATCH * width * 4 + BATCH * state.shape[1] * width * 4
        floor_us = floor_bytes / copy_bw * 1e6
        for step, pos in (("closing", CONTEXT - 1), ("open", CONTEXT)):
            positions = torch.full((BATCH,), pos, dtype=torch.int32, device="cuda")
            args = {**layer, **rope, "state": state, "slots": slots, "positions": positions, "ratio": ratio,
                    "hadamard": hadamard}
            bound = platform.ops.compress_decode
            row: dict[str, Any] = {"config": name, "ratio": ratio, "hd": hd, "hadamard": hadamard, "B": BATCH,
                                   "position": pos, "step": step, "floor_us": floor_us, "us": {}, "over_floor": {},
                                   "chosen": bound.decide(bound.case_of(**args)).chosen.name}
            for impl in names:
                op = bound_op(platform, "compress_decode", impl)
                us = graph_us(lambda op=op, args=args: op(**args), reps=reps)
                row["us"][impl], row["over_floor"][impl] = us, us / floor_us
            rows.append(row)
            print(f"compress_decode {name} B={BATCH} {step}: floor {floor_us:.2f}us, " + ", ".join(
                f"{i} {u:.1f}us ({row['over_floor'][i]:.1f}x)" for i, u in row["us"].items()), flush=True)
    return rows


def _prefill(platform: Any, copy_bw: float, rope: dict[str, torch.Tensor], gen: torch.Generator,
             reps: int) -> list[dict[str, Any]]:
    names = candidates(platform, "compress", with_reference=True)
    cu = torch.tensor([0, PREFILL_TOKENS], dtype=torch.int32, device="cuda")
    rows = []
    for name, ratio, hd, hadamard in CONFIGS:
        layer = _layer(ratio, hd, PREFILL_TOKENS, gen)
        moved = layer["kv_score"].numel() * 4 + PREFILL_TOKENS // ratio * hd * 4  # rows in, compressed rows out
        args = {**layer, **rope, "cu_seqlens": cu, "ratio": ratio, "hadamard": hadamard}
        bound = platform.ops.compress
        row: dict[str, Any] = {"config": name, "ratio": ratio, "hd": hd, "hadamard": hadamard,
                               "tokens": PREFILL_TOKENS, "bytes": moved, "op_us": {}, "fraction_of_copy": {},
                               "op_num_groups_graph_us": {}, "num_groups_fraction_of_copy": {},
                               "chosen": bound.decide(bound.case_of(**args)).chosen.name}
        for impl in names:
            op = bound_op(platform, "compress", impl)
            us = eager_us(lambda op=op, args=args: op(**args), reps=reps)
            row["op_us"][impl], row["fraction_of_copy"][impl] = us, moved / (us * 1e-6) / copy_bw
            if impl != "torch_reference":  # the reference computes positions with host-side ops: not graph-safe
                m = PREFILL_TOKENS // ratio
                us = graph_us(lambda op=op, args=args, m=m: op(**args, num_groups=m), reps=reps)
                row["op_num_groups_graph_us"][impl] = us
                row["num_groups_fraction_of_copy"][impl] = moved / (us * 1e-6) / copy_bw
        if "triton_compress" in names:
            from dsv4hal.kernels.triton.compress import compress_into

            out = torch.empty(PREFILL_TOKENS // ratio, hd, device="cuda")
            us = graph_us(lambda out=out, args=args: compress_into(out, **args), reps=reps)
            row["triton_kernel_us"] = us
            row["triton_kernel_fraction_of_copy"] = moved / (us * 1e-6) / copy_bw
        rows.append(row)
        kernel = (f", triton kernel alone {row['triton_kernel_us']:.1f}us "
                  f"({row['triton_kernel_fraction_of_copy']:.2f} of copy)" if "triton_kernel_us" in row else "")
        given = "".join(f", {i} given num_groups (graph) {u:.1f}us ({row['num_groups_fraction_of_copy'][i]:.2f} "
                        "of copy)" for i, u in row["op_num_groups_graph_us"].items())
        print(f"compress {name} N={PREFILL_TOKENS}: " + ", ".join(
            f"{i} {u:.1f}us ({row['fraction_of_copy'][i]:.2f} of copy)" for i, u in row["op_us"].items()) + given
            + kernel, flush=True)
    return rows


def run(platform: Any, ceilings: dict[str, float], quick: bool = False) -> dict[str, Any]:
    copy_bw = ceilings["copy_bytes_per_s"]
    gen = torch.Generator(device="cuda").manual_seed(3)
    cos, sin = make_rope_table(CONTEXT + 256, COMPRESS_ROPE_BASE, DSV4_YARN, device="cuda")
    rope = {"cos": cos, "sin": sin}
    reps = 5 if quick else 25
    decode = _decode(platform, copy_bw, rope, gen, reps)
    prefill = _prefill(platform, copy_bw, rope, gen, 3 if quick else 10)
    worst = max((r["over_floor"][r["chosen"]] for r in decode if r["step"] == "closing"), default=float("nan"))
    # the prefill goal is the bound op's bandwidth as an engine calls it: with num_groups, captured (without it the
    # op adds a host sync for its row count and runs eagerly: op_us)
    frac = min((r["num_groups_fraction_of_copy"].get(r["chosen"], r["fraction_of_copy"][r["chosen"]])
                for r in prefill), default=float("nan"))
    goals = {"decode_worst_over_floor": worst, "decode_goal_max": DECODE_GOAL, "decode_goal_met": worst <= DECODE_GOAL,
             "prefill_min_fraction_of_copy": frac, "prefill_goal_min": PREFILL_GOAL,
             "prefill_goal_met": frac >= PREFILL_GOAL}
    print(f"compress goals: decode worst {worst:.2f}x floor (goal <= {DECODE_GOAL}), prefill min {frac:.2f} of "
          f"copy (goal >= {PREFILL_GOAL})", flush=True)
    return {"decode": decode, "prefill": prefill, "goals": goals}
