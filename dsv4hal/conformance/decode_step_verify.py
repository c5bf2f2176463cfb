"""MTP verify steps as an engine runs them, inside `platform.decode_step()`: each request carries 1 + k query tokens
at consecutive positions (a chain; k = 1 and 3, two and four tokens per request), for compress ratios 0, 4 and 128.
One step: pack-store every token's key into the request's SWA ring; compress_decode token by token in chain order
(rows sharing a ring must not share a call) for the main compressor and, at ratio 4, the indexer's, storing the
groups they close into the compressed cache (pack_store) and the indexer cache (indexer_store); then sparse attention
for every query, causal within the chain (a draft sees the groups an earlier draft of its chain closed).

Then a ragged accept: request r keeps a_r in [1, 1 + k] tokens (each step has a request at each extreme). The
engine only rewinds positions; nothing is copied back. The rings are laid out so that this is enough
(dsv4hal.speculative): the SWA ring of a request has 128 + k rows (slot = 1 + ring_index * ring + pos % ring), the
compressor state ring is doubled (C4 16, C128 256 rows; row = pos % ring, state[slot] one ring per request).

Checked every step, eager (and on a GPU replayed from one CUDA graph of the step):
- attention of every query against the float64 oracle over the exact dequantized keys the request holds at the
  query's positions (by position, so a ring that loses a live row fails it);
- every compress_decode row against the float64 compressor oracle over the request's history;
- against a clean run, which only ever saw the accepted tokens (same ops, same values): the accepted queries'
  attention, and after the rewind every live row that a later step reads: SWA records of the last 127 positions,
  compressed and indexer cache rows of the closed groups, and compressor ring rows the next group to close pools,
  all byte for byte."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import torch

from dsv4hal.conformance.cases_compress import COMPRESS_ROPE_BASE, closed_group
from dsv4hal.conformance.cases_compress import TOLERANCES as COMPRESS_TOLERANCES
from dsv4hal.conformance.cases_sparse_attention import GRAPH_TOLERANCE, SCALE, TOLERANCES, oracle
from dsv4hal.conformance.cells import Cell, clone_args, copy_into
from dsv4hal.conformance.types import compare_close
from dsv4hal.formats.compressor_state import new_state, window_rows
from dsv4hal.formats.indexer_cache import INDEX_DIM, IndexerPagedCache
from dsv4hal.formats.indexer_cache import PAGE_SIZE as INDEX_PAGE
from dsv4hal.formats.v4_cache import PAGE_SIZE_BY_RATIO, V4PagedCache, exact_dequant, read_records
from dsv4hal.reference.rope import DSV4_YARN, make_rope_table
from dsv4hal.speculative import chain_rows, check_chain, compress_ring, swa_ring

# request 0 accepts one token at step 0 from position 126: its chain closes a group (C4 and C128) and its rejected
# drafts land on ring rows that group pools unless the ring is doubled; request 1 has almost no history
CONTEXTS = (126, 5, 254, 381)
STEPS = 3
TOKENS_PER_REQUEST = (2, 4)
RATIOS = (0, 4, 128)
H_Q, TOPK, D = 64, 512, 512
DECODE, COMPRESS = "sparse_attention_decode", "compress_decode"


def case_name(ratio: int, tpr: int, kind: str = "eager") -> str:
    return f"ratio{ratio}/tpr{tpr}/{kind}"


@dataclass(frozen=True)
class Layout:
    """Ring sizes of a verify run (rows): the recipe's by default; tests pass smaller ones to see the checks bite."""

    tpr: int
    swa_ring: int
    compress_ring: int

    @classmethod
    def recipe(cls, ratio: int, tpr: int) -> Layout:
        return cls(tpr, swa_ring(tpr), compress_ring(ratio, tpr) if ratio else 0)


