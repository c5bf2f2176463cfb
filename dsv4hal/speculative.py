"""Chain speculation (MTP) as DSV4 runs it: a verify step carries `1 + k` query tokens per request at consecutive
positions (the balanced recipe k = 1, two tokens per request; the low-latency recipe k = 3, four). Tree speculation
(several drafts at one position, MTP top-k > 1) is refused, as DSV4's attention backend refuses it.

Rings that a rejected draft must not overwrite while it still holds a live row (spec 2.4, 2.5):
- the SWA ring of a request: 128 + k rows. The verify step writes positions p..p+k before its queries attend, and
  the query at p reads p-127..p, so the ring needs 128 + k rows;
- the compressor state ring (row = position % ring): C4 8 -> 16 rows, C128 128 -> 256 with speculation. A rejected
  draft at L+j (L the last accepted position) lands on L+j-ring; the next group to close (at c >= L+1) pools
  c-window+1..c, so the ring needs window + k - 1 rows; the recipe doubles the window, which holds for k <= window+1.
On reject the engine only rewinds positions: rejected positions are rewritten by the next step's chain, which starts
at L+1 and covers every position a rejected draft wrote."""

from __future__ import annotations

import torch

from dsv4hal.errors import InvalidArgumentError

RECIPES = {"balanced": 2, "low-latency": 4}  # tokens per request in a verify step (1 + k)
SWA_WINDOW = 128


def swa_ring(tokens_per_request: int) -> int:
    """Rows of a request's SWA ring: the window plus the chain's drafts."""
    return SWA_WINDOW + tokens_per_request - 1


def compress_ring(ratio: int, tokens_per_request: int) -> int:
    """Rows of a compressor state ring: the window (C4 8, C128 128), doubled under speculation."""
    window = 8 if ratio == 4 else ratio
    return window if tokens_per_request == 1 else 2 * window


def chain_rows(batch: int, tokens_per_request: int, first: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(request, position) of every query row of a verify step, request-major: request b's rows are
    first[b], first[b] + 1, ..., first[b] + tokens_per_request - 1."""
    dev = first.device
    req = torch.arange(batch, device=dev).repeat_interleave(tokens_per_request)
    pos = first.repeat_interleave(tokens_per_request) + torch.arange(tokens_per_request, device=dev).repeat(batch)
    return req, pos


def check_chain(req: torch.Tensor, pos: torch.Tensor, op: str = "verify step") -> None:
    """Raise InvalidArgumentError unless each request's rows are consecutive positions in order (a chain). Reads
    the values (a host sync on a GPU): an engine checks its layout once, not per captured replay."""
    r, p = req.long().cpu(), pos.long().cpu()
    same = r[1:] == r[:-1]
    bad = same & (p[1:] != p[:-1] + 1)
    if bool(bad.any()):
        i = int(bad.nonzero()[0])
        kind = "two drafts at one position (tree speculation)" if int(p[i + 1]) <= int(p[i]) else "a gap"
        raise InvalidArgumentError(
            op, "positions", "a chain: each request's query rows at consecutive positions p, p+1, ..., p+k",
            f"request {int(r[i])} at positions {int(p[i])} then {int(p[i + 1])}: {kind}",
            remedy="DSV4 verifies chain speculation only (MTP top-k 1, as its attention backend requires): one draft "
                   "per position; run tree speculation (top-k > 1) as separate chains")
    seen = r[torch.cat([torch.ones(1, dtype=torch.bool), ~same])] if r.numel() else r
    if seen.unique().numel() != seen.numel():
        raise InvalidArgumentError(op, "positions", "each request's rows contiguous (request-major)",
                                   "a request whose rows are split by another request's",
                                   remedy="order the rows request by request (dsv4hal.speculative.chain_rows)")
