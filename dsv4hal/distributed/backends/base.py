"""What every expert-parallel backend receives (EPContext), returns from its start step (Pending) and implements
(EPBackend): dispatch of routed tokens with physical expert ids, and combine of the experts' outputs."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import torch

from dsv4hal.distributed.contract import Dispatched, Handle, Layout
from dsv4hal.distributed.packing import RowCodec

T = TypeVar("T")


@dataclass(frozen=True)
class EPContext:
    group: Any  # torch.distributed ProcessGroup, or None for one rank
    world_size: int
    rank: int
    num_physical: int
    hidden: int
    top_k: int
    codec: RowCodec
    max_tokens: int | None

    @property
    def experts_per_rank(self) -> int:
        return self.num_physical // self.world_size

    @property
    def batch_capacity(self) -> int:
        """Rows of each expert's batch in the batched layout: every token of every rank, the worst case."""
        assert self.max_tokens is not None
        return self.max_tokens * self.world_size


class Pending(Generic[T]):
    """A started exchange: wait() blocks until its collectives finish, then builds the result."""

    def __init__(self, works: Sequence[Any], finish: Callable[[], T]) -> None:
        self._works, self._finish, self._done = list(works), finish, False
        self._result: T | None = None

    def wait(self) -> T:
        if not self._done:
            from dsv4hal.distributed.agree import collective

            for w in self._works:
                collective(w.wait, what="expert-parallel exchange")
            self._result, self._done = self._finish(), True
        return self._result  # type: ignore[return-value]


class EPBackend(Protocol):
    name: str

    def dispatch(self, ctx: EPContext, x: torch.Tensor, phys_ids: torch.Tensor, weights: torch.Tensor,
                 layout: Layout, decode: bool) -> Pending[Dispatched]: ...

    def combine(self, ctx: EPContext, expert_out: torch.Tensor, handle: Handle) -> Pending[torch.Tensor]: ...
