"""Contract of build_attention_metadata (spec 3.1): per-query-row attention metadata from page tables.

build_attention_metadata(positions, page_table, full_to_swa, index_topk=512, out=None)
    positions    int32 [T] contiguous: position of each query row (every query token is its own row; L = pos + 1)
    page_table   int32 [T, P] (unit stride along P): full-pool page ids (256-token pages) of the row's request
    full_to_swa  int32 or int64 [S] contiguous: full-pool slot -> SWA slot (-1 = none)
    index_topk   512 or 1024 (C4 top-k width, an int)
    out          an AttentionMetadata of the same shapes, contiguous, to write into (CUDA-graph replays), or None
    returns      AttentionMetadata:
      swa_indices int32 [T, 128]: k-th newest key's SWA slot, full_to_swa[loc(pos - k)], -1 before the start
      swa_lengths int32 [T] = min(L, 128)
      c4_lengths_raw int32 [T] = L // 4; c4_lengths int32 [T] = min(max(L // 4, 1), index_topk) (clamp to 1:
        FlashMLA wants a length >= 1; the single entry is -1)
      c128_indices int32 [T, pad64(2P)]: j < L // 128 -> page_table[j // 2] * 2 + j % 2, else -1
      c128_lengths int32 [T] = max(L // 128, 1)
      c4_out_loc, c128_out_loc int64 [T]: loc(pos) // r when L % r == 0 (the row closes a group), else 0
        (the dummy slot), with loc(p) = page_table[p // 256] * 256 + p % 256
One call fills the fields of every layer type (SWA-only, C4, C128) for the step, as SGLang builds them
once per forward. C4 page indices come from indexer_topk, not from here.

Checked mode reads the inputs and refuses: negative positions; a page table narrower than pos // 256 + 1;
a used page id (pages 0..pos // 256 of the row) that is negative, or any page id below -1 (-1 marks an
unused table entry only); a
window slot (page * 256 + offset of the last 128 positions) >= S; full_to_swa entries below -1 (the
negative-index rule: -1 is "none", other negatives are invalid). Unchecked, such inputs give unspecified
entries (the reference and the portable kernel write -1 for a window slot outside full_to_swa) but no read
outside the buffers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dsv4hal.checks import (
    check_alloc,
    check_choice,
    check_page_table_rows,
    check_same_device,
    check_tensor,
    describe,
)
from dsv4hal.errors import InvalidArgumentError
from dsv4hal.ops.signatures import define

OP = "build_attention_metadata"
PAGE = 256
WINDOW = 128


@dataclass
class AttentionMetadata:
    swa_indices: torch.Tensor
    swa_lengths: torch.Tensor
    c4_lengths_raw: torch.Tensor
    c4_lengths: torch.Tensor
    c128_indices: torch.Tensor
    c128_lengths: torch.Tensor
    c4_out_loc: torch.Tensor
    c128_out_loc: torch.Tensor

    @classmethod
    def empty(cls, t: int, pages: int, device: torch.device | str = "cpu") -> AttentionMetadata:
        i32 = dict(dtype=torch.int32, device=device)
        return cls(torch.empty(t, WINDOW, **i32), torch.empty(t, **i32), torch.empty(t, **i32), torch.empty(t, **i32),
                   torch.empty(t, c128_width(pages), **i32), torch.empty(t, **i32),
                   torch.empty(t, dtype=torch.int64, device=device), torch.empty(t, dtype=torch.int64, device=device))


def c128_width(pages: int) -> int:
    return max(64, -(-2 * pages // 64) * 64)


def validate(positions, page_table, full_to_swa, index_topk=512, out=None,  # noqa: ANN001
             *, checked: bool = False) -> None:
    pos = check_tensor(OP, "positions", positions, dtype=torch.int32, shape=(None,), contiguous=True)
    t = pos.shape[0]
    pt = check_tensor(OP, "page_table", page_table, dtype=torch.int32, shape=(t, None), unit_stride=True)
    f2s = check_tensor(OP, "full_to_swa", full_to_swa, dtype=(torch.int32, torch.int64), shape=(None,),
                       contiguous=True)
    check_same_device(OP, {"page_table": pt, "full_to_swa": f2s}, pos.device, "positions")
    check_choice(OP, "index_topk", index_topk, (512, 1024))
    if out is not None:
        if not isinstance(out, AttentionMetadata):
            raise InvalidArgumentError(OP, "out", "an AttentionMetadata or None", describe(out))
        want = AttentionMetadata.empty(0, pt.shape[1], "meta")
        for name in want.__dataclass_fields__:
            got, ref = getattr(out, name), getattr(want, name)
            check_tensor(OP, f"out.{name}", got, dtype=ref.dtype, shape=(t, *ref.shape[1:]), device=pos.device,
                         contiguous=True)
    else:
        check_alloc(OP, "positions (output size)", t * (WINDOW + c128_width(pt.shape[1]) + 4 + 4) * 4, pos.device)
    if checked:
        _check_values(pos, pt, f2s)


def _check_values(pos: torch.Tensor, pt: torch.Tensor, f2s: torch.Tensor) -> None:
    """Checked mode: every value the kernels will use addresses something that exists (reads the tensors)."""
    if f2s.numel() and bool((f2s < -1).any()):
        raise InvalidArgumentError(OP, "full_to_swa", "SWA slots >= 0 or -1 (none)", f"min {int(f2s.min())}",
                                   remedy="-1 marks a full-pool slot without an SWA slot; no other negative")
    if not pos.numel():
        return
    if bool((pos < 0).any()):
        raise InvalidArgumentError(OP, "positions", "non-negative positions", f"min {int(pos.min())}")
    check_page_table_rows(OP, pt, pos.long() // PAGE + 1, "of positions 0..pos")
    # the window's slots index full_to_swa: the last min(L, 128) positions of each row
    back = pos.long()[:, None] - torch.arange(WINDOW, device=pos.device)[None, :]
    ok = back >= 0
    bs = back.clamp(min=0)
    slot = torch.gather(pt.long(), 1, bs // PAGE) * PAGE + bs % PAGE
    if bool((ok & (slot >= f2s.shape[0])).any()):
        worst = int(torch.where(ok, slot, -1).max())
        raise InvalidArgumentError(OP, "full_to_swa", f"an entry for every window slot (slot {worst} is used)",
                                   f"{f2s.shape[0]} entries", remedy="size full_to_swa to the full pool's slots")


def case(positions, page_table, full_to_swa, index_topk=512, out=None) -> dict[str, object]:  # noqa: ANN001
    return {"index_topk": int(index_topk), "in_place": out is not None}


def fake(positions, page_table, full_to_swa, index_topk=512, out=None) -> AttentionMetadata:  # noqa: ANN001
    """The outputs' shapes and dtypes (under torch.compile; into `out`, the op returns nothing new)."""
    t, p = positions.shape[0], page_table.shape[1]
    i32 = dict(dtype=torch.int32)
    return AttentionMetadata(positions.new_empty(t, WINDOW, **i32), *(positions.new_empty(t, **i32) for _ in range(3)),
                             positions.new_empty(t, c128_width(p), **i32), positions.new_empty(t, **i32),
                             positions.new_empty(t, dtype=torch.int64), positions.new_empty(t, dtype=torch.int64))


