"""Dispatch and combine built from torch.distributed collectives, shared by the loop-back (one rank, no
communication) and the torch backends. Two strategies:

  * all_to_all: each rank sends every token once to each rank holding one of its routes (all_to_all_single).
    Decode mode sends fixed [W, max_tokens_per_rank] slots (no host sync); normal mode sends exactly the needed
    rows (one all_to_all of the counts, read on the host, sizes the exchange).
  * all_gather: every rank gathers every rank's tokens and keeps the routes to its own experts; combine is a
    reduce-scatter of fp32 partial sums. More traffic, but only the collectives every backend has.

Received rows are ordered by source rank; combine sums the ranks' partial outputs in rank order, in fp32, so decode
and normal mode give the same bits."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch
import torch.distributed as dist

from dsv4hal.distributed.agree import collective
from dsv4hal.distributed.backends.base import EPContext, Pending
from dsv4hal.distributed.contract import Dispatched, Handle, Layout
from dsv4hal.distributed.layouts import batch_slots, from_batched, to_batched


def _routes_by_rank(ctx: EPContext, phys_ids: torch.Tensor, weights: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(local ids int32 [W, T, k] per destination rank (-1 elsewhere), weights [W, T, k] (0 elsewhere),
    sent bool [W, T])."""
    e_local = ctx.experts_per_rank
    dst = torch.where(phys_ids >= 0, phys_ids // e_local, -1)
    to_r = dst.unsqueeze(0) == torch.arange(ctx.world_size, device=phys_ids.device).view(-1, 1, 1)
    local = (phys_ids - dst.clamp(min=0) * e_local).unsqueeze(0)
    ids = torch.where(to_r, local, -1).to(torch.int32)
    return ids, torch.where(to_r, weights.unsqueeze(0), 0.0), to_r.any(2)


def _padded(ctx: EPContext, rows: int, groups: int, payload: torch.Tensor, ids: torch.Tensor,
            weights: torch.Tensor) -> torch.Tensor:
    """uint8 [groups, rows / groups, row_bytes]: each group's rows packed first, then padding rows whose ids are all
    -1 (no route: the experts skip them)."""
    n, k = payload.shape[0] // groups, ids.shape[1]
    per = rows // groups
    pay = payload.new_zeros((groups, per, payload.shape[1]))
    pay[:, :n] = payload.view(groups, n, payload.shape[1])
    pad_ids = torch.full((groups, per, k), -1, dtype=torch.int32, device=ids.device)
    pad_ids[:, :n] = ids.view(groups, n, k)
    pad_w = weights.new_zeros((groups, per, k))
    pad_w[:, :n] = weights.view(groups, n, k)
    return ctx.codec.pack(pay.view(rows, -1), pad_ids.view(rows, k), pad_w.view(rows, k)).view(groups, per, -1)


def _finish_dispatch(ctx: EPContext, rows: torch.Tensor, handle: Handle) -> Dispatched:
    x, scale, ids, w = ctx.codec.unpack(rows)
    if handle.layout == "standard":
        counts = torch.zeros(ctx.experts_per_rank + 1, dtype=torch.int32, device=ids.device)
        counts.scatter_add_(0, (ids.long() + 1).clamp(min=0).reshape(-1), torch.ones_like(ids).reshape(-1))
        return Dispatched(x, scale, ids, w, counts[1:], replace(handle, out_rows=x.shape[0]), "standard")
    cap = ctx.batch_capacity
    slots, counts = batch_slots(ids, ctx.experts_per_rank, cap)
    xb = to_batched(x.view(torch.uint8) if scale is not None else x, ids, slots, ctx.experts_per_rank, cap)
    sb = None if scale is None else to_batched(scale, ids, slots, ctx.experts_per_rank, cap)
    if scale is not None:
        xb = xb.view(x.dtype)
    handle = replace(handle, recv_weights=w, slots=slots, recv_ids=ids, out_rows=cap)
    return Dispatched(xb, sb, None, None, counts, handle, "batched")


def _standard_rows(expert_out: torch.Tensor, handle: Handle) -> torch.Tensor:
    """Expert outputs in the dispatch layout -> bf16 [M, H], one weighted partial sum per received row."""
    if handle.layout == "standard":
        return expert_out
    assert handle.recv_ids is not None and handle.slots is not None and handle.recv_weights is not None
    return from_batched(expert_out, handle.recv_ids, handle.slots, handle.recv_weights)


class CollectiveBackend:
    """The all_to_all or all_gather strategy over ctx.group (None: one rank, rows stay where they are)."""

    def __init__(self, name: str, strategy: str = "all_to_all") -> None:
        self.name, self.strategy = name, strategy

    # ---------------------------------------------------------------- dispatch

    def dispatch(self, ctx: EPContext, x: torch.Tensor, phys_ids: torch.Tensor, weights: torch.Tensor,
                 layout: Layout, decode: bool) -> Pending[Dispatched]:
        if self.strategy == "all_gather":
            return self._dispatch_gather(ctx, x, phys_ids, weights, layout, decode)
        ids, w, sent = _routes_by_rank(ctx, phys_ids, weights)
        payload = ctx.codec.payload(x)
        world, t = ctx.world_size, x.shape[0]
        if decode:
            cap = ctx.max_tokens
            assert cap is not None
            send = _padded(ctx, cap * world, world, payload.repeat(world, 1), ids.reshape(world * t, ctx.top_k),
                           w.reshape(world * t, ctx.top_k))
            handle = Handle(layout, True, t, sent)
            recv, works = self._all_to_all(ctx, send, None, None)
            return Pending(works, lambda: _finish_dispatch(ctx, recv.view(world * cap, -1), handle))
        send_splits, recv_splits = self._split_sizes(ctx, sent)
        pairs = sent.nonzero()
        rank_of, token_of = pairs[:, 0], pairs[:, 1]
        send = ctx.codec.pack(payload[token_of], ids[rank_of, token_of], w[rank_of, token_of])
        handle = Handle(layout, False, t, sent, token_of, send_splits, recv_splits)
        recv, works = self._all_to_all(ctx, send, recv_splits, send_splits)
        return Pending(works, lambda: _finish_dispatch(ctx, recv, handle))

    def _split_sizes(self, ctx: EPContext, sent: torch.Tensor) -> tuple[tuple[int, ...], tuple[int, ...]]:
        counts = sent.sum(1).to(torch.int64)
        if ctx.group is None:
            return tuple(counts.tolist()), tuple(counts.tolist())
        recv = torch.empty_like(counts)
        collective(lambda: dist.all_to_all_single(recv, counts, group=ctx.group), what="ep dispatch (split sizes)")
        return tuple(counts.tolist()), tuple(recv.tolist())

    def _all_to_all(self, ctx: EPContext, send: torch.Tensor, out_splits: Any, in_splits: Any
                    ) -> tuple[torch.Tensor, list[Any]]:
        if ctx.group is None:
            return send, []
        rows = sum(out_splits) if out_splits is not None else send.shape[0]
        recv = send.new_empty((rows, *send.shape[1:]))
        work = collective(lambda: dist.all_to_all_single(
            recv, send, list(out_splits) if out_splits is not None else None,
            list(in_splits) if in_splits is not None else None, group=ctx.group, async_op=True),
            what="ep exchange")
        return recv, [work]

    def _dispatch_gather(self, ctx: EPContext, x: torch.Tensor, phys_ids: torch.Tensor, weights: torch.Tensor,
                         layout: Layout, decode: bool) -> Pending[Dispatched]:
        t = x.shape[0]
        cap = ctx.max_tokens if decode else self._max_tokens(ctx, t, x.device)
        assert cap is not None
        mine = _padded(ctx, cap, 1, ctx.codec.payload(x), phys_ids.to(torch.int32), weights)[0]
        parts = [torch.empty_like(mine) for _ in range(ctx.world_size)]
        if ctx.group is None:
            parts, works = [mine], []
        else:
            works = [collective(lambda: dist.all_gather(parts, mine, group=ctx.group, async_op=True),
                                what="ep exchange (all_gather)")]
        handle = Handle(layout, decode, t, torch.zeros(0, dtype=torch.bool, device=x.device), recv_splits=(cap,))

        def finish() -> Dispatched:
            rows = torch.cat(parts)
            p, k = ctx.codec.payload_bytes, ctx.top_k
            phys = rows[:, p:p + 4 * k].contiguous().view(torch.int32)
            lo = ctx.rank * ctx.experts_per_rank
            local = torch.where((phys >= lo) & (phys < lo + ctx.experts_per_rank), phys - lo, -1)
            rows[:, p:p + 4 * k] = local.contiguous().view(torch.uint8)
            return _finish_dispatch(ctx, rows, handle)

        return Pending(works, finish)

    def _max_tokens(self, ctx: EPContext, t: int, device: torch.device) -> int:
        if ctx.group is None:
            return max(t, 1)
        most = torch.tensor([t], dtype=torch.int64, device=device)  # NCCL reduces device tensors only
        collective(lambda: dist.all_reduce(most, op=dist.ReduceOp.MAX, group=ctx.group), what="ep dispatch (sizes)")
        return max(int(most), 1)

    # ---------------------------------------------------------------- combine

    def combine(self, ctx: EPContext, expert_out: torch.Tensor, handle: Handle) -> Pending[torch.Tensor]:
        rows = _standard_rows(expert_out, handle)
        if self.strategy == "all_gather":
            return self._combine_gather(ctx, rows, handle)
        world, t = ctx.world_size, handle.num_tokens
        if handle.decode:
            back, works = self._all_to_all(ctx, rows.reshape(world, -1, rows.shape[1]).contiguous(), None, None)

            def finish_decode() -> torch.Tensor:
                out = torch.zeros((t, rows.shape[1]), dtype=torch.float32, device=rows.device)
                for r in range(world):
                    out += torch.where(handle.sent[r].unsqueeze(1), back[r, :t].float(), 0.0)
                return out.to(torch.bfloat16)

            return Pending(works, finish_decode)
        back, works = self._all_to_all(ctx, rows.contiguous(), handle.send_splits, handle.recv_splits)

        def finish() -> torch.Tensor:
            assert handle.send_tokens is not None
            out = torch.zeros((t, rows.shape[1]), dtype=torch.float32, device=rows.device)
            start = 0
            for n in handle.send_splits:  # a token appears once per rank: index_add_ never adds twice in one call
                out.index_add_(0, handle.send_tokens[start:start + n], back[start:start + n].float())
                start += n
            return out.to(torch.bfloat16)

        return Pending(works, finish)

    def _combine_gather(self, ctx: EPContext, rows: torch.Tensor, handle: Handle) -> Pending[torch.Tensor]:
        cap = handle.recv_splits[0]
        partial = rows.float().reshape(ctx.world_size, cap, rows.shape[1])
        if ctx.group is None:
            return Pending([], lambda: partial[0, :handle.num_tokens].to(torch.bfloat16))
        out = torch.empty((cap, rows.shape[1]), dtype=torch.float32, device=rows.device)
        if partial.device.type == "cpu":  # gloo has no reduce_scatter: all_reduce, then this rank's slice
            work = collective(lambda: dist.all_reduce(partial, group=ctx.group, async_op=True),
                              what="ep combine (all_reduce)")
            return Pending([work], lambda: partial[ctx.rank, :handle.num_tokens].to(torch.bfloat16))
        work = collective(lambda: dist.reduce_scatter_tensor(out, partial, group=ctx.group, async_op=True),
                          what="ep combine (reduce_scatter)")
        return Pending([work], lambda: out[:handle.num_tokens].to(torch.bfloat16))
