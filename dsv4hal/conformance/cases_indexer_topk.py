"""Conformance catalog of indexer_topk: length semantics (n <= k gives 0..n-1 in order), set equality
with an exact float64 sort beyond k (ties compared as score multisets), and the page transform. Scores past a
row's length are ignored (spec 4.3: garbage, 0 or -inf there, as indexer_logits writes -inf): the `garbage`
cases put +inf, NaN, -inf and +-1e30 there; `strided` cases pass a view whose row stride exceeds its width."""

from __future__ import annotations

import torch

from dsv4hal.conformance.types import CaseSpec, Fixture, Tolerance

OP = "indexer_topk"
TOLERANCES = {OP: Tolerance(0.0, 0.0, "exact: the selected set's scores must equal the k largest scores "
                                      "(as multisets, so ties may pick either index); ascending 0..n-1 when n <= k")}


def _cases() -> list[CaseSpec]:
    c = []
    for k in (512, 1024):
        c.append(CaseSpec(OP, f"k{k}/mixed-lengths", {"k": k, "b": 6, "s": 3000, "lengths": "mixed"}))
        c.append(CaseSpec(OP, f"k{k}/ties", {"k": k, "b": 3, "s": 2500, "lengths": "full", "ties": True}))
        c.append(CaseSpec(OP, f"k{k}/no-page-table", {"k": k, "b": 4, "s": 2048, "lengths": "full",
                                                      "page_table": False}))
        for b, s in ((1, 8192), (8, 65536), (64, 262144)):
            c.append(CaseSpec(OP, f"k{k}/B{b}-N{s}", {"k": k, "b": b, "s": s, "lengths": "full"}, gpu_only=True))
        c.append(CaseSpec(OP, f"k{k}/garbage-past-lengths", {"k": k, "b": 6, "s": 3000, "lengths": "mixed",
                                                             "garbage": True}))
    c.append(CaseSpec(OP, "k512/strided-rows", {"k": 512, "b": 5, "s": 2100, "lengths": "mixed", "strided": True}))
    # the demo's widths at 32K and 64K context (129 and 257 pages of 64), -inf and garbage past the lengths
    for s in (8256, 16448):
        c.append(CaseSpec(OP, f"k512/B64-N{s}-garbage-past-lengths", {"k": 512, "b": 64, "s": s, "lengths": "near",
                                                                    "garbage": True, "strided": True},
                          gpu_only=True))
    c.append(CaseSpec(OP, "edge/zero-lengths", {"k": 512, "b": 4, "s": 600, "lengths": "zero"}))
    c.append(CaseSpec(OP, "edge/exactly-k", {"k": 512, "b": 2, "s": 600, "lengths": "k"}))
    return c


CASES: list[CaseSpec] = _cases()


def _lengths(kind: str, b: int, s: int, k: int, gen: torch.Generator) -> torch.Tensor:
    if kind == "full":
        return torch.full((b,), s, dtype=torch.int32)
    if kind == "zero":
        return torch.zeros(b, dtype=torch.int32)
    if kind == "k":
        return torch.tensor([k, k + 1][:b] + [k] * max(0, b - 2), dtype=torch.int32)
    if kind == "near":  # decode rows: most candidates of the width used, a few rows at or below k
        n = torch.randint(max(s - 2000, 0), s + 1, (b,), generator=gen, dtype=torch.int32)
        n[:3] = torch.tensor([k, k + 1, 7], dtype=torch.int32)[: min(3, b)]
        return n
    return torch.randint(0, s + 1, (b,), generator=gen, dtype=torch.int32).index_fill_(0, torch.tensor([0]), 1)


def build(spec: CaseSpec, device: torch.device, gen: torch.Generator) -> Fixture:
    p = spec.params
    k, b, s = int(p["k"]), int(p["b"]), int(p["s"])
    scores = torch.randn(b, s, generator=gen)
    if p.get("ties"):
        scores = (scores * 4).round() / 4  # heavy ties at every threshold
    lengths = _lengths(str(p["lengths"]), b, s, k, gen)
    if p.get("garbage"):  # past each row's length: values that win any comparison, NaN, -inf
        junk = torch.tensor([float("inf"), float("nan"), float("-inf"), 1e30, -1e30])
        past = torch.arange(s)[None, :] >= lengths.long()[:, None]
        scores = torch.where(past, junk[torch.arange(b * s).view(b, s) % 5], scores)
    page_table = None
    if p.get("page_table", True):
        pages = -(-s // 64)
        page_table = torch.stack([torch.randperm(pages * 4, generator=gen)[:pages] for _ in range(b)]).int()
    on_device = scores.to(device)
    if p.get("strided"):  # a view of a wider buffer: row stride s + 37, unit stride along the row
        wide = torch.full((b, s + 37), float("nan"), device=device)
        wide[:, :s] = on_device
        on_device = wide[:, :s]
    args = dict(scores=on_device, lengths=lengths.to(device), k=k,
                page_table=None if page_table is None else page_table.to(device), page_size=64)
    expected = (scores, lengths, page_table, k)

    def compare(got: tuple[torch.Tensor, torch.Tensor | None], exp: tuple) -> tuple[float, bool, str]:
        return check_topk(got, *exp)

    return Fixture(args, expected, compare=compare, tolerance=TOLERANCES[OP])


def check_topk(got: tuple[torch.Tensor, torch.Tensor | None], scores: torch.Tensor, lengths: torch.Tensor,
               page_table: torch.Tensor | None, k: int, page_size: int = 64) -> tuple[float, bool, str]:
    """Returns (number of wrong rows, ok, detail)."""
    raw, pages = (x.cpu() if x is not None else None for x in got)
    bad: list[str] = []
    if raw.shape != (scores.shape[0], k) or raw.dtype != torch.int32:
        return float("inf"), False, f"raw indices {raw.dtype} {tuple(raw.shape)}, expected int32 {(scores.shape[0], k)}"
    for i in range(scores.shape[0]):
        n, row = int(lengths[i]), raw[i]
        if n <= k:
            want = torch.cat([torch.arange(n), torch.full((k - n,), -1)]).int()
            if not torch.equal(row, want):
                bad.append(f"row {i}: n={n} <= k expects 0..n-1 then -1")
            continue
        if bool((row < 0).any()) or bool((row >= n).any()) or row.unique().numel() != k:
            bad.append(f"row {i}: indices must be {k} distinct values in [0, {n})")
            continue
        top = scores[i, :n].double().sort(descending=True).values[:k]
        if not torch.equal(scores[i, row.long()].double().sort(descending=True).values, top):
            bad.append(f"row {i}: selected scores differ from the {k} largest")
    if page_table is not None:
        if pages is None:
            bad.append("page indices missing although a page table was given")
        else:
            safe = raw.clamp(min=0).long()
            want = (page_table.long().gather(1, safe // page_size) * page_size + safe % page_size).where(
                raw >= 0, torch.tensor(-1))
            if not torch.equal(pages.long(), want):
                bad.append("page transform differs")
    elif pages is not None:
        bad.append("page indices returned without a page table")
    return float(len(bad)), not bad, "; ".join(bad[:3])
