"""FlashMLA's SM90 sparse kernels for the V4 cache format, behind dsv4hal's attention contracts.

Accepts sgl-flash-mla (`flash_mla`, legacy SM90 half: use_legacy=True) or vLLM's bundled copy
(`vllm.third_party.flashmla.flash_mla_interface`, which has no use_legacy argument). Scheduler
metadata is planned per call unless the engine declares a decode step (dsv4hal.step), inside which
one plan per (compress ratio, shapes) is shared, as vLLM and SGLang share one per layer type.

Indices follow dsv4hal's one rule: FlashMLA skips -1 and reads any other negative as a slot (-2 reads slot
0), so other negatives are invalid and checked mode refuses them in the contract, before this binding runs;
FlashMLA does no bounds checks, so unchecked mode must not be handed invalid indices."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from types import ModuleType
from typing import Any

import torch

from dsv4hal.formats.v4_cache import V4PagedCache
from dsv4hal.hardware import PlatformInfo
from dsv4hal.step import step_plans

PREFILL_TOPK_ALIGN = 128  # SM90 sparse prefill asserts topk % 128 == 0 for h64 and h128


@functools.cache
def _interface(flavour: str) -> tuple[ModuleType, dict[str, Any]]:
    if flavour == "sgl":
        import flash_mla
        import flash_mla.flash_mla_interface as iface

        if hasattr(flash_mla, "has_legacy") and not flash_mla.has_legacy():
            raise RuntimeError("sgl-flash-mla was loaded without its legacy library (_C_legacy), which holds the "
                               "V4-format kernels for SM90 and SM100")
        return iface, {"use_legacy": True}
    from vllm.third_party.flashmla import flash_mla_interface as iface  # type: ignore[import-not-found]

    return iface, {}


def decode_supports(case: Mapping[str, object], info: PlatformInfo) -> list[str]:
    reasons = []
    if case.get("fp8") != "e4m3fn":
        reasons.append(f"FlashMLA reads e4m3fn caches only (this cache is {case.get('fp8')}); convert it with "
                       "dsv4hal.formats.v4_cache.convert_cache or use triton")
    if case.get("h_q") not in (64, 128):
        reasons.append(f"FlashMLA SM90 decode needs h_q 64 or 128, got {case.get('h_q')}")
    return reasons


def prefill_supports(case: Mapping[str, object], info: PlatformInfo) -> list[str]:
    reasons = []
    if case.get("h_q") not in (64, 128):
        reasons.append(f"FlashMLA SM90 prefill needs h_q 64 or 128, got {case.get('h_q')}")
    width = int(case.get("width", 0))  # type: ignore[arg-type]
    if width % PREFILL_TOPK_ALIGN:
        reasons.append(f"FlashMLA SM90 sparse prefill needs an index width that is a multiple of "
                       f"{PREFILL_TOPK_ALIGN}, got {width}: pad the indices with -1")
    return reasons


def _plan(iface: ModuleType, key: tuple) -> Any:
    plans = step_plans()
    if plans is None:
        return iface.get_mla_metadata()[0]
    meta = plans.get(key)
    if meta is None:
        meta = plans[key] = iface.get_mla_metadata()[0]
    return meta


def _decode(flavour: str, q: torch.Tensor, swa_cache: V4PagedCache, swa_indices: torch.Tensor,
            swa_lengths: torch.Tensor, sink: torch.Tensor, softmax_scale: float,
            extra_cache: V4PagedCache | None = None, extra_indices: torch.Tensor | None = None,
            extra_lengths: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    iface, extra_kw = _interface(flavour)
    key = ("decode", q.shape, swa_indices.shape, swa_cache.page_size,
           None if extra_cache is None else (extra_cache.page_size, extra_indices.shape))
    x = {}
    if extra_cache is not None:
        x = dict(extra_k_cache=extra_cache.flashmla_view(), extra_indices_in_kvcache=extra_indices.unsqueeze(1),
                 extra_topk_length=extra_lengths)
    out, lse = iface.flash_mla_with_kvcache(
        q.unsqueeze(1), swa_cache.flashmla_view(), None, None, head_dim_v=512,
        tile_scheduler_metadata=_plan(iface, key), num_splits=None, softmax_scale=softmax_scale, causal=False,
        is_fp8_kvcache=True, indices=swa_indices.unsqueeze(1), attn_sink=sink, topk_length=swa_lengths,
        **x, **extra_kw)
    return out.squeeze(1), lse.squeeze(2)


def _prefill(flavour: str, q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor, lengths: torch.Tensor,
             sink: torch.Tensor, softmax_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    iface, extra_kw = _interface(flavour)
    res = iface.flash_mla_sparse_fwd(q, kv.unsqueeze(1), indices.unsqueeze(1), softmax_scale, d_v=512,
                                     attn_sink=sink, topk_length=lengths, **extra_kw)
    return res[0], res[2]


def sparse_attention_decode_sgl(*args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
    return _decode("sgl", *args, **kwargs)


def sparse_attention_prefill_sgl(*args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
    return _prefill("sgl", *args, **kwargs)


def sparse_attention_decode_vllm(*args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
    return _decode("vllm", *args, **kwargs)


def sparse_attention_prefill_vllm(*args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
    return _prefill("vllm", *args, **kwargs)
