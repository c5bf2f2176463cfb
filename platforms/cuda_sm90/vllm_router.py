"""DSV4 routing through vLLM 0.24's `torch.ops._moe_C.topk_softplus_sqrt` (docs/vendor-apis.md 3.3), behind
dsv4hal's moe_route contract: sqrt(softplus) scores, selection on score + bias (or the hash table), weights
from the unbiased scores, renormalised, times routed_scaling_factor."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from dsv4hal_cuda_sm90 import vllm_moe_lib as lib

if TYPE_CHECKING:
    import torch

    from dsv4hal.hardware import PlatformInfo

OP_NAME = "topk_softplus_sqrt"
NAME = "vllm_topk_softplus_sqrt"
# expert counts the kernel instantiates
SUPPORTED_E = frozenset({1 << i for i in range(10)} | {192, 320, 384, 448, 576})


def supports(case: Mapping[str, object], info: PlatformInfo) -> list[str]:
    reasons = []
    if case.get("E") not in SUPPORTED_E:
        reasons.append(f"topk_softplus_sqrt is built for E in {sorted(SUPPORTED_E)}, not {case.get('E')}")
    return reasons + lib.availability_reasons(info, OP_NAME)


def moe_route(router_logits: torch.Tensor, bias: torch.Tensor | None = None, top_k: int = 6,
              routed_scaling_factor: float = 1.5, hash_table: torch.Tensor | None = None,
              input_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    import torch

    t = router_logits.shape[0]
    dev = router_logits.device
    weights = torch.empty(t, top_k, dtype=torch.float32, device=dev)
    ids = torch.empty(t, top_k, dtype=torch.int32, device=dev)
    token_expert = torch.empty(t, top_k, dtype=torch.int32, device=dev)
    if t == 0:
        return ids, weights
    # the kernel wants input_ids and tid2eid in the index dtype (int32 here)
    tid2eid = None if hash_table is None else hash_table.to(torch.int32).contiguous()
    tokens = None if input_ids is None else input_ids.to(torch.int32).contiguous()
    lib.moe_op(OP_NAME, NAME)(weights, ids, token_expert, router_logits.contiguous(), True,
                              float(routed_scaling_factor), bias, tokens, tid2eid)
    return ids, weights
