"""What the top-k kernels' tests share: the contract check of a batch of rows, the rows and page tables they draw,
and running the conformance catalog through a forced kernel."""

from __future__ import annotations

from typing import Any

import torch

import dsv4hal
from dsv4hal.conformance.cases_indexer_topk import check_topk
from dsv4hal.conformance.runner import load_catalog, run_cell
from dsv4hal.reference.indexer_topk import page_transform

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")
GPU = torch.cuda.is_available()


def forced(name: str) -> dict[str, str]:
    return {"indexer_topk": name}


def wide_catalog(name: str) -> list[tuple[Any, Any]]:
    """The size=large cases (rows wider than 16384); B64 x 262144 takes ~40 s under the interpreter: only on a GPU."""
    return [(s, b) for s, b in load_catalog(forced(name)) if s.op == "indexer_topk" and int(s.params["s"]) > 16384
            and (GPU or int(s.params["b"]) * int(s.params["s"]) <= 8 * 65536)]


def forced_platform(name: str) -> Any:
    with dsv4hal.overrides(kernels=forced(name)):
        return dsv4hal.select_platform()


def assert_cell_passes(platform: Any, spec: Any, build: Any, name: str) -> None:
    cell = run_cell(platform, spec, build, "eager")
    assert cell.implementation == name
    assert cell.status == "pass", cell.detail


def check_rows(got: tuple[torch.Tensor, torch.Tensor | None], scores: torch.Tensor, lengths: torch.Tensor,
               page_table: torch.Tensor | None, k: int) -> None:
    """The contract, extended to lengths past S as the radix kernel and the reference treat them: a row whose
    min(n, S) <= k gets 0..min(n, k)-1 then -1 (scores ignored; slots past the table -1), any other row selects
    among its first min(n, S) scores (checked by the conformance checker)."""
    raw, pages = (None if t is None else t.cpu() for t in got)
    scores, lengths = scores.cpu(), lengths.cpu()
    pt = None if page_table is None else page_table.cpu()
    s = scores.shape[1]
    n = lengths.long().clamp(max=s)
    prefix = n <= k
    want = torch.arange(k)[None, :].expand(int(prefix.sum()), k)
    want = torch.where(want < lengths.long()[prefix, None].clamp(max=k), want, -1).int()
    assert torch.equal(raw[prefix], want)
    if pt is None:
        assert pages is None
    else:
        assert torch.equal(pages[prefix], page_transform(want, pt[prefix], 64))
    sel = ~prefix
    if bool(sel.any()):
        wrong, ok, detail = check_topk((raw[sel], None if pages is None else pages[sel]), scores[sel],
                                       n[sel].int(), None if pt is None else pt[sel], k)
        assert ok, detail


def batch(s: int, k: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows for width s: random, ties, all equal, +-inf; lengths s, 0, k-1, k, k+1, past s, random."""
    rows = [torch.randn(s, generator=gen) for _ in range(4)]
    rows.append((torch.randn(s, generator=gen) * 2).round() / 2)  # heavy ties at every threshold
    rows.append(torch.ones(s))  # one value: the k-th key ties with every key
    inf = torch.randn(s, generator=gen)
    inf[torch.randperm(s, generator=gen)[: s // 3]] = float("-inf")  # ties at -inf where < k are finite (s < 1.5 k)
    inf[torch.randperm(s, generator=gen)[:5]] = float("inf")
    rows.append(inf)
    rows.append((torch.randn(s, generator=gen) * 8).round())
    r = int(torch.randint(k + 1, s + 1, (), generator=gen)) if s > k else s
    # s + 5: past S (refused in checked mode); for s < k so are k - 1, k and k + 1 (the n <= k rule)
    lengths = torch.tensor([s, 0, k - 1, k, k + 1, s + 5, s, r], dtype=torch.int32)
    return torch.stack(rows), lengths


def table(b: int, s: int, gen: torch.Generator) -> torch.Tensor:
    """A page table for b rows of width s: each row its own random pages, exactly as many as s needs."""
    pages = max(1, -(-s // 64))  # exactly the pages S needs: indices past S (n <= k rule) fall off the table
    return torch.stack([torch.randperm(pages * 3, generator=gen)[:pages] for _ in range(b)]).int()
