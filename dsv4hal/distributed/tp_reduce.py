"""The tp_all_reduce backends (dsv4hal.distributed.tp_backends names them): each sums a [T, hidden] tensor over the
group, in place into the caller's tensor. setup() runs once on every rank when the TensorParallel is built (the
symmetric-memory rendezvous is itself a collective)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from dsv4hal.distributed.agree import collective
from dsv4hal.errors import TensorParallelError

# one-shot (every rank reads every peer's buffer) up to this size; two-shot (reduce-scatter + all-gather inside the
# buffer) above, where the one-shot's W-fold reads cost more than the second pass
ONE_SHOT_MAX_BYTES = 1 << 20


@dataclass(frozen=True)
class TPContext:
    group: Any  # torch.distributed ProcessGroup, or None for one rank
    world_size: int
    rank: int
    hidden: int
    max_tokens: int | None
    dtype: torch.dtype
    device: torch.device


class Loopback:
    name = "loopback"

    def setup(self, ctx: TPContext) -> None:
        pass

    def all_reduce(self, ctx: TPContext, x: torch.Tensor) -> torch.Tensor:
        return x


class TorchAllReduce:
    name = "torch_all_reduce"

    def setup(self, ctx: TPContext) -> None:
        pass

    def all_reduce(self, ctx: TPContext, x: torch.Tensor) -> torch.Tensor:
        import torch.distributed as dist

        collective(lambda: dist.all_reduce(x, group=ctx.group), what="tp_all_reduce", error=TensorParallelError)
        return x


class SymmMem:
    """A [max_tokens, hidden] buffer from torch's symmetric-memory allocator, rendezvoused once: each call copies
    the tensor into its first rows and reduces from there into the caller's tensor (no allocation a call, so a
    CUDA graph can capture it)."""

    name = "torch_symm_mem"

    def __init__(self) -> None:
        self.buf: torch.Tensor | None = None

    def setup(self, ctx: TPContext) -> None:
        import torch.distributed._symmetric_memory as symm_mem

        assert ctx.max_tokens is not None  # supports() refuses a case without it
        try:
            self.buf = symm_mem.empty(ctx.max_tokens, ctx.hidden, dtype=ctx.dtype, device=ctx.device)
            symm_mem.rendezvous(self.buf, ctx.group)
        except RuntimeError as exc:
            raise TensorParallelError(
                f"tp_all_reduce torch_symm_mem: the symmetric buffer could not be set up ({str(exc).splitlines()[0]})",
                remedy="use GPUs with peer access (NVLink) or the torch_all_reduce backend "
                       "(DSV4HAL_KERNELS=tp_all_reduce=torch_all_reduce)") from exc

    def all_reduce(self, ctx: TPContext, x: torch.Tensor) -> torch.Tensor:
        assert self.buf is not None
        src = self.buf.view(-1)[:x.numel()].view(x.shape)
        src.copy_(x)
        name = ctx.group.group_name
        if x.numel() * x.element_size() <= ONE_SHOT_MAX_BYTES:
            torch.ops.symm_mem.one_shot_all_reduce_out(src, "sum", name, x)
        else:
            torch.ops.symm_mem.two_shot_all_reduce_(src, "sum", name)
            x.copy_(src)
        return x


def make_loopback() -> Loopback:
    return Loopback()


def make_all_reduce() -> TorchAllReduce:
    return TorchAllReduce()


def make_symm_mem() -> SymmMem:
    return SymmMem()
