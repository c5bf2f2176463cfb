"""A decode step as an engine runs it, inside `platform.decode_step()`: pack-store the new tokens' keys (SWA and,
when a group closes, the compressed cache), then sparse attention, for compress ratios 0, 4 and 128. On a GPU the
step is captured once in a CUDA graph and replayed for later steps with the new metadata written in place; every
step is checked against the same ops run eagerly and against the float64 oracle over the exact dequantized keys
(computed from the unquantized inputs). All cache bytes, history included, are written by the platform's
pack_store, so on a GPU this is also the cross-check of the attention kernel (FlashMLA) reading caches that
dsv4hal's pack store wrote."""

from __future__ import annotations

from typing import Any

import torch

from dsv4hal.conformance.cases_sparse_attention import GRAPH_TOLERANCE, SCALE, TOLERANCES, oracle
from dsv4hal.conformance.cells import Cell, clone_args, copy_into
from dsv4hal.conformance.types import compare_close
from dsv4hal.formats.v4_cache import PAGE_SIZE_BY_RATIO, V4PagedCache, exact_dequant

CONTEXTS = (100, 300, 519, 1030)  # tokens already in each request; crosses SWA pages and compress groups
STEPS = 4
RATIOS = (0, 4, 128)


def case_name(ratio: int) -> str:
    return f"ratio{ratio}/{len(CONTEXTS)} requests x {STEPS} steps"
H_Q = 64
TOPK = 512


