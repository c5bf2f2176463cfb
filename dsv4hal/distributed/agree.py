"""Collective agreement on errors before any data moves: every rank states whether it can go on (a code and a value
per rank, summed over the group), so a problem found on one rank raises a typed error on every rank instead of
leaving the others blocked in the exchange. Each collective is bounded by the process group's timeout; a rank that
never joins turns into the caller's error too (ExpertParallelError, TensorParallelError)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from dsv4hal.errors import CollectiveError, Dsv4HalError, ExpertParallelError

# code -> (what went wrong on that rank, with {value}; remedy)
CODES: dict[int, tuple[str, str]] = {
    1: ("a bad argument (its own error names it)", "fix the call on that rank; every rank passes the same shapes"),
    2: ("{value} tokens, more than max_tokens_per_rank",
        "raise max_tokens_per_rank (a power of two at least the largest per-rank batch) on every rank, or split "
        "the batch"),
    3: ("world size {value} in its config, not the group's",
        "build ExpertParallel with the process group's size on every rank"),
    4: ("an expert map that does not serve the group (its own error names the problem)",
        "give every logical expert a physical slot in [0, num_physical), num_physical a multiple of the world size"),
    5: ("a config that differs from rank 0's (field {value} of the fingerprint)",
        "build ExpertParallel with the same experts, hidden size, top_k, map and max_tokens_per_rank on every rank"),
}
NO_ERROR = 0


def _describe(code: int, value: int, codes: Mapping[int, tuple[str, str]]) -> str:
    what = codes.get(code, ("error code {value}", ""))[0]
    return what.format(value=value)


def agree(group: Any, world_size: int, rank: int, code: int, value: int, *, what: str,
          local: Dsv4HalError | None = None, fingerprint: Sequence[int] = (), fields: Sequence[str] = (),
          device: torch.device | None = None, codes: Mapping[int, tuple[str, str]] = CODES,
          error: type[CollectiveError] = ExpertParallelError) -> None:
    """Sum every rank's row (code, value, fingerprint...) over the group; raise `error` on every rank if any code is
    nonzero or a rank's fingerprint differs from rank 0's (code 5, value: the first differing field). `codes`
    describes each code (5 with the field's name). `local` is this rank's own error (chained, its message kept).
    Without a group only this rank counts."""
    table = torch.zeros(world_size, 2 + len(fingerprint), dtype=torch.int64, device=device)
    table[rank] = torch.tensor([code, value, *fingerprint], dtype=torch.int64)
    if group is not None and world_size > 1:
        collective(lambda: torch.distributed.all_reduce(table, group=group), what=f"{what} (error agreement)",
                   error=error)
    rows = table.cpu().tolist()
    failed = {r: (row[0], row[1]) for r, row in enumerate(rows) if row[0]}
    for r, row in enumerate(rows):
        if r not in failed and row[2:] != rows[0][2:]:
            failed[r] = (5, next(i for i, (a, b) in enumerate(zip(row[2:], rows[0][2:])) if a != b))
    if not failed:
        return
    failures = {r: _describe(c, v, codes) if c != 5 or v >= len(fields)
                else _describe(c, 0, codes).replace("field 0", fields[v]) for r, (c, v) in failed.items()}
    if local is not None and rank in failures:
        failures[rank] = f"{failures[rank]}: {local.message}"
    lines = "; ".join(f"rank {r}: {m}" for r, m in sorted(failures.items()))
    remedies = sorted({codes.get(c, ("", ""))[1] for c, _ in failed.values()} - {""})
    err = error(f"{what} refused on every rank of the group ({len(failed)} of {world_size} ranks "
                              f"found a problem): {lines}", remedy="; ".join(remedies) or None, failures=failures)
    raise err from local


def collective(fn: Callable[[], Any], *, what: str, error: type[CollectiveError] = ExpertParallelError) -> Any:
    """Run a blocking collective; a timeout or a peer's failure (RuntimeError from the process group) becomes
    `error` naming the step."""
    try:
        return fn()
    except Dsv4HalError:
        raise
    except RuntimeError as exc:  # gloo/NCCL report timeouts and closed peers as RuntimeError (DistBackendError)
        raise error(
            f"{what}: the collective failed or timed out ({type(exc).__name__}: {str(exc).splitlines()[0]})",
            remedy="check that every rank of the group calls the same step with the same config; the process "
                   "group's timeout (init_process_group(timeout=...)) bounds the wait") from exc
