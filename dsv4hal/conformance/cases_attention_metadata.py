"""Conformance catalog of build_attention_metadata: page boundaries (L = 255, 256, 257), requests shorter
than the window, C4/C128 group boundaries, and graph replay with new positions and tables written in
place. The oracle is a plain Python loop over rows, exact."""

from __future__ import annotations

import torch

from dsv4hal.conformance.types import CaseSpec, Fixture, Tolerance
from dsv4hal.ops.attention_metadata import AttentionMetadata, c128_width

OP = "build_attention_metadata"
TOLERANCES = {OP: Tolerance(0.0, 0.0, "integer metadata: exact")}
FIELDS = tuple(AttentionMetadata.__dataclass_fields__)


def _cases() -> list[CaseSpec]:
    c = [
        CaseSpec(OP, "page-boundaries", {"positions": (253, 254, 255, 256, 257, 511, 512), "pages": 4}),
        CaseSpec(OP, "shorter-than-window", {"positions": (0, 1, 5, 63, 126, 127), "pages": 2}),
        CaseSpec(OP, "group-boundaries", {"positions": (3, 7, 127, 255, 1023, 1024, 2047), "pages": 9}),
        CaseSpec(OP, "random-64-rows", {"rows": 64, "max_pos": 4000, "pages": 16}),
        CaseSpec(OP, "topk1024", {"rows": 16, "max_pos": 9000, "pages": 36, "topk": 1024}),
        # 560 C128 indices a row: several programs a row, the last block partial
        CaseSpec(OP, "c128-blocks-70k", {"rows": 4, "max_pos": 71000, "pages": 280}),
        CaseSpec(OP, "allocate-output", {"rows": 8, "max_pos": 600, "pages": 3, "allocate": True}, modes=("eager",)),
        CaseSpec(OP, "v4-1024-rows-128k", {"rows": 1024, "max_pos": 131071, "pages": 512}, gpu_only=True),
    ]
    return c


CASES: list[CaseSpec] = _cases()


def oracle(positions: list[int], table: list[list[int]], f2s: list[int], topk: int, width: int) -> tuple:
    swa, swa_len, c4r, c4, c128, c128_len, c4o, c128o = [], [], [], [], [], [], [], []
    for pos, pt in zip(positions, table):
        length = pos + 1
        loc = [pt[p // 256] * 256 + p % 256 if p >= 0 else None for p in (pos - k for k in range(128))]
        swa.append([f2s[x] if x is not None else -1 for x in loc])
        swa_len.append(min(length, 128))
        c4r.append(length // 4)
        c4.append(min(max(length // 4, 1), topk))
        c128.append([pt[j // 2] * 2 + j % 2 if j < length // 128 else -1 for j in range(width)])
        c128_len.append(max(length // 128, 1))
        raw = pt[pos // 256] * 256 + pos % 256
        c4o.append(raw // 4 if length % 4 == 0 else 0)
        c128o.append(raw // 128 if length % 128 == 0 else 0)
    i32 = lambda x: torch.tensor(x, dtype=torch.int32)  # noqa: E731
    i64 = lambda x: torch.tensor(x, dtype=torch.int64)  # noqa: E731
    return (i32(swa).view(-1, 128), i32(swa_len), i32(c4r), i32(c4), i32(c128).view(-1, width), i32(c128_len),
            i64(c4o), i64(c128o))


def build(spec: CaseSpec, device: torch.device, gen: torch.Generator) -> Fixture:
    p = spec.params
    pages = int(p["pages"])
    if "positions" in p:
        pos = torch.tensor(p["positions"], dtype=torch.int32)
        # graph replay draws new positions of the same count: shift by the seed-dependent offset
        pos = (pos + torch.randint(0, 3, (1,), generator=gen).int()).clamp(max=pages * 256 - 1)
    else:
        pos = torch.randint(0, int(p["max_pos"]) + 1, (int(p["rows"]),), generator=gen, dtype=torch.int32)
    t = pos.shape[0]
    pool_pages = pages * 4
    table = torch.stack([torch.randperm(pool_pages, generator=gen)[:pages] for _ in range(t)]).int()
    f2s = torch.randint(-1, pool_pages * 256, (pool_pages * 256,), generator=gen, dtype=torch.int64)
    topk = int(p.get("topk", 512))
    width = c128_width(pages)
    expected = oracle(pos.tolist(), table.tolist(), f2s.tolist(), topk, width)
    out = None if p.get("allocate") else AttentionMetadata.empty(t, pages, device)
    if out is not None:
        for name in FIELDS:
            getattr(out, name).fill_(-7)  # stale contents must be overwritten
    args = dict(positions=pos.to(device), page_table=table.to(device), full_to_swa=f2s.to(device),
                index_topk=topk, out=out)

    def extract(ret: AttentionMetadata, _args: dict) -> tuple:
        return tuple(getattr(ret, f) for f in FIELDS)

    def compare(got: tuple, exp: tuple) -> tuple[float, bool, str]:
        bad = [f for f, g, e in zip(FIELDS, got, exp) if g.dtype != e.dtype or not torch.equal(g.cpu(), e)]
        return float(len(bad)), not bad, ("fields differ: " + ", ".join(bad)) if bad else ""

    return Fixture(args, expected, extract=extract, compare=compare, tolerance=TOLERANCES[OP])
