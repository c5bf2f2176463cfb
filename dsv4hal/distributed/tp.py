"""Tensor-parallel attention: each rank holds heads / N of the query heads and the matching input columns of the
output projection; the projection's partial sums are all-reduced (the collective op tp_all_reduce).

    heads = attention_heads(platform, 64 // tp)             # padded to what the chosen attention kernel runs
    q = pad_heads(q_local, heads.padded)                     # zero heads: their outputs are dropped
    o = unpad_heads(platform.ops.sparse_attention_decode(q, ...)[0], heads.heads)
    tp = platform.tensor_parallel(group, hidden=4096, max_tokens=256)
    stream = tp.all_reduce_mhc_post(o_partial @ wo_b_local.T, stream, post, comb)

Data-parallel attention keeps the ranks in lock-step at the largest rank's token count: pad_to_largest_rank."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from dsv4hal.distributed import agree as ag
from dsv4hal.distributed.tp_backends import TP_OP
from dsv4hal.distributed.tp_reduce import TPContext
from dsv4hal.errors import Dsv4HalError, InvalidArgumentError, TensorParallelError
from dsv4hal.ops.sparse_attention import H_Q_CHOICES
from dsv4hal.registry import QueryHeads
from dsv4hal.selection import Decision

ATTENTION_OPS = ("sparse_attention_decode", "sparse_attention_prefill")
CONTRACT_HEADS = QueryHeads(counts=H_Q_CHOICES)  # what the attention ops take, whatever the kernel
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
# code -> (what went wrong on that rank, with {value}; remedy)
CODES: dict[int, tuple[str, str]] = {
    1: ("a bad argument (its own error names it)", "fix the call on that rank; every rank passes the same shapes"),
    2: ("{value} rows, more than max_tokens", "raise max_tokens on every rank, or split the batch"),
    3: ("world size {value} in its config, not the group's",
        "build TensorParallel with the process group's size on every rank"),
    5: ("a tensor or config that differs from rank 0's (field {value})",
        "pass the same hidden size, dtype and max_tokens at setup, and tensors of the same shape, on every rank"),
}
SETUP_FIELDS = ("hidden", "max_tokens", "dtype")
CALL_FIELDS = ("rows", "columns", "dtype")


# ---------------------------------------------------------------- heads


@dataclass(frozen=True)
class HeadPlan:
    """A rank's query heads (`heads`), the count the attention kernels run (`padded`), and each op's kernel."""

    heads: int
    padded: int
    kernels: dict[str, str]


def _padded_for(platform: Any, op: str, heads: int) -> tuple[int, str]:
    """The smallest head count, from `heads` up, that the best kernel able to run it declares (QueryHeads), and
    that kernel: candidates are tried in the platform's order, each at its own padded count."""
    bound = platform.ops[op]
    base = dict(bound.spec.default_case)
    first = bound.decide({**base, "h_q": heads})
    for cand in first.candidates:
        impl = platform.registry.kernels[op][cand.name]
        padded = impl.query_heads.padded(heads) if impl.query_heads is not None else heads
        if padded is None:
            continue
        try:
            if bound.decide({**base, "h_q": padded}).chosen.name == impl.name:
                return padded, impl.name
        except Dsv4HalError:  # a forced kernel that cannot run this count: the next candidate
            continue
    return heads, first.chosen.name


def attention_heads(platform: Any, heads_per_rank: int, ops: Sequence[str] = ATTENTION_OPS) -> HeadPlan:
    """The query head count each rank pads to: the ops' contract (h_q 64 or 128), then the largest over `ops` of
    what their kernels declare (KernelImpl.query_heads; FlashMLA runs 64 or 128 heads, aiter multiples of 16, the
    portable kernels any)."""
    start = CONTRACT_HEADS.padded(heads_per_rank) if isinstance(heads_per_rank, int) and heads_per_rank > 0 else None
    if start is None:
        raise InvalidArgumentError("attention_heads", "heads_per_rank",
                                   f"a positive int up to {max(H_Q_CHOICES)} (the attention ops' largest h_q)",
                                   repr(heads_per_rank), remedy="use more tensor-parallel ranks")
    picks = {op: _padded_for(platform, op, start) for op in ops}
    padded = max((p for p, _ in picks.values()), default=start)
    kernels = {op: platform.ops[op].decide({**platform.ops[op].spec.default_case, "h_q": padded}).chosen.name
               for op in ops}
    return HeadPlan(heads_per_rank, padded, kernels)


