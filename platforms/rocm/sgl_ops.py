"""indexer_topk through sgl-kernel's HIP op `torch.ops.sgl_kernel.deepseek_v4_topk_transform_512`.

The op (sgl-project/sglang kernels/aot/csrc/elementwise/deepseek_v4_topk.cu, schema in
common_extension_rocm.cc) is

    deepseek_v4_topk_transform_512(Tensor scores, Tensor seq_lens, Tensor page_table, Tensor! page_indices,
                                   int page_size, Tensor!? raw_indices) -> ()

scores fp32 [B, S] with unit stride along S (any row stride); seq_lens int32 [B] contiguous; page_table
int32 [B, P] with unit stride along P; page_indices int32 [B, k] contiguous (k = its size(1), 1..1024; older
builds: exactly 512); page_size a positive power of two; raw_indices None or int32 [B, k] contiguous. One
block per row: n = seq_lens[b] <= k writes positions 0..n-1 then -1 (scores ignored); n > k writes the k
largest scores among [0, n) in no particular order. page_indices[b, i] = (page_table[b, raw >> log2(P)] <<
log2(P)) | (raw & (P - 1)), -1 where raw is -1. Nothing checks n <= S or that the page table covers n.

Raw-index output: `raw_indices` is optional. Given a buffer, the op also writes the row-relative compressed
positions it selected (before the page transform, -1 padding); SGLang asks for it where the positions
themselves are needed (sparse prefill rebasing, capture, HiSparse swap-in). dsv4hal's contract returns
both (raw, pages), so this binding always passes one; the cost is one extra int32 [B, k] write.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from dsv4hal.errors import InvalidArgumentError

OP = "indexer_topk"


@functools.cache
def _op() -> Any:
    import sgl_kernel  # noqa: F401  (loading the package registers torch.ops.sgl_kernel.*)

    return torch.ops.sgl_kernel.deepseek_v4_topk_transform_512


def topk_transform_args(scores: torch.Tensor, lengths: torch.Tensor, k: int, page_table: torch.Tensor,
                        page_size: int) -> tuple[tuple[Any, ...], torch.Tensor, torch.Tensor]:
    """The op's positional arguments for one call, and the (raw, pages) outputs it fills."""
    b = scores.shape[0]
    pages = torch.empty(b, k, dtype=torch.int32, device=scores.device)
    raw = torch.empty(b, k, dtype=torch.int32, device=scores.device)
    if page_table.stride(-1) != 1:
        page_table = page_table.contiguous()
    args = (scores, lengths.contiguous(), page_table, pages, int(page_size), raw)
    return args, raw, pages


def indexer_topk(scores: torch.Tensor, lengths: torch.Tensor, k: int, page_table: torch.Tensor | None = None,
                 page_size: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    if page_table is None:
        raise InvalidArgumentError(OP, "page_table", "a page table (the HIP op always writes page indices)",
                                   "None", remedy="pass page_table, or choose triton_radix_topk for raw-only top-k")
    args, raw, pages = topk_transform_args(scores, lengths, k, page_table, page_size)
    if scores.shape[0]:  # a zero-block grid is not a valid launch
        _op()(*args)
    return raw, pages
