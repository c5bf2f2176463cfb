"""The demo model over an expert-parallel group: every rank holds the weights of its own experts (E / N of each
layer's, drawn from the same seed as the single-rank model's, so the layers are the same), and each MoE layer
dispatches its tokens to the experts' ranks, runs moe_experts on what it received and combines the outputs back
(Platform.expert_parallel: the backend chosen like a kernel). Attention runs on each rank's own requests (data
parallel), as expert-parallel deployments of DeepSeek-V4 run it."""

from __future__ import annotations

from typing import Any

import torch

from dsv4hal.distributed.experts import local_expert_weights
from dsv4hal.engine_model.config import DemoConfig
from dsv4hal.engine_model.model import DemoModel
from dsv4hal.engine_model.timers import OpTimer


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


class EPDemoModel(DemoModel):
    """DemoModel whose MoE layers run expert-parallel over `group` (a torch.distributed ProcessGroup). Prefill
    dispatches in normal mode (exact sizes); decode steps in decode mode (worst-case buffers of
    max_tokens_per_rank = the step's tokens rounded up to a power of two, no host sync)."""

    def __init__(self, platform: Any, cfg: DemoConfig, batch: int, group: Any, seed: int = 0,
                 tokens_per_request: int = 1, check: bool = False) -> None:
        """check: also keep every layer's whole expert set and record, for each MoE call, the expert-parallel output
        beside the single-rank moe_experts output on the same tokens, routes and weights (`checked`)."""
        kw = dict(num_experts=cfg.experts, hidden=cfg.hidden, top_k=cfg.top_k)
        self.check, self._whole, self.checked = check, [], []  # checked: (expert-parallel, single-rank) outputs
        self.ep_prefill = platform.expert_parallel(group, **kw)
        self.ep_decode = platform.expert_parallel(
            group, max_tokens_per_rank=_pow2_at_least(batch * tokens_per_request), **kw)
        super().__init__(platform, cfg, batch, seed, tokens_per_request=tokens_per_request)
        for w, whole in zip(self.layers, self._whole):
            w["experts_whole"] = whole

    def _experts(self, randn: Any) -> Any:
        """This rank's experts: the whole layer is drawn (the random stream stays the single-rank model's), then
        the rank's physical slots are kept."""
        whole = super()._experts(randn)
        if self.check:
            self._whole.append(self.ops.moe_experts.prepare_weights(whole, tokens=self.b * self.tpr))
        return local_expert_weights(whole, self.ep_prefill.local_experts())

    def _moe(self, w: dict, a: torch.Tensor, ids: torch.Tensor, tw: torch.Tensor, timer: OpTimer,
             decode: bool) -> torch.Tensor:
        ep = self.ep_decode if decode else self.ep_prefill
        with timer("ep_dispatch"):
            d = ep.dispatch(a, ids, tw, layout="standard", decode=decode)
        with timer("moe_experts"):
            y = self.ops.moe_experts(d.dequantized(), d.topk_ids, d.topk_weights, w["experts"])
        with timer("ep_combine"):
            out = ep.combine(y, d.handle)
        if self.check:  # outside the timers
            self.checked.append((out, self.ops.moe_experts(a, ids, tw, w["experts_whole"])))
        return out

    def backends(self) -> dict[str, str]:
        """The expert-parallel backend of the prefill (normal mode) and of the decode steps (decode mode)."""
        dev = self.dev.type
        return {"prefill": self.ep_prefill.decide(decode=False, layout="standard", device=dev).chosen.name,
                "decode": self.ep_decode.decide(decode=True, layout="standard", device=dev).chosen.name}