def pad_heads(x: torch.Tensor, padded: int, dim: int = 1) -> torch.Tensor:
    """x with zero heads appended along `dim` up to `padded` (x itself when it has that many); a zero query head's
    output is dropped by unpad_heads, and the heads are independent, so the real heads' outputs do not change."""
    heads = x.shape[dim]
    if padded < heads:
        raise InvalidArgumentError("pad_heads", "padded", f"at least the tensor's {heads} heads", f"{padded}")
    if padded == heads:
        return x
    shape = list(x.shape)
    shape[dim] = padded - heads
    return torch.cat([x, x.new_zeros(shape)], dim)


def unpad_heads(x: torch.Tensor, heads: int, dim: int = 1) -> torch.Tensor:
    """The first `heads` heads of x along `dim` (a view)."""
    return x.narrow(dim, 0, heads)


# ---------------------------------------------------------------- data-parallel attention


def pad_to_largest_rank(tokens: int, group: Any = None, *, device: torch.device | None = None) -> int:
    """The largest token count of any rank of `group` (one all-reduce MAX, bounded by the group's timeout): every
    rank pads its batch to it, so data-parallel attention ranks run the same shapes in lock-step. `device`: where
    the count is reduced (a CUDA device for NCCL groups)."""
    if not isinstance(tokens, int) or tokens < 0:
        raise InvalidArgumentError("pad_to_largest_rank", "tokens", "an int >= 0", repr(tokens))
    if group is None:
        return tokens
    import torch.distributed as dist

    most = torch.tensor([tokens], dtype=torch.int64, device=device)
    ag.collective(lambda: dist.all_reduce(most, op=dist.ReduceOp.MAX, group=group), what="pad_to_largest_rank",
                  error=TensorParallelError)
    return int(most)


def pad_rows(x: torch.Tensor, rows: int, fill: float | int = -1) -> torch.Tensor:
    """x with rows of `fill` appended up to `rows` (dim 0): metadata padding (-1: an unused entry, skipped by
    every op; lengths pad with 0)."""
    if rows < x.shape[0]:
        raise InvalidArgumentError("pad_rows", "rows", f"at least the tensor's {x.shape[0]} rows", f"{rows}")
    if rows == x.shape[0]:
        return x
    return torch.cat([x, x.new_full((rows - x.shape[0], *x.shape[1:]), fill)])


# ---------------------------------------------------------------- the all-reduce


def _group_shape(group: Any) -> tuple[int, int, str]:
    if group is None:
        return 1, 0, "none"
    import torch.distributed as dist

    return dist.get_world_size(group), dist.get_rank(group), str(dist.get_backend(group))


def _capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def symm_mem_available() -> bool:
    """Whether this torch build has the symmetric-memory all-reduce ops (torch.ops.symm_mem)."""
    try:
        return hasattr(torch.ops.symm_mem, "one_shot_all_reduce_out")
    except (AttributeError, RuntimeError):
        return False


