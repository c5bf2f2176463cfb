"""FlashMLA's SM90 sparse kernels for the V4 cache format, behind dsv4hal's attention contracts: the
sgl-flash-mla (legacy SM90 half, use_legacy=True) and vLLM-bundled flavours of dsv4hal.kernels.flashmla_glue,
whose argument mapping and per-step planning both Hopper and Blackwell share.

The decode targets are the glue's per-flavour functions themselves, not wrappers around them: a bound call reaches
FlashMLA through one Python frame of glue (host time is what a decode step at small batch is made of)."""

from __future__ import annotations

from typing import Any

import torch

from dsv4hal.kernels import flashmla_glue

sparse_attention_decode_sgl = flashmla_glue.decode_sgl
sparse_attention_decode_vllm = flashmla_glue.decode_vllm


def sparse_attention_prefill_sgl(*args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
    return flashmla_glue.prefill("sgl", *args, **kwargs)


def sparse_attention_prefill_vllm(*args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
    return flashmla_glue.prefill("vllm", *args, **kwargs)
