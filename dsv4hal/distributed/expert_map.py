"""The logical -> physical expert map of expert parallelism (EPLB): each logical expert has one or more physical
slots (redundant replicas), slot p lives on rank p // experts_per_rank. Routing (score or hash) produces logical
ids; dispatch maps them to physical slots, spreading a replicated expert's routes over its replicas by token."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from dsv4hal.errors import InvalidArgumentError

OP = "ExpertMap"


@dataclass(frozen=True)
class ExpertMap:
    """replicas int32 [E_logical, R]: the physical slots of each logical expert, -1 padding after the first.
    num_physical: the slots over all ranks (a multiple of the world size)."""

    replicas: torch.Tensor
    num_physical: int

    @property
    def num_logical(self) -> int:
        return int(self.replicas.shape[0])

    @classmethod
    def identity(cls, num_experts: int) -> ExpertMap:
        """Logical expert e in physical slot e (no redundancy)."""
        return cls(torch.arange(num_experts, dtype=torch.int32).unsqueeze(1), num_experts)

    @classmethod
    def from_slots(cls, logical_of_slot: Sequence[int], num_logical: int) -> ExpertMap:
        """The map from what each physical slot holds (EPLB's usual output): slot p holds logical expert
        logical_of_slot[p]; an expert held by several slots is replicated."""
        slots: list[list[int]] = [[] for _ in range(num_logical)]
        for p, e in enumerate(logical_of_slot):
            if not isinstance(e, int) or not 0 <= e < num_logical:
                raise InvalidArgumentError(OP, f"logical_of_slot[{p}]", f"a logical expert id in [0, {num_logical})",
                                           repr(e), remedy="every physical slot holds one logical expert")
            slots[e].append(p)
        width = max((len(s) for s in slots), default=1) or 1
        table = torch.full((num_logical, width), -1, dtype=torch.int32)
        for e, s in enumerate(slots):
            table[e, :len(s)] = torch.tensor(s, dtype=torch.int32) if s else table[e, :0]
        return cls(table, len(logical_of_slot))

    def problems(self, world_size: int) -> list[str]:
        """Why this map cannot serve `world_size` ranks (empty: it can). Host-side, read once at setup."""
        out: list[str] = []
        t = self.replicas
        if t.dtype != torch.int32 or t.dim() != 2 or t.shape[0] < 1 or t.shape[1] < 1:
            return [f"replicas must be int32 [E_logical >= 1, R >= 1], got {t.dtype} {tuple(t.shape)}"]
        if self.num_physical < 1 or self.num_physical % world_size:
            out.append(f"num_physical {self.num_physical} is not a positive multiple of the world size {world_size}")
        t = t.cpu()
        uncovered = ((t[:, 0] < 0) | (t[:, 0] >= self.num_physical)).nonzero().flatten().tolist()
        if uncovered:
            out.append(f"logical experts {uncovered[:8]}{'...' if len(uncovered) > 8 else ''} have no physical slot "
                       f"in [0, {self.num_physical})")
        valid = t[t >= 0]
        if bool((valid >= self.num_physical).any()):
            out.append(f"a replica slot is >= num_physical {self.num_physical}")
        if valid.numel() != valid.unique().numel():
            out.append("a physical slot is given to two logical experts (or twice to one)")
        gaps = ((t[:, :-1] < 0) & (t[:, 1:] >= 0)).any() if t.shape[1] > 1 else torch.tensor(False)
        if bool(gaps):
            out.append("a replica row has -1 before a slot (pad with -1 only at the end)")
        return out

    def replica_counts(self) -> torch.Tensor:
        return (self.replicas >= 0).sum(1).clamp(min=1).to(torch.int32)

    def to(self, device: torch.device) -> ExpertMap:
        return ExpertMap(self.replicas.to(device), self.num_physical)

    def physical(self, logical_ids: torch.Tensor) -> torch.Tensor:
        """int32 [T, k] logical ids (negative or >= E_logical: dropped) -> int64 [T, k] physical slots, -1 dropped.
        Replica = (token + slot) mod the expert's replica count: spreads load without randomness. Device ops only."""
        e_log = self.num_logical
        ids = logical_ids.long()
        kept = (ids >= 0) & (ids < e_log)
        safe = ids.clamp(0, e_log - 1)
        n = self.replica_counts().to(ids.device)[safe].long()
        t, k = ids.shape
        pick = (torch.arange(t, device=ids.device).unsqueeze(1) + torch.arange(k, device=ids.device)) % n
        phys = self.replicas.to(ids.device)[safe, pick].long()
        return torch.where(kept & (phys >= 0), phys, -1)

    def logical_of_slots(self) -> list[int]:
        """Which logical expert each physical slot holds (-1: none)."""
        out = [-1] * self.num_physical
        for e, row in enumerate(self.replicas.cpu().tolist()):
            for p in row:
                if 0 <= p < self.num_physical:
                    out[p] = e
        return out