class TensorParallel:
    """The all-reduce of one tensor-parallel group, its backend chosen like a kernel (decide/explain). Setup is
    agreed on collectively: a world size other than the group's, or a hidden size, dtype or max_tokens that differs
    from rank 0's, raises TensorParallelError on every rank. With check_calls, every all-reduce first agrees on the
    tensor's shape and dtype (one small all-reduce and a host sync; skipped while a CUDA graph is captured)."""

    def __init__(self, *, hidden: int, group: Any = None, world_size: int | None = None,
                 max_tokens: int | None = None, dtype: str = "bf16", platform: Any = None,
                 backend: str | None = None, check_calls: bool = True, device: torch.device | str | None = None
                 ) -> None:
        size, rank, self.group_backend = _group_shape(group)
        self.group, self.world_size, self.rank = group, size, rank
        self.platform, self.forced, self.check_calls = platform, backend, check_calls
        if device is None:
            device = torch.device("cuda", torch.cuda.current_device()) if self.group_backend == "nccl" else "cpu"
        self.device = torch.device(device)
        code, value, local = ag.NO_ERROR, 0, None
        try:
            if not isinstance(hidden, int) or hidden <= 0:
                raise InvalidArgumentError("TensorParallel", "hidden", "a positive int", repr(hidden))
            if dtype not in DTYPES:
                raise InvalidArgumentError("TensorParallel", "dtype", f"one of {tuple(DTYPES)}", repr(dtype))
            if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens <= 0):
                raise InvalidArgumentError("TensorParallel", "max_tokens", "a positive int or None", repr(max_tokens))
            if world_size is not None and world_size != size:
                code, value = 3, world_size
                raise InvalidArgumentError("TensorParallel", "world_size", f"the group's size {size}", f"{world_size}")
        except InvalidArgumentError as exc:
            code, local = code or 1, exc
        fingerprint = (hidden if isinstance(hidden, int) else -1, max_tokens or 0,
                       list(DTYPES).index(dtype) if dtype in DTYPES else -1)
        self._agree(code, value, local, "TensorParallel setup", fingerprint, SETUP_FIELDS)
        self.hidden, self.max_tokens, self.dtype = hidden, max_tokens, dtype
        self.ctx = TPContext(group, size, rank, hidden, max_tokens, DTYPES[dtype], self.device)
        self.decision, self.backend = self._choose()
        self.backend.setup(self.ctx)

    def _agree(self, code: int, value: int, local: Dsv4HalError | None, what: str, fingerprint: Sequence[int],
               fields: Sequence[str]) -> None:
        ag.agree(self.group, self.world_size, self.rank, code, value, what=what, local=local, fingerprint=fingerprint,
                 fields=fields, device=self.device if self.group_backend == "nccl" else None, codes=CODES,
                 error=TensorParallelError)

    # ---------------------------------------------------------------- selection

    def case(self) -> dict[str, object]:
        return {"world_size": self.world_size, "group_backend": self.group_backend, "dtype": self.dtype,
                "hidden": self.hidden, "max_tokens": self.max_tokens,
                "symm_mem": "available" if symm_mem_available() else "missing", "device": self.device.type}

    def _choose(self) -> tuple[Decision, Any]:
        from dsv4hal.plugins import load_target

        if self.platform is None:
            import dsv4hal

            self.platform = dsv4hal.select_platform()
        while True:  # a backend whose target does not import is marked broken by load_target: choose again
            decision = self.platform.decide_collective(TP_OP, self.case(), forced=self.forced)
            make = load_target(self.platform.registry, decision.chosen)
            if make is not None:
                return decision, make()

    def explain(self) -> str:
        return self.decision.explain()

    # ---------------------------------------------------------------- calls

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The sum over the group of every rank's x ([T, hidden], this group's dtype), written into x and returned."""
        code, value, local = ag.NO_ERROR, 0, None
        try:
            want = f"a [T, {self.hidden}] {self.dtype} tensor on {self.device.type}"
            if (not isinstance(x, torch.Tensor) or x.dim() != 2 or x.shape[1] != self.hidden
                    or x.dtype != DTYPES[self.dtype] or x.device.type != self.device.type or not x.is_contiguous()):
                got = f"{tuple(x.shape)} {x.dtype} on {x.device}" if isinstance(x, torch.Tensor) else type(x).__name__
                raise InvalidArgumentError(TP_OP, "x", want + " (contiguous)", got)
            if self.max_tokens is not None and x.shape[0] > self.max_tokens:
                code, value = 2, x.shape[0]
                raise InvalidArgumentError(TP_OP, "x", f"at most max_tokens = {self.max_tokens} rows", f"{value}")
        except InvalidArgumentError as exc:
            code, local = code or 1, exc
        if self.check_calls and not _capturing():
            shape = tuple(x.shape) if isinstance(x, torch.Tensor) and x.dim() == 2 else (-1, -1)
            dtype = str(x.dtype) if isinstance(x, torch.Tensor) else ""
            self._agree(code, value, local, TP_OP, (*shape, sum(map(ord, dtype))), CALL_FIELDS)
        elif local is not None:
            raise local
        return self.backend.all_reduce(self.ctx, x)

    def all_reduce_mhc_post(self, f_partial: torch.Tensor, x: torch.Tensor, post: torch.Tensor,
                            comb: torch.Tensor) -> torch.Tensor:
        """mhc_post(all_reduce(f_partial), x, post, comb): the output projection's partial sums reduced, rounded to
        bf16 once, then mixed into the residual streams by the platform's mhc_post (no backend fuses the two)."""
        f = self.all_reduce(f_partial)
        return self.platform.ops.mhc_post(f.to(torch.bfloat16), x, post, comb)


__all__ = ["HeadPlan", "TensorParallel", "attention_heads", "pad_heads", "pad_rows", "pad_to_largest_rank",
           "unpad_heads"]
