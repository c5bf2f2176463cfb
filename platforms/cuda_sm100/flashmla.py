"""FlashMLA's SM100 sparse kernels for the V4 cache format, behind dsv4hal's attention contracts.

The Python entry points are the same `flash_mla.flash_mla_interface` functions as on Hopper, and for the
V4 (584-byte) format they take the same arguments: sgl-flash-mla 1.0.0 keeps V4 only in its legacy
library, which has sm_100/sm_103 code, so `use_legacy=True` is right on SM100 too (the non-legacy library
serves V4.1 only). The argument marshalling is therefore the one Hopper uses too, in a core module:
`dsv4hal.kernels.flashmla_glue.{decode,prefill}("sgl", ...)` (use_legacy=True, the lazily planned
FlashMLASchedMeta shared inside a declared decode step, lse returned as [T, h_q]).

What SM100 adds, and this module takes care of before delegating:
- decode asserts q.stride(0) % q.stride(1) == 0 for the [T, 1, h_q, 512] view: q is made contiguous
  when its row stride is not a multiple of h_q * head stride (a no-op for the usual contiguous q);
- decode asserts a 16-byte aligned cache base and k_cache.stride(0) % 576 == 0: V4PagedCache pages are
  padded to a multiple of 576 bytes, and a misaligned base is reported as a typed error before launch;
- prefill's index-width multiple depends on h_q and width (see dsv4hal_cuda_sm100.kernels)."""

from __future__ import annotations

import torch

from dsv4hal.errors import InvalidArgumentError
from dsv4hal.formats.v4_cache import RECORD_BYTES, V4PagedCache
from dsv4hal.kernels import flashmla_glue

USE_LEGACY = True  # V4 (584 B) is served by sgl-flash-mla's legacy library on SM100 as on SM90
CACHE_BASE_ALIGN = 16  # bytes; FlashMLA SM100 TMA descriptors
DECODE = "sparse_attention_decode"


def _decode_q(q: torch.Tensor) -> torch.Tensor:
    """q [T, h, 512] such that its [T, 1, h, 512] view has stride(0) divisible by stride(1)."""
    st = q.stride()  # read once: a host call per read
    seq_stride = q.shape[1] * st[1]  # stride(1) of q.unsqueeze(1)
    if st[-1] != 1 or seq_stride == 0 or st[0] % seq_stride:
        return q.contiguous()
    return q


def _check_cache(cache: V4PagedCache, name: str) -> None:
    # the usual case costs two reads (the view is built once per cache); _refuse_cache says which rule failed
    if cache.data.data_ptr() % CACHE_BASE_ALIGN or cache.flashmla_view().stride(0) % RECORD_BYTES:
        _refuse_cache(cache, name)


def _refuse_cache(cache: V4PagedCache, name: str) -> None:
    ptr = cache.data.data_ptr()
    if ptr % CACHE_BASE_ALIGN:
        raise InvalidArgumentError(DECODE, name, f"a cache whose base address is {CACHE_BASE_ALIGN}-byte aligned "
                                   "(FlashMLA SM100)", f"base address {ptr:#x}",
                                   remedy="allocate the pool with V4PagedCache.empty or slice it at page boundaries")
    stride = cache.flashmla_view().stride(0)
    if stride % RECORD_BYTES:  # cannot happen for a validated V4PagedCache; kept as the kernel's own rule
        raise InvalidArgumentError(DECODE, name, f"a page stride that is a multiple of {RECORD_BYTES} bytes",
                                   f"page stride {stride}")


def sparse_attention_decode(q: torch.Tensor, swa_cache: V4PagedCache, swa_indices: torch.Tensor,
                            swa_lengths: torch.Tensor, sink: torch.Tensor, softmax_scale: float,
                            extra_cache: V4PagedCache | None = None, extra_indices: torch.Tensor | None = None,
                            extra_lengths: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    _check_cache(swa_cache, "swa_cache")
    if extra_cache is not None:
        _check_cache(extra_cache, "extra_cache")
    return flashmla_glue.decode_sgl(_decode_q(q), swa_cache, swa_indices, swa_lengths, sink, softmax_scale,
                                    extra_cache, extra_indices, extra_lengths)


def sparse_attention_prefill(q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor, lengths: torch.Tensor,
                             sink: torch.Tensor, softmax_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    return flashmla_glue.prefill("sgl", q, kv, indices, lengths, sink, softmax_scale)