@dataclass
class _Compressor:
    name: str  # "main" (hd 512, into the compressed cache) or "index" (hd 128, Hadamard, into the indexer cache)
    hd: int
    hadamard: bool
    ape: torch.Tensor
    weight: torch.Tensor

    @property
    def width(self) -> int:
        return 2 * (self.ape.shape[1])


class _Bench:
    """A small batch's keys by position (what the oracles read) and the platform state of one run."""

    def __init__(self, platform: Any, ratio: int, layout: Layout, gen: torch.Generator) -> None:
        self.p, self.ratio, self.lay, self.gen = platform, ratio, layout, gen
        self.dev, self.fp8 = torch.device(platform.device_type), platform.info.fp8
        b = self.b = len(CONTEXTS)
        span = self.span = max(CONTEXTS) + STEPS * layout.tpr + 1
        self.last = torch.tensor(CONTEXTS) - 1  # last accepted position of each request
        self.ring_of = torch.randperm(b, generator=gen)  # request -> its SWA ring and compressor state slot - 1
        self.swa_keys = torch.zeros(b, span, D, dtype=torch.bfloat16)
        n_swa = 1 + b * layout.swa_ring
        st: dict[str, Any] = {"swa": V4PagedCache.empty(-(-n_swa // 256), 256, self.fp8, self.dev)}
        self.comps: list[_Compressor] = []
        if ratio:
            groups = self.groups = span // ratio + 1
            self.x_slot = torch.randperm(b * groups + 5, generator=gen)[: b * groups].view(b, groups) + 1
            self.x_keys = torch.zeros(b, groups, D, dtype=torch.bfloat16)
            page = PAGE_SIZE_BY_RATIO[ratio]
            st["x"] = V4PagedCache.empty(-(-(b * groups + 6) // page), page, self.fp8, self.dev)
            coff = 2 if ratio == 4 else 1
            self.comps.append(_Compressor("main", D, False, 0.5 * torch.randn(ratio, coff * D, generator=gen),
                                          1.0 + 0.1 * torch.randn(D, generator=gen)))
            if ratio == 4:
                self.comps.append(_Compressor("index", INDEX_DIM, True, 0.5 * torch.randn(4, 2 * INDEX_DIM,
                                                                                           generator=gen),
                                              1.0 + 0.1 * torch.randn(INDEX_DIM, generator=gen)))
                st["idx"] = IndexerPagedCache.empty(-(-(b * groups + 6) // INDEX_PAGE), self.fp8, self.dev)
            self.cos, self.sin = make_rope_table(span + ratio, COMPRESS_ROPE_BASE, DSV4_YARN)
            self.hist = {c.name: torch.zeros(b, span, c.width) for c in self.comps}
            self.on_device = {c.name: tuple(t.to(self.dev) for t in (self.cos, self.sin, c.ape, c.weight))
                              for c in self.comps}  # the ops' parameters, copied once (no copy in a captured step)
            for c in self.comps:
                st[c.name] = new_state(b + 1, ratio, c.width, self.dev, ring=layout.compress_ring)
        self.state = st
        self._history()

    # ------------------------------------------------------------------ layout
    def swa_slot(self, req: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        return 1 + self.ring_of[req] * self.lay.swa_ring + pos % self.lay.swa_ring

    def _history(self) -> None:
        """What a prefill left: the last 128 keys in the SWA rings, the closed groups' rows in the compressed and
        indexer caches, the compressor rings' rows (written by the platform's stores; rings seeded directly)."""
        ops, st = self.p.ops, self.state
        for r, ctx in enumerate(CONTEXTS):
            pos = torch.arange(max(0, ctx - 128), ctx)
            keys = torch.randn(len(pos), D, generator=self.gen).bfloat16()
            self.swa_keys[r, pos] = keys
            ops.pack_store(keys.to(self.dev), self.swa_slot(torch.full_like(pos, r), pos).to(self.dev), st["swa"])
            if not self.ratio:
                continue
            n = ctx // self.ratio
            keys = torch.randn(n, D, generator=self.gen).bfloat16()
            self.x_keys[r, :n] = keys
            loc = self.x_slot[r, :n].to(self.dev)
            ops.pack_store(keys.to(self.dev), loc, st["x"])
            if "idx" in st:
                ops.indexer_store(torch.randn(n, INDEX_DIM, generator=self.gen).to(self.dev), loc, st["idx"])
            pos = torch.arange(max(0, ctx - self.lay.compress_ring), ctx)
            for c in self.comps:
                rows = self._kv_rows(len(pos), c)
                self.hist[c.name][r, pos] = rows
                st[c.name][int(self.ring_of[r]) + 1, pos % self.lay.compress_ring] = rows.to(self.dev)

    def _kv_rows(self, n: int, c: _Compressor) -> torch.Tensor:
        rows = torch.randn(n, c.width, generator=self.gen)
        rows[:, c.width // 2:] *= 2.0  # wider scores: the softmax far from uniform
        return rows

    # ------------------------------------------------------------------ one step
    def draft(self, step: int) -> dict[str, Any]:
        """The chain of every request (positions last + 1 ...), its values, and the accept lengths."""
        tpr, b = self.lay.tpr, self.b
        req, pos = chain_rows(b, tpr, self.last + 1)
        check_chain(req, pos)
        t = b * tpr
        d = dict(req=req, pos=pos, k_swa=torch.randn(t, D, generator=self.gen).bfloat16(),
                 q=torch.randn(t, H_Q, D, generator=self.gen).bfloat16(), sink=torch.randn(H_Q, generator=self.gen))
        self.swa_keys[req, pos] = d["k_swa"]
        for c in self.comps:
            d[c.name] = self._kv_rows(t, c)
            self.hist[c.name][req, pos] = d[c.name]
        accept = torch.randint(1, tpr + 1, (b,), generator=self.gen)
        accept[step % b], accept[(step + 1) % b] = 1, tpr
        d["accept"] = accept
        return d

    def inputs(self, d: dict[str, Any], keep: torch.Tensor) -> tuple[dict[str, Any], torch.Tensor]:
        """The ops' inputs for the rows `keep` selects (all: the verify run; the accepted: the clean run), and the
        order of the compressed rows (indices into the chain's rows, token by token of the chain)."""
        rows = keep.nonzero().squeeze(1)
        req, pos = d["req"][rows], d["pos"][rows]
        back = pos[:, None] - torch.arange(128)[None, :]
        swa_idx = torch.where(back >= 0, self.swa_slot(req[:, None].expand_as(back), back.clamp(min=0)), -1)
        inp: dict[str, Any] = dict(k_swa=d["k_swa"][rows], swa_loc=self.swa_slot(req, pos), q=d["q"][rows],
                                   sink=d["sink"], swa_indices=swa_idx.int(),
                                   swa_lengths=(pos + 1).clamp(max=128).int())
        order = torch.zeros(0, dtype=torch.long)
        if self.ratio:
            offset = d["pos"] - (self.last + 1)[d["req"]]
            order = torch.cat([rows[offset[rows] == j] for j in range(self.lay.tpr)])
            per_j = [rows[offset[rows] == j] for j in range(self.lay.tpr)]
            per_j = [i for i in per_j if i.numel()]
            inp["slots"] = [(self.ring_of[d["req"][i]] + 1).int() for i in per_j]
            inp["positions"] = [d["pos"][i].int() for i in per_j]
            for c in self.comps:
                inp[c.name] = [d[c.name][i] for i in per_j]
            o_req, o_pos = d["req"][order], d["pos"][order]
            closes = (o_pos + 1) % self.ratio == 0
            inp["x_loc"] = torch.where(closes, self.x_slot[o_req, ((o_pos + 1) // self.ratio - 1).clamp(min=0)], -1)
            n = (pos + 1) // self.ratio
            width = TOPK if self.ratio == 4 else -(-self.groups // 64) * 64
            idx = torch.full((len(rows), width), -1, dtype=torch.int32)
            for i in range(len(rows)):
                m = int(n[i])
                sel = torch.arange(max(0, m - width), m)
                idx[i, : len(sel)] = self.x_slot[req[i], sel].int()
            inp.update(extra_indices=idx, extra_lengths=n.clamp(min=1, max=width).int())
        return {k: _to(v, self.dev) for k, v in inp.items()}, order

    def run(self, st: dict[str, Any], inp: dict[str, Any]) -> tuple[Any, dict[str, torch.Tensor]]:
        """The step's ops on state `st`: (attention output and lse, compressed rows by compressor)."""
        ops, ratio = self.p.ops, self.ratio
        with self.p.decode_step():
            ops.pack_store(inp["k_swa"], inp["swa_loc"], st["swa"])
            rows, extra = {}, {}
            for c in self.comps:
                cos, sin, ape, w = self.on_device[c.name]
                rows[c.name] = torch.cat([ops.compress_decode(kv, st[c.name], s, p, ape, w, cos, sin, ratio,
                                                              hadamard=c.hadamard)
                                          for kv, s, p in zip(inp[c.name], inp["slots"], inp["positions"])])
            if ratio:
                ops.pack_store(rows["main"].bfloat16(), inp["x_loc"], st["x"])
                if "index" in rows:
                    ops.indexer_store(rows["index"], inp["x_loc"], st["idx"])
                extra = dict(extra_cache=st["x"], extra_indices=inp["extra_indices"],
                             extra_lengths=inp["extra_lengths"])
            out = ops.sparse_attention_decode(inp["q"], st["swa"], inp["swa_indices"], inp["swa_lengths"],
                                              inp["sink"], SCALE, **extra)
        return out, rows

    # ------------------------------------------------------------------ expected values
    def expected_rows(self, d: dict[str, Any], order: torch.Tensor) -> dict[str, torch.Tensor]:
        """float64 compressor rows (token by token of the chain) from each request's history by position."""
        out = {}
        for c in self.comps:
            rows = []
            for i in order.tolist():
                r, p = int(d["req"][i]), int(d["pos"][i])
                if (p + 1) % self.ratio:
                    rows.append(torch.zeros(c.hd, dtype=torch.float64))
                    continue
                base = max(0, p + 1 - window_rows(self.ratio))
                rows.append(closed_group(self.hist[c.name][r, base:p + 1], base, p, self.ratio, c.ape, c.weight,
                                         self.cos, self.sin, c.hadamard))
            out[c.name] = torch.stack(rows)
        return out

    def expected_attention(self, d: dict[str, Any], inp: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """float64 attention over the exact dequantized keys each query's positions and groups hold."""
        sets = []
        for i in range(d["req"].numel()):
            r, p = int(d["req"][i]), int(d["pos"][i])
            keys = self.swa_keys[r, max(0, p - 127):p + 1]
            if self.ratio:
                n = int(inp["extra_lengths"][i])
                sel = inp["extra_indices"][i, :n].cpu()
                groups = (self.x_slot[r][None, :] == sel[sel >= 0][:, None].long()).nonzero()[:, 1]
                keys = torch.cat([keys, self.x_keys[r, groups]])
            sets.append(exact_dequant(keys, self.fp8).bfloat16())
        return oracle(d["q"], d["sink"], sets)

    def record_closed(self, d: dict[str, Any], order: torch.Tensor, rows: torch.Tensor) -> None:
        """The compressed keys the step stored (what later queries attend to), by request and group."""
        pos = d["pos"][order]
        closes = ((pos + 1) % self.ratio == 0).nonzero().squeeze(1)
        self.x_keys[d["req"][order][closes], (pos[closes] + 1) // self.ratio - 1] = rows[closes].cpu().bfloat16()

    # ------------------------------------------------------------------ live state
    def live_mismatches(self, a: dict[str, Any], b: dict[str, Any]) -> dict[str, int]:
        """Rows a later step reads that differ between states a and b (after the rewind: self.last)."""
        bad = {"swa": 0, "compressed": 0, "indexer": 0, "rings": 0}
        for r in range(self.b):
            last = int(self.last[r])
            pos = torch.arange(max(0, last - 126), last + 1)
            bad["swa"] += _records_differ(a["swa"], b["swa"], self.swa_slot(torch.full_like(pos, r), pos).to(self.dev))
            if not self.ratio:
                continue
            loc = self.x_slot[r, : (last + 1) // self.ratio].to(self.dev)
            bad["compressed"] += _records_differ(a["x"], b["x"], loc)
            if "idx" in a:
                pg, off = loc // INDEX_PAGE, loc % INDEX_PAGE
                va, vb = a["idx"].values()[pg, off], b["idx"].values()[pg, off]
                sa, sb = a["idx"].scales()[pg, off], b["idx"].scales()[pg, off]
                bad["indexer"] += int(((va != vb).any(1) | (sa.view(torch.int32) != sb.view(torch.int32))).sum())
            nxt = -(-(last + 2) // self.ratio) * self.ratio - 1  # the next position that closes a group
            live = torch.arange(max(0, nxt - window_rows(self.ratio) + 1), last + 1) % self.lay.compress_ring
            slot = int(self.ring_of[r]) + 1
            for c in self.comps:
                diff = a[c.name][slot, live.to(self.dev)].view(torch.int32) != b[c.name][slot, live.to(self.dev)].view(
                    torch.int32)
                bad["rings"] += int(diff.any(1).sum())
        return {k: v for k, v in bad.items() if v}


def _to(x: Any, dev: torch.device) -> Any:
    if isinstance(x, list):
        return [_to(v, dev) for v in x]
    return x.to(dev) if isinstance(x, torch.Tensor) else x


def _records_differ(a: V4PagedCache, b: V4PagedCache, loc: torch.Tensor) -> int:
    ra, rb = read_records(a, loc), read_records(b, loc)
    diff = (ra.nope != rb.nope).any(1) | (ra.scale_exp != rb.scale_exp).any(1) | (
        ra.rope.view(torch.int16) != rb.rope.view(torch.int16)).any(1)
    return int(diff.sum())


def _rows_of(out: Any, rows: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return tuple(t[rows.to(t.device)] for t in out)


class _Verdict:
    def __init__(self) -> None:
        self.worst, self.ok, self.detail = 0.0, True, []

    def add(self, what: str, result: tuple[float, bool, str]) -> None:
        err, good, d = result
        self.worst, self.ok = max(self.worst, err), self.ok and good
        if not good:
            self.detail.append(f"{what}: {d}")

    def state(self, what: str, bad: dict[str, int]) -> None:
        if bad:
            self.ok = False
            self.detail.append(f"{what}: live rows differ from the clean run {bad}")


def verify_run(platform: Any, ratio: int, layout: Layout, seed: int = 0, capture: Any = None) -> dict[str, _Verdict]:
    """STEPS verify steps with ragged accepts; the verdict of the eager run and, on a GPU, of one CUDA graph of the
    step replayed (capture: dsv4hal.cuda_graphs.capture's stand-in, to run the replay protocol elsewhere)."""
    bench = _Bench(platform, ratio, layout, torch.Generator().manual_seed(seed + 1000 * layout.tpr + ratio))
    graphs = bench.dev.type == "cuda" or capture is not None
    if graphs and capture is None:
        from dsv4hal.cuda_graphs import capture
    eager, clean = bench.state, clone_args(bench.state)
    graph_state = clone_args(bench.state) if graphs else None
    verdicts = {"eager": _Verdict(), "graph": _Verdict()}
    graph, static, g_out = None, None, None
    for step in range(STEPS):
        d = bench.draft(step)
        all_rows = torch.ones(d["req"].numel(), dtype=torch.bool)
        accepted = d["pos"] - (bench.last + 1)[d["req"]] < d["accept"][d["req"]]
        inp, order = bench.inputs(d, all_rows)
        out, rows = bench.run(eager, inp)
        clean_out, _ = bench.run(clean, bench.inputs(d, accepted)[0])
        v = verdicts["eager"]
        want_rows = bench.expected_rows(d, order)
        for c in bench.comps:
            v.add(f"step {step} {COMPRESS} {c.name}", compare_close(rows[c.name], want_rows[c.name],
                                                                   COMPRESS_TOLERANCES[COMPRESS]))
        if ratio:
            bench.record_closed(d, order, rows["main"])
        want = bench.expected_attention(d, inp)
        v.add(f"step {step} attention", compare_close(out, want, TOLERANCES[DECODE]))
        acc = accepted.nonzero().squeeze(1)
        v.add(f"step {step} accepted vs clean", compare_close(_rows_of(out, acc), clean_out, TOLERANCES[DECODE]))
        if graphs:
            g = verdicts["graph"]
            if graph is None:  # captured once on step 0's buffers; the warm-up writes what the replay writes
                static = clone_args(inp)
                graph, g_out = capture(lambda s=static: bench.run(graph_state, s))
            copy_into(static, inp)
            graph.replay()
            if bench.dev.type == "cuda":
                torch.cuda.synchronize()
            g.add(f"step {step} graph vs oracle", compare_close(g_out[0], want, GRAPH_TOLERANCE))
            g.add(f"step {step} graph vs eager", compare_close(g_out[0], out, TOLERANCES[DECODE]))
        bench.last += d["accept"]  # the rewind: positions only
        v.state(f"after step {step}", bench.live_mismatches(eager, clean))
        if graphs:
            verdicts["graph"].state(f"graph, after step {step}", bench.live_mismatches(graph_state, clean))
    return verdicts


def verify_cases(pattern: re.Pattern[str] | None = None) -> tuple[tuple[int, int], ...]:
    """(ratio, tokens per request) of the verify cells whose case names the pattern matches (None: all)."""
    return tuple((r, t) for r in RATIOS for t in TOKENS_PER_REQUEST
                 if pattern is None or any(pattern.search(case_name(r, t, k)) for k in ("eager", "graph")))


def verify_cells(platform: Any, seed: int = 0, cases: tuple[tuple[int, int], ...] | None = None) -> list[Cell]:
    """Cells of op decode_step, mode verify: per (ratio, tokens per request) an eager case and a graph case."""
    cases = cases or verify_cases()
    ops = ["pack_store", COMPRESS, "indexer_store", DECODE]
    on_gpu = platform.device_type == "cuda"
    cells = []
    for ratio, tpr in cases:
        used = ops[:1] + ([COMPRESS] if ratio else []) + (["indexer_store"] if ratio == 4 else []) + [DECODE]
        impl = " + ".join(dict.fromkeys(platform.explain(op).chosen.name for op in used))
        verdicts = verify_run(platform, ratio, Layout.recipe(ratio, tpr), seed)
        for kind, v in verdicts.items():
            tol = GRAPH_TOLERANCE if kind == "graph" else TOLERANCES[DECODE]
            cell = Cell("decode_step", impl, case_name(ratio, tpr, kind), "verify", ratio, platform.name,
                        "pass" if v.ok else "fail", v.worst,
                        tolerance={"atol": tol.atol, "rtol": tol.rtol, "reason": tol.reason + "; live state after "
                                   "each rewind byte-equal to a run that saw only the accepted tokens"},
                        detail="; ".join(v.detail)[:400])
            if kind == "graph" and not on_gpu:
                cell.status, cell.max_error, cell.detail = "not-run", None, "CUDA graphs need a GPU"
            cells.append(cell)
    return cells
