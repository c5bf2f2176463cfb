"""`dsv4hal bench ep`: dispatch, experts and combine times per rank at V4-Flash shapes (hidden 4096, 256 experts,
top-6) for 1-256 tokens per rank, every backend that can run the group side by side. On one GPU the group is the
loop-back; on the CPU (no GPU) two gloo processes run a tiny shape, so the code path is exercised everywhere."""

from __future__ import annotations

import time
from typing import Any

import torch

FLASH = {"E": 256, "H": 4096, "I": 2048}
TINY = {"E": 16, "H": 128, "I": 64}
TOKENS, QUICK_TOKENS, TINY_TOKENS = (1, 8, 32, 64, 128, 256), (1, 64, 256), (1, 4)
REPEATS = 5


def _timed(fn: Any, sync: Any) -> tuple[Any, float]:
    sync()
    start = time.perf_counter()
    out = fn()
    sync()
    return out, (time.perf_counter() - start) * 1e6


def measure(rank: int, world: int, shape: dict[str, int], tokens: tuple[int, ...], device: str) -> list[dict]:
    """Median us of dispatch, experts and combine per backend and token count on this rank."""
    import dsv4hal
    from dsv4hal.distributed import ExpertParallel, local_expert_weights, run_local_experts
    from dsv4hal.distributed.backends import EP_OP
    from dsv4hal.formats.experts import quantize_experts

    e, h, i = shape["E"], shape["H"], shape["I"]
    platform = dsv4hal.select_platform() if device == "cuda" else dsv4hal.select_platform("cpu")
    group = torch.distributed.group.WORLD if world > 1 else None
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    g = torch.Generator().manual_seed(0)
    w = quantize_experts(torch.randn(e // world, 2 * i, h, generator=g) / h ** 0.5,
                         torch.randn(e // world, h, i, generator=g) / i ** 0.5, "fp8_block", "e4m3fn")
    rows = []
    probe = ExpertParallel(num_experts=e, hidden=h, group=group, max_tokens_per_rank=max(tokens), platform=platform)
    names = [c.name for c in platform.decide_collective(EP_OP, probe.case(False, "standard", device)).candidates
             if c.status != "rejected"]
    for backend in names:
        ep = ExpertParallel(num_experts=e, hidden=h, group=group, max_tokens_per_rank=max(tokens), platform=platform,
                            backend=backend)
        logical = ep.local_experts()
        mine = local_expert_weights(w, [x - ep.rank * ep.experts_per_rank for x in logical])
        prepared = platform.ops.moe_experts.prepare_weights(
            type(mine)(mine.format, *(getattr(mine, f).to(device) for f in ("w13", "w13_scale", "w2", "w2_scale")),
                       fp8=mine.fp8))
        for t in tokens:
            x = torch.randn(t, h, generator=g).to(torch.bfloat16).to(device)
            ids = torch.rand(t, e, generator=g).argsort(1)[:, :6].to(torch.int32).to(device)
            tw = torch.rand(t, 6, generator=g).to(device)
            times: dict[str, list[float]] = {"dispatch_us": [], "experts_us": [], "combine_us": []}
            for _ in range(REPEATS):
                d, a = _timed(lambda: ep.dispatch(x, ids, tw), sync)  # noqa: B023
                y, b = _timed(lambda: run_local_experts(platform, d, prepared), sync)  # noqa: B023
                _, c = _timed(lambda: ep.combine(y, d.handle), sync)  # noqa: B023
                for k, v in zip(times, (a, b, c)):
                    times[k].append(v)
            rows.append({"backend": backend, "world_size": world, "tokens_per_rank": t, "rank": rank,
                         **{k: sorted(v)[len(v) // 2] for k, v in times.items()}})
    return rows


def run(platform: Any, ceilings: dict[str, float], quick: bool = False) -> list[dict[str, Any]]:
    if torch.cuda.is_available():
        return measure(0, 1, FLASH, QUICK_TOKENS if quick else TOKENS, "cuda")
    from dsv4hal.distributed.spawn import ok_results, run_ranks

    per_rank = ok_results(run_ranks(measure, 2, TINY, TINY_TOKENS, "cpu", timeout_s=60, join_timeout_s=300))
    return [r for rows in per_rank for r in rows]