class _Requests:
    """Slots, unquantized keys and per-step metadata of a small decode batch."""

    def __init__(self, ratio: int, device: torch.device, gen: torch.Generator, writer: Any) -> None:
        self.ratio, self.dev, self.gen, self.writer = ratio, device, gen, writer
        self.b = len(CONTEXTS)
        span = max(CONTEXTS) + STEPS + 1
        self.swa_slot = torch.randperm(self.b * span + 7, generator=gen)[: self.b * span].view(self.b, span) + 1
        self.swa_keys = torch.zeros(self.b * span + 8, 512, dtype=torch.bfloat16)
        self.swa = V4PagedCache.empty(-(-(self.b * span + 8) // 256), 256, "e4m3fn", device)
        self.x = None
        if ratio:
            n = span // ratio + 1
            self.x_slot = torch.randperm(self.b * n + 5, generator=gen)[: self.b * n].view(self.b, n) + 1
            self.x_keys = torch.zeros(self.b * n + 6, 512, dtype=torch.bfloat16)
            page = PAGE_SIZE_BY_RATIO[ratio]
            self.x = V4PagedCache.empty(-(-(self.b * n + 6) // page), page, "e4m3fn", device)
        for r, ctx in enumerate(CONTEXTS):  # history, written by the platform's pack_store
            pos = torch.arange(max(0, ctx - 128), ctx)
            self._write(self.swa, self.swa_keys, self.swa_slot[r, pos])
            if ratio:
                self._write(self.x, self.x_keys, self.x_slot[r, : ctx // ratio])

    def _write(self, cache: V4PagedCache, table: torch.Tensor, slots: torch.Tensor) -> None:
        keys = torch.randn(len(slots), 512, generator=self.gen).bfloat16()
        table[slots] = keys
        self.writer(keys.to(self.dev), slots.to(self.dev), cache)

    def step_inputs(self, step: int) -> dict[str, Any]:
        """Inputs of decode step `step`: the new token of each request sits at position ctx + step."""
        pos = torch.tensor([c + step for c in CONTEXTS])
        k_new = torch.randn(self.b, 512, generator=self.gen).bfloat16()
        loc = self.swa_slot[torch.arange(self.b), pos]
        self.swa_keys[loc] = k_new
        back = pos[:, None] - torch.arange(128)[None, :]
        swa_idx = torch.where(back >= 0, self.swa_slot.gather(1, back.clamp(min=0)), -1).int()
        inp: dict[str, Any] = dict(k_new=k_new, loc=loc, q=torch.randn(self.b, H_Q, 512, generator=self.gen).bfloat16(),
                                   sink=torch.randn(H_Q, generator=self.gen), swa_indices=swa_idx,
                                   swa_lengths=(pos + 1).clamp(max=128).int())
        if self.ratio:
            r = self.ratio
            closes = (pos + 1) % r == 0
            x_new = torch.randn(self.b, 512, generator=self.gen).bfloat16()
            x_loc = torch.where(closes, self.x_slot[torch.arange(self.b), (pos + 1) // r - 1], -1)
            self.x_keys[x_loc[closes]] = x_new[closes]
            n = (pos + 1) // r
            width = TOPK if r == 4 else -(-int(self.x_slot.shape[1]) // 64) * 64
            idx = torch.full((self.b, width), -1, dtype=torch.int32)
            for i in range(self.b):
                m = int(n[i])
                sel = torch.arange(m) if m <= width else torch.randperm(m, generator=self.gen)[:width]
                idx[i, : len(sel)] = self.x_slot[i, sel].int()
            inp.update(x_new=x_new, x_loc=x_loc, extra_indices=idx, extra_lengths=n.clamp(min=1, max=width).int())
        return {k: v.to(self.dev) for k, v in inp.items()}

    def expected(self, inp: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        swa_exact = exact_dequant(self.swa_keys, "e4m3fn").bfloat16()
        sets = []
        for i in range(self.b):
            s = inp["swa_indices"][i, : int(inp["swa_lengths"][i])].cpu()
            keys = swa_exact[s[s >= 0].long()]
            if self.ratio:
                x_exact = exact_dequant(self.x_keys, "e4m3fn").bfloat16()
                x = inp["extra_indices"][i, : int(inp["extra_lengths"][i])].cpu()
                keys = torch.cat([keys, x_exact[x[x >= 0].long()]])
            sets.append(keys)
        return oracle(inp["q"], inp["sink"], sets)


def _step(platform: Any, caches: tuple[V4PagedCache, V4PagedCache | None], inp: dict[str, Any]) -> Any:
    """One step inside a declared decode step, as an engine runs it (FlashMLA's plan is then shared by a step's
    calls, and on SM90 made by dsv4hal's own planner: these cells check it against the oracle, eager and replayed)."""
    swa, x = caches
    with platform.decode_step():
        platform.ops.pack_store(inp["k_new"], inp["loc"], swa)
        extra = {}
        if x is not None:
            platform.ops.pack_store(inp["x_new"], inp["x_loc"], x)
            extra = dict(extra_cache=x, extra_indices=inp["extra_indices"], extra_lengths=inp["extra_lengths"])
        return platform.ops.sparse_attention_decode(inp["q"], swa, inp["swa_indices"], inp["swa_lengths"],
                                                    inp["sink"], SCALE, **extra)


def decode_step_cells(platform: Any, seed: int = 0, ratios: tuple[int, ...] = RATIOS) -> list[Cell]:
    dev = torch.device(platform.device_type)
    graphs = dev.type == "cuda"
    impl = f"{platform.explain('pack_store').chosen.name} + {platform.explain('sparse_attention_decode').chosen.name}"
    cells = []
    for ratio in ratios:
        reqs = _Requests(ratio, dev, torch.Generator().manual_seed(seed + ratio), platform.ops.pack_store)
        eager_caches = (reqs.swa, reqs.x)
        graph_caches = clone_args(eager_caches)
        worst = {"eager": 0.0, "graph": 0.0}
        ok = {"eager": True, "graph": True}
        detail: list[str] = []
        static, graph, out_static = None, None, None
        for step in range(STEPS):
            inp = reqs.step_inputs(step)
            expected = reqs.expected(inp)
            out_eager = _step(platform, eager_caches, inp)
            err, good, d = compare_close(out_eager, expected, TOLERANCES["sparse_attention_decode"])
            worst["eager"], ok["eager"] = max(worst["eager"], err), ok["eager"] and good
            if not good:
                detail.append(f"eager step {step}: {d}")
            if not graphs:
                continue
            if graph is None:  # capture once, on step 0's buffers
                from dsv4hal.cuda_graphs import capture

                static = clone_args(inp)
                # the warm-up writes the same bytes the replay writes
                graph, out_static = capture(lambda s=static, c=graph_caches: _step(platform, c, s))
            copy_into(static, inp)  # new metadata and tokens written in place
            graph.replay()
            torch.cuda.synchronize()
            err, good, d = compare_close(out_static, expected, GRAPH_TOLERANCE)
            same, g2, d2 = compare_close(out_static, out_eager, TOLERANCES["sparse_attention_decode"])
            worst["graph"], ok["graph"] = max(worst["graph"], err, same), ok["graph"] and good and g2
            if not (good and g2):
                detail.append(f"graph step {step}: {d or d2}")
        for mode in ("eager", "graph"):
            cell = Cell("decode_step", impl, case_name(ratio), mode, ratio,
                        platform.name, "pass" if ok[mode] else "fail", worst[mode],
                        tolerance={"atol": GRAPH_TOLERANCE.atol if mode == "graph" else 2e-2,
                                   "reason": "graph replay against eager and the oracle" if mode == "graph"
                                   else TOLERANCES["sparse_attention_decode"].reason},
                        detail="; ".join(detail)[:400])
            if mode == "graph" and not graphs:
                cell.status, cell.max_error, cell.detail = "not-run", None, "CUDA graphs need a GPU"
            cells.append(cell)
    return cells
