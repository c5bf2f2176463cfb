"""Conformance catalog of the sparse attention ops: SGLang's DSV4 test matrix (compress ratio by runner
mode), edge cases, and V4-Flash / V4-Pro shapes.

Fixtures keep the unquantized bf16 keys. The caches are written from them with the format module, and
the oracle attends in float64, row by row, over the exact dequantization of those keys computed from
the inputs (formats.v4_cache.exact_dequant): a kernel is never checked by reading back bytes it wrote,
and the tolerance covers the kernel's arithmetic rather than the FP8 rounding of single keys (which
alone exceeds 5e-2 for a row attending to one key of magnitude 3)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from dsv4hal.conformance.types import CaseSpec, Fixture, Tolerance
from dsv4hal.formats.v4_cache import (
    HEAD_DIM,
    PAGE_SIZE_BY_RATIO,
    V4PagedCache,
    convert_cache,
    exact_dequant,
    quantize_tokens,
    write_records,
)

DECODE, PREFILL = "sparse_attention_decode", "sparse_attention_prefill"
SCALE = HEAD_DIM ** -0.5
WINDOW = 128

TOLERANCES = {
    DECODE: Tolerance(2e-2, 2e-2, "oracle over the exact dequantized FP8 keys; covers bf16 tensor-core products "
                                  "(P rounded to bf16 before PV), split-K combine and the bf16 output; tighter "
                                  "than the spec's 5e-2, which also absorbs FP8 rounding of the keys"),
    PREFILL: Tolerance(2e-2, 2e-2, "bf16 workspace read exactly; bf16 output rounding and fp32 accumulation"),
}
GRAPH_TOLERANCE = Tolerance(1e-1, 1e-1, "graph replay, as SGLang's DSV4_GRAPH_ATOL/RTOL")

DE_UNREACHABLE = "draft-extend layers are SWA-only (need_compress=False): no C4/C128 metadata exists"


def _spec(name: str, ratio: int, requests: tuple[tuple[int, int], ...], *, decode_only: bool = False,
          gpu_only: bool = False, **params: object) -> list[CaseSpec]:
    """A case for the decode op (every mode) and, for extends, the prefill op (eager and graph)."""
    modes = ("eager", "graph", "verify", "draft_extend")
    unreachable = {"draft_extend": DE_UNREACHABLE} if ratio else {}
    p = {"requests": requests, **params}
    out = [CaseSpec(DECODE, name, p, ratio, modes, unreachable, gpu_only=gpu_only)]
    if not decode_only:
        out.append(CaseSpec(PREFILL, name, p, ratio, ("eager", "graph"), gpu_only=gpu_only))
    return out


def _catalog() -> list[CaseSpec]:
    c: list[CaseSpec] = []
    # ratio 0 (SWA only): SGLang's extend and decode rows
    c += _spec("swa/extend-no-prefix", 0, ((0, 16),))
    c += _spec("swa/extend-prefix-within-window", 0, ((64, 16),))
    c += _spec("swa/extend-sink-zero", 0, ((64, 16),), sink="zero")
    c += _spec("swa/extend-above-window", 0, ((160, 16),))
    for n in (128, 255, 256, 257):
        c += _spec(f"swa/extend-seq{n}", 0, ((0, n),))
    c += _spec("swa/extend-prefix-page", 0, ((256, 16),))
    c += _spec("swa/extend-prefix-plus-extend-page", 0, ((240, 16),))
    c += _spec("swa/decode-within-window", 0, ((63, 1),), decode_only=True)
    c += _spec("swa/decode-multi-request", 0, ((49, 1), (129, 1), (299, 1)), decode_only=True)
    c += _spec("swa/decode-above-window", 0, ((299, 1),), decode_only=True)
    # ratio 4 (C4) and 128 (C128)
    c += _spec("c4/extend-prefix64", 4, ((64, 16),))
    c += _spec("c4/decode-prefix64", 4, ((64, 1), (200, 1)), decode_only=True)
    c += _spec("c4/decode-beyond-topk", 4, ((2200, 1), (2300, 1)), decode_only=True)
    c += _spec("c128/extend-prefix128", 128, ((128, 16),))
    c += _spec("c128/decode-prefix128", 128, ((128, 1), (700, 1)), decode_only=True)
    # before the first compressed entries: C4 rows with 0-2 entries (a lone -1 entry counted as length 1), C128
    # rows with 0 or 1, and an extend that starts with none
    c += _spec("c4/decode-few-compressed", 4, ((2, 1), (5, 1), (9, 1)), decode_only=True)
    c += _spec("c4/extend-from-empty", 4, ((0, 10),))
    c += _spec("c128/decode-few-compressed", 128, ((5, 1), (200, 1)), decode_only=True)
    # edge cases
    c += _spec("edge/sink+inf", 4, ((64, 4),), sink="+inf")
    c += _spec("edge/sink-inf", 4, ((64, 4),), sink="-inf")
    c += _spec("edge/sink-default", 4, ((64, 4),), sink="default")  # SGLang's default sink: -1e30, a no-op
    c += _spec("edge/empty-rows", 0, ((40, 4),), edge="empty")
    c += _spec("edge/all-indices-invalid", 4, ((64, 4),), edge="all_invalid")
    c += _spec("edge/lengths-shorter-than-widths", 4, ((300, 4),), edge="short")
    c += _spec("edge/h128-topk1024", 4, ((4200, 2),), h_q=128, topk=1024, decode_only=True)
    c += _spec("edge/h128-topk1024-extend", 4, ((4200, 6),), h_q=128, topk=1024)  # V4-Pro heads in prefill too
    # e4m3fnuz caches (gfx942): converted from an e4m3fn cache (lossless), and written natively
    c += _spec("fnuz/converted-swa-extend", 0, ((64, 16),), fp8="e4m3fnuz", convert_from="e4m3fn")
    c += _spec("fnuz/converted-c4-decode", 4, ((64, 1), (2300, 1)), fp8="e4m3fnuz", convert_from="e4m3fn",
               decode_only=True)
    c += _spec("fnuz/converted-c128-decode", 128, ((700, 2),), fp8="e4m3fnuz", convert_from="e4m3fn",
               decode_only=True)
    c += _spec("fnuz/native-c4-decode", 4, ((200, 2),), fp8="e4m3fnuz", decode_only=True)
    # SGLang's HIP "unified_kv_triton" mode keeps an unquantized BF16 unified cache (spec 2.5): not built
    why = "the unquantized BF16 unified cache of SGLang's HIP backend (spec 2.5) is not built; FP8 cache serves ROCm"
    c.append(CaseSpec(DECODE, "rocm/unified-bf16-cache", {"requests": ((64, 1),)}, 4, ("eager", "graph"),
                      deferred={"eager": why, "graph": why}))
    # V4-Flash and V4-Pro shapes, 64 decode rows at long context (GPU only)
    flash8k = tuple((8191 - 7 * i, 1) for i in range(64))
    c += _spec("v4-flash/c4-8k-T64", 4, flash8k, decode_only=True, gpu_only=True)
    c += _spec("v4-flash/c128-128k-T64", 128, tuple((131071 - 5 * i, 1) for i in range(64)),
               decode_only=True, gpu_only=True)
    c += _spec("v4-pro/c4-8k-T64", 4, flash8k, h_q=128, topk=1024, decode_only=True, gpu_only=True)
    c += _spec("v4-flash/extend-c4-2k", 4, ((2048, 256),), gpu_only=True)
    c += _spec("v4-pro/extend-c4-2k", 4, ((2048, 256),), h_q=128, topk=1024, gpu_only=True)
    # one row, and the other shape classes `dsv4hal tune` measures apart (ops.sparse_attention.EXTRA_SHORT_MAX):
    # a decode bucket without a sample would leave a lock unable to decide real calls of that class
    pro = {"h_q": 128, "topk": 1024}
    at_1m = tuple((1048575 - 9 * i, 1) for i in range(8))  # C128 width 8192 ("long")
    at_1m_wide = tuple((1048575 - 9 * i, 1) for i in range(72))  # more rows than the "batch" class holds
    for name, ratio, reqs, extra in (
            ("v4-flash/c4-8k-T1", 4, ((8191, 1),), {}),
            ("v4-pro/c4-8k-T1", 4, ((8191, 1),), pro),
            ("v4-flash/c128-128k-T1", 128, ((131071, 1),), {}),
            ("v4-flash/c128-1m-T1", 128, ((1048575, 1),), {}),
            ("v4-flash/c128-1m-T8", 128, at_1m, {}),
            ("v4-flash/c128-1m-T72", 128, at_1m_wide, {}),
            ("v4-pro/c128-128k-T1", 128, ((131071, 1),), pro),
            ("v4-pro/c128-128k-T64", 128, tuple((131071 - 5 * i, 1) for i in range(64)), pro),
            ("v4-pro/c128-1m-T1", 128, ((1048575, 1),), pro),
            ("v4-pro/c128-1m-T8", 128, at_1m, pro),
            ("v4-pro/c128-1m-T72", 128, at_1m_wide, pro),
            ("v4-pro/swa-T1", 0, ((8191, 1),), pro),
            ("v4-pro/swa-T64", 0, flash8k, pro)):
        c += _spec(name, ratio, reqs, decode_only=True, gpu_only=True, **extra)
    return c


CASES: list[CaseSpec] = _catalog()


@dataclass
class _Scenario:
    """Per query row: its unquantized key rows (SWA, extra) and the index metadata."""

    q: torch.Tensor
    sink: torch.Tensor
    swa_cache: V4PagedCache
    swa_indices: torch.Tensor
    swa_lengths: torch.Tensor
    swa_keys: torch.Tensor  # [slots, 512] bf16, row = slot
    extra_cache: V4PagedCache | None
    extra_indices: torch.Tensor | None
    extra_lengths: torch.Tensor | None
    extra_keys: torch.Tensor | None


def _pad64(n: int) -> int:
    return max(64, -(-n // 64) * 64)


def _requests(spec: CaseSpec) -> tuple[tuple[int, int], ...]:
    reqs = tuple(spec.params["requests"])
    mode = spec.params.get("mode", "eager")
    if mode in ("verify", "draft_extend"):  # a chain of 3 query tokens after each request's prefix
        reqs = tuple((pre + ext - 1, 3) for pre, ext in reqs)
    return reqs


def _sink(kind: str, h: int, gen: torch.Generator) -> torch.Tensor:
    return {"default": torch.full((h,), -1e30), "zero": torch.zeros(h), "+inf": torch.full((h,), math.inf),
            "-inf": torch.full((h,), -math.inf), "random": torch.randn(h, generator=gen)}[kind].float()


def _write(keys: torch.Tensor, slots: torch.Tensor, page: int, fp8: str, device: torch.device,
           capacity: int, convert_from: str | None = None) -> V4PagedCache:
    """A cache holding `keys` at `slots`; written in `convert_from` and converted to `fp8` when given (a
    cache produced on one vendor and read on another)."""
    num_pages = max(1, -(-capacity // page))  # from the case's sizes only, so graph replays match shapes
    cache = V4PagedCache.empty(num_pages, page, convert_from or fp8, device)
    write_records(cache, slots.to(device), quantize_tokens(keys.to(device), convert_from or fp8))
    return convert_cache(cache, fp8) if convert_from else cache


def build_scenario(spec: CaseSpec, device: torch.device, gen: torch.Generator) -> _Scenario:
    """Lay out the requests' keys in paged pools (random page order) and build the per-row metadata."""
    prm = spec.params
    h, ratio, fp8 = int(prm.get("h_q", 64)), spec.compress_ratio or 0, str(prm.get("fp8", "e4m3fn"))
    topk, edge = int(prm.get("topk", 512)), prm.get("edge")
    reqs = _requests(spec)
    rows: list[tuple[int, int]] = []  # (request, position) of each query row
    for r, (pre, ext) in enumerate(reqs):
        rows += [(r, pre + i) for i in range(ext)]
    t = len(rows)
    # SWA pool: only positions some query can see are materialised; slots are a random permutation
    lo = [max(0, pre - WINDOW + 1) for pre, _ in reqs]
    hi = [pre + ext for pre, ext in reqs]
    n_swa = sum(b - a for a, b in zip(lo, hi))
    perm = torch.randperm(n_swa + 8, generator=gen)[:n_swa] + 1  # slot 0 stays the null slot
    base, start = [], 0
    for a, b in zip(lo, hi):
        base.append(start)
        start += b - a
    swa_keys_rows = torch.randn(n_swa, HEAD_DIM, generator=gen).bfloat16()
    row_req = torch.tensor([r for r, _ in rows], dtype=torch.long)
    row_pos = torch.tensor([p for _, p in rows], dtype=torch.long)
    back = row_pos[:, None] - torch.arange(WINDOW)[None, :]  # position of the k-th newest key
    flat = torch.tensor(base)[row_req][:, None] + back - torch.tensor(lo)[row_req][:, None]
    swa_idx = torch.where(back >= 0, perm[flat.clamp(min=0)], torch.full_like(back, -1)).to(torch.int32)
    swa_len = (row_pos + 1).clamp(max=WINDOW).to(torch.int32)
    swa_keys = torch.zeros(n_swa + 9, HEAD_DIM, dtype=torch.bfloat16)
    swa_keys[perm] = swa_keys_rows
    extra = (None, None, None, None)
    if ratio:
        extra = _extra(rows, reqs, ratio, topk, gen)
    x_idx, x_len, x_keys, x_slots = extra
    if edge == "empty":
        swa_len[::2] = 0
    elif edge == "all_invalid":
        swa_idx.fill_(-1)
        if x_idx is not None:
            x_idx.fill_(-1)
    elif edge == "short":
        swa_len.copy_((swa_len // 2).clamp(min=1))
        if x_len is not None:
            x_len.copy_((x_len // 3).clamp(min=1))
    q = torch.randn(t, h, HEAD_DIM, generator=gen).bfloat16()
    sink = _sink(str(prm.get("sink", "random" if h else "default")), h, gen)
    conv = prm.get("convert_from")
    swa_cache = _write(swa_keys_rows, perm, PAGE_SIZE_BY_RATIO[0], fp8, device, n_swa + 9, conv)
    x_cache = None
    if x_keys is not None:
        x_cache = _write(x_keys[x_slots], x_slots, PAGE_SIZE_BY_RATIO[ratio], fp8, device, x_keys.shape[0], conv)
    dev = lambda x: None if x is None else x.to(device)  # noqa: E731
    return _Scenario(dev(q), dev(sink), swa_cache, dev(swa_idx), dev(swa_len), swa_keys, x_cache,
                     dev(x_idx), dev(x_len), x_keys)


def _extra(rows: list[tuple[int, int]], reqs: tuple[tuple[int, int], ...], ratio: int, topk: int,
           gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Compressed entries of each request in a paged pool (C4: 64 a page, C128: 2 a page) and per-row
    indices: C4 takes all visible entries up to top-k (a random top-k subset beyond it), C128 all."""
    page = PAGE_SIZE_BY_RATIO[ratio]
    n_req = [(pre + ext) // ratio for pre, ext in reqs]
    pages_req = [max(1, -(-n // page)) for n in n_req]
    page_ids = torch.randperm(sum(pages_req) + 2, generator=gen)[: sum(pages_req)] + 1
    tables, s = [], 0
    for n in pages_req:
        tables.append(page_ids[s:s + n])
        s += n
    slot_of = [[int(tables[r][j // page]) * page + j % page for j in range(n)] for r, n in enumerate(n_req)]
    slots_total = (sum(pages_req) + 3) * page
    keys = torch.zeros(slots_total, HEAD_DIM, dtype=torch.bfloat16)
    used = torch.tensor([x for sl in slot_of for x in sl], dtype=torch.long)
    keys[used] = torch.randn(len(used), HEAD_DIM, generator=gen).bfloat16()
    vis = [(p + 1) // ratio for _, p in rows]
    width = _pad64(topk) if ratio == 4 else _pad64(max(vis + [1]))
    idx = torch.full((len(rows), width), -1, dtype=torch.int32)
    lengths = torch.ones(len(rows), dtype=torch.int32)  # clamp-to-1: a single -1 entry counts nothing
    for i, ((r, _), n) in enumerate(zip(rows, vis)):
        chosen = list(range(n))
        if ratio == 4 and n > topk:
            chosen = torch.randperm(n, generator=gen)[:topk].tolist()
        for j, c in enumerate(chosen):
            idx[i, j] = slot_of[r][c]
        lengths[i] = max(len(chosen), 1)
    return idx, lengths, keys, used


def oracle(q: torch.Tensor, sink: torch.Tensor, key_sets: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 attention row by row over explicit key sets (unquantized)."""
    t, h, d = q.shape
    out = torch.zeros(t, h, d, dtype=torch.float64)
    lse = torch.full((t, h), math.inf, dtype=torch.float64)
    qd, sd = q.double().cpu(), sink.double().cpu()
    for i, keys in enumerate(key_sets):
        if keys.shape[0] == 0:
            continue
        k = keys.double()
        s = (qd[i] @ k.T) * SCALE  # [h, n]
        m = s.max(dim=1, keepdim=True).values
        e = torch.exp(s - m)
        row_lse = m[:, 0] + torch.log(e.sum(dim=1))
        o = (e / e.sum(dim=1, keepdim=True)) @ k
        out[i] = o / (1.0 + torch.exp(sd - row_lse))[:, None]
        lse[i] = row_lse
    return out, lse


def _key_sets(idx: torch.Tensor, lengths: torch.Tensor, table: torch.Tensor) -> list[torch.Tensor]:
    sets = []
    for row, n in zip(idx.cpu(), lengths.cpu()):
        sel = row[: int(n)]
        sets.append(table[sel[sel >= 0].long()])
    return sets


def build(spec: CaseSpec, device: torch.device, gen: torch.Generator) -> Fixture:
    sc = build_scenario(spec, device, gen)
    fp8 = str(spec.params.get("convert_from") or sc.swa_cache.fp8)  # conversion is lossless: same values
    # exact values the caches represent, computed from the unquantized keys (bf16-representable)
    swa_exact = exact_dequant(sc.swa_keys, fp8).bfloat16()
    x_exact = None if sc.extra_keys is None else exact_dequant(sc.extra_keys, fp8).bfloat16()
    sets = _key_sets(sc.swa_indices, sc.swa_lengths, swa_exact)
    if x_exact is not None:
        xs = _key_sets(sc.extra_indices, sc.extra_lengths, x_exact)
        sets = [torch.cat([a, b]) for a, b in zip(sets, xs)]
    expected = oracle(sc.q, sc.sink, sets)
    if spec.op == DECODE:
        args = dict(q=sc.q, swa_cache=sc.swa_cache, swa_indices=sc.swa_indices, swa_lengths=sc.swa_lengths,
                    sink=sc.sink, softmax_scale=SCALE, extra_cache=sc.extra_cache, extra_indices=sc.extra_indices,
                    extra_lengths=sc.extra_lengths)
        return Fixture(args, expected, tolerance=TOLERANCES[DECODE])
    # prefill: one bf16 workspace holding every dequantized key row (as production's dequant_gather
    # makes it); per row [extra part | SWA part | -1 pad]
    kv = torch.cat([x_exact, swa_exact]) if x_exact is not None else swa_exact
    off = 0 if sc.extra_keys is None else sc.extra_keys.shape[0]
    parts = []
    for i in range(sc.q.shape[0]):
        row = []
        if sc.extra_indices is not None:
            x = sc.extra_indices[i, : int(sc.extra_lengths[i])].cpu()
            row += x[x >= 0].tolist()
        s = sc.swa_indices[i, : int(sc.swa_lengths[i])].cpu()
        row += [off + v for v in s[s >= 0].tolist()]
        parts.append(row)
    width = max(128, -(-max(len(r) for r in parts) // 128) * 128)
    idx = torch.full((len(parts), width), -1, dtype=torch.int32)
    for i, row in enumerate(parts):
        idx[i, : len(row)] = torch.tensor(row, dtype=torch.int32)
    lengths = torch.tensor([len(r) for r in parts], dtype=torch.int32)
    args = dict(q=sc.q, kv=kv.to(device), indices=idx.to(device), lengths=lengths.to(device), sink=sc.sink,
                softmax_scale=SCALE)
    return Fixture(args, expected, tolerance=TOLERANCES[PREFILL])