@define(validate=validate, case=case, fake=fake, mutates=("out",))
def build_attention_metadata(positions: torch.Tensor, page_table: torch.Tensor, full_to_swa: torch.Tensor,
                             index_topk: int = 512, out: AttentionMetadata | None = None) -> AttentionMetadata:
    """Per-query-row attention metadata of every layer type (SWA-only, C4, C128) from the page tables, once per
    step (spec 3.1). C4 page indices come from indexer_topk, not from here.

    Arguments:
        positions: (T,), torch.int32, contiguous: each query row's position (L = pos + 1).
        page_table: (T, P), torch.int32, unit stride along P: full-pool page ids (256-token pages) of the row's
            request.
        full_to_swa: (S,), torch.int32 or torch.int64, contiguous: full-pool slot -> SWA slot (-1 = none).
        index_topk: 512 or 1024 (an int): the C4 top-k width.
        out: an AttentionMetadata of the shapes below, contiguous, to write into (CUDA-graph replays); or None.

    Returns:
        AttentionMetadata (`out` itself when given, mutated):
            swa_indices (T, 128) int32: the k-th newest key's SWA slot, -1 before the start;
            swa_lengths (T,) int32 = min(L, 128); c4_lengths_raw (T,) int32 = L // 4;
            c4_lengths (T,) int32 = clamp(L // 4, 1, index_topk);
            c128_indices (T, pad64(2P)) int32: j < L // 128 -> page_table[j // 2] * 2 + j % 2, else -1;
            c128_lengths (T,) int32 = max(L // 128, 1);
            c4_out_loc, c128_out_loc (T,) int64: the compressed slot a row closing a group writes, else 0.

    Rejected (InvalidArgumentError): other dtypes, shapes or devices, index_topk not 512/1024, an `out` of other
    shapes. Checked mode also refuses negative positions, a page table too narrow or with a negative used page,
    page ids < -1, window slots past full_to_swa and full_to_swa entries < -1.
    """
