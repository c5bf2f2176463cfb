"""The demo model over a tensor-parallel group: every rank draws the whole model from the same seed (so the layers
are the single-rank model's), then keeps heads / N of each attention's query heads (wq_b's rows and the sinks,
padded with zero heads to the count the attention kernel runs: dsv4hal.distributed.tp.attention_heads) and the
output projection's matching groups (wo_a's groups, wo_b's input columns). The projection's partial sums are
all-reduced (Platform.tensor_parallel: the backend chosen like a kernel). The single KV head, the indexer, the
compressors and the MoE are replicated: every rank runs them on every token."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from dsv4hal.distributed.tp import attention_heads, pad_heads
from dsv4hal.engine_model.config import D_HEAD, DemoConfig
from dsv4hal.engine_model.model import DemoModel, _linear_f32
from dsv4hal.engine_model.timers import OpTimer
from dsv4hal.errors import InvalidArgumentError


class TPDemoModel(DemoModel):
    """DemoModel whose attention runs tensor-parallel over `group` (a torch.distributed ProcessGroup)."""

    def __init__(self, platform: Any, cfg: DemoConfig, batch: int, group: Any, seed: int = 0,
                 tokens_per_request: int = 1, reduce_dtype: str = "fp32") -> None:
        """reduce_dtype: "fp32" (partial sums rounded to bf16 once, after the sum) or "bf16" (rounded on each rank
        before it, as engines reduce to halve the bytes)."""
        import torch.distributed as dist

        world, rank = dist.get_world_size(group), dist.get_rank(group)
        if cfg.heads % world or cfg.o_groups % world:
            raise InvalidArgumentError("TPDemoModel", "group", f"a size dividing the {cfg.heads} heads and the "
                                       f"{cfg.o_groups} output groups", f"size {world}")
        # bf16 projections: a rank keeps row and column shares of wq_b and wo_b
        super().__init__(platform, replace(cfg, fp8_linears=False), batch, seed,
                         tokens_per_request=tokens_per_request)
        self.heads = attention_heads(platform, cfg.heads // world)
        h, g = self.heads.heads, cfg.o_groups // world
        self.q_heads, self.q_heads_padded, self.o_groups = h, self.heads.padded, g
        self.reduce_dtype = torch.float32 if reduce_dtype == "fp32" else torch.bfloat16
        for w in self.layers:  # this rank's share; the whole tensors are released
            w["wq_b"] = w["wq_b"][rank * h * D_HEAD:(rank + 1) * h * D_HEAD].contiguous()
            w["sink"] = pad_heads(w["sink"][rank * h:(rank + 1) * h], self.heads.padded, 0).contiguous()
            w["wo_a"] = w["wo_a"][rank * g:(rank + 1) * g].contiguous()
            w["wo_b"] = w["wo_b"][:, rank * g * cfg.o_lora:(rank + 1) * g * cfg.o_lora].contiguous()
        self.tp = platform.tensor_parallel(group, hidden=cfg.hidden, dtype=reduce_dtype, check_calls=False,
                                           device=self.dev)

    def _output(self, o: torch.Tensor, w: dict, timer: OpTimer) -> torch.Tensor:
        """This rank's partial sum of the output projection, all-reduced over the group."""
        part = o @ w["wo_b"].T if self.reduce_dtype == torch.bfloat16 else _linear_f32(o, w["wo_b"])
        with timer("tp_all_reduce"):
            return self.tp.all_reduce(part.to(self.reduce_dtype).contiguous()).bfloat16()
