"""The demo's model: random weights with DSV4's structure (three layers: SWA only, C4 with the lightning indexer,
C128; each followed by MoE and wrapped in mHC), its paged caches and compressor rings, and the forward pass
through `platform.ops` (prefill and decode). `fill_random` fills the caches as a prefill would, without its
compute."""

from __future__ import annotations

from typing import Any

import torch

import dsv4hal
from dsv4hal.distributed.tp import pad_heads
from dsv4hal.engine_model.config import C4_TOPK, D_HEAD, PAGE, RATIOS, ROPE, DemoConfig
from dsv4hal.engine_model.timers import OpTimer
from dsv4hal.formats.compressor_state import new_state
from dsv4hal.formats.indexer_cache import INDEX_DIM, IndexerPagedCache
from dsv4hal.formats.v4_cache import PAGE_SIZE_BY_RATIO, V4PagedCache
from dsv4hal.rope import make_rope_table
from dsv4hal.speculative import compress_ring

INDEX_HEADS = 64  # the lightning indexer's query heads (each INDEX_DIM wide)
# V4's FP8 block-scaled projections (spec 5.1), wq_a and wkv as the one fused wqkv_a; wo_a [G, o_lora, H/G*512] is
# the grouped one (fp8_grouped_linear)
FP8_LINEARS = ("wqkv_a", "wq_b", "wo_a", "wo_b", "wq_idx")


def _rms(x: torch.Tensor, w: torch.Tensor | None = None, eps: float = 1e-6) -> torch.Tensor:
    """RMSNorm over the last dim in fp32, through torch's rms_norm (one fused kernel on CUDA, as an engine's norm
    is, where float, pow, mean, rsqrt and multiply would be five)."""
    return torch.nn.functional.rms_norm(x.float(), (x.shape[-1],), w, eps)


def _rms_bf16(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """_rms(x).bfloat16() for a bf16 x with no weight in one kernel: torch's norm reads bf16, computes in fp32 and
    rounds once on the store (the fp32 path's copies in and out are two more launches)."""
    return torch.nn.functional.rms_norm(x, (x.shape[-1],), None, eps)


def _linear_f32(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x bf16 [T, in] @ w bf16 [out, in]^T with fp32 output: SGLang's linear_bf16_fp32 for the router gate, the
    compressor's wkv/wgate and the indexer's projections (spec 4.1, 5.1). On CUDA one bf16 tensor-core GEMM that
    accumulates and writes fp32 (torch.mm's out_dtype), not an fp32 (FFMA) GEMM on fp32 weights; elsewhere the same
    products in fp32."""
    if x.is_cuda:
        return torch.mm(x, w.t(), out_dtype=torch.float32)
    return x.float() @ w.float().T


def _rope_(x: torch.Tensor, cis: torch.Tensor) -> torch.Tensor:
    """x with its last ROPE dims rotated in place by cis (complex64 [..., ROPE / 2], e^(i angle) of each pair at the
    row's position; its conjugate rotates back): apply_rope's interleaved-pair rotation in fp32 as one complex
    product, three launches (up, multiply, back into x's slice) where the real form takes about ten; returns x."""
    tail = x[..., -ROPE:]
    z = torch.view_as_complex(tail.float().unflatten(-1, (ROPE // 2, 2)))
    tail.copy_(torch.view_as_real(z * cis).flatten(-2))
    return x


def rope_cis(cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The complex rotation table (cos + i sin, complex64 [max_pos, ROPE / 2]) of a cos/sin table."""
    return torch.complex(cos.float(), sin.float())


class DemoModel:
    """Random weights with DSV4's structure (scaled down), caches, and the forward pass."""

    def __init__(self, platform: Any, cfg: DemoConfig, batch: int, seed: int = 0, ops: Any = None,
                 tokens_per_request: int = 1, swa_ring: bool = False) -> None:
        """tokens_per_request: query tokens of a request in a decode step (1; 1 + k for an MTP verify step, whose
        compressor rings are then doubled, dsv4hal.speculative). swa_ring: the SWA cache holds one 256-slot page a
        request, written as a ring (slot = position % 256, through full_to_swa), as an engine keeps only the window;
        for decoding after fill_random (a prefill attends to older keys of its own prompt, which a ring overwrites).
        Without it the SWA cache mirrors the full pool, which at 1M context and batch 64 would not fit a GPU."""
        self.p, self.cfg, self.b, self.tpr = platform, cfg, batch, tokens_per_request
        # the query heads and output groups this model computes, and the head count attention runs (a
        # tensor-parallel rank holds a share of them: dsv4hal.engine_model.tp_model)
        self.q_heads, self.q_heads_padded, self.o_groups = cfg.heads, cfg.heads, cfg.o_groups
        self.ops = ops if ops is not None else platform.ops
        dev = self.dev = torch.device(platform.device_type)
        g = torch.Generator(dev if cfg.draw_on_device else "cpu").manual_seed(seed)
        d, h = cfg.hidden, cfg.heads

        def randn(*shape: int) -> torch.Tensor:
            return torch.randn(*shape, generator=g, device=g.device)

        def rnd(*shape: int, scale: float = 1.0, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
            return (randn(*shape) * scale).to(dtype).to(dev)

        self.cos, self.sin = (t.to(dev) for t in make_rope_table(cfg.max_pages * PAGE, 10000.0))
        self.cis = rope_cis(self.cos, self.sin)
        pages = batch * cfg.max_pages
        self.page_table = (torch.arange(pages).view(batch, cfg.max_pages) + 1).int().to(dev)  # page 0: null
        self.swa_ring = swa_ring
        if swa_ring:  # full-pool page p = r * max_pages + j + 1 of request r -> SWA page r + 1, same offsets
            owner = torch.arange(pages) // cfg.max_pages + 1
            ring = (owner[:, None] * PAGE + torch.arange(PAGE)).flatten()
            self.full_to_swa = torch.cat([torch.full((PAGE,), -1), ring]).int().to(dev)
        else:
            self.full_to_swa = torch.arange((pages + 1) * PAGE, device=dev)
        swa_pages = batch + 1 if swa_ring else pages + 1
        self.layers = []
        group_in = h * D_HEAD // cfg.o_groups
        for ratio in RATIOS:
            w: dict[str, Any] = {
                "ratio": ratio, "wq_a": rnd(cfg.q_lora, d, scale=d ** -0.5),
                "wq_b": rnd(h * D_HEAD, cfg.q_lora, scale=cfg.q_lora ** -0.5),
                "wkv": rnd(D_HEAD, d, scale=d ** -0.5), "kv_norm": torch.ones(D_HEAD, device=dev),
                "wo_a": rnd(cfg.o_groups, cfg.o_lora, group_in, scale=group_in ** -0.5),
                "wo_b": rnd(d, cfg.o_groups * cfg.o_lora, scale=(cfg.o_groups * cfg.o_lora) ** -0.5),
                "sink": rnd(h, dtype=torch.float32), "router": rnd(cfg.experts, d, scale=d ** -0.5),
                "bias": rnd(cfg.experts, scale=0.1, dtype=torch.float32),
                "swa": V4PagedCache.empty(swa_pages, PAGE, platform.info.fp8, dev),
            }
            for name in ("attn", "ffn"):
                w[f"hc_{name}"] = (rnd(24, 4 * d, scale=0.01, dtype=torch.float32), torch.zeros(24, device=dev),
                                   torch.ones(3, device=dev))
            # prepared for a decode step's token count, as an engine serving this batch would
            w["experts"] = self.ops.moe_experts.prepare_weights(self._experts(randn),
                                                                tokens=batch * tokens_per_request)
            if ratio:
                coff = 2 if ratio == 4 else 1
                w.update(wkv_gate=rnd(2 * coff * D_HEAD, d, scale=d ** -0.5),
                         ape=rnd(ratio, coff * D_HEAD, scale=0.1, dtype=torch.float32),
                         c_norm=torch.ones(D_HEAD, device=dev),
                         # compressed page p holds the rows of full-pool page p (group_slots): one page each
                         extra=V4PagedCache.empty(pages + 1, PAGE_SIZE_BY_RATIO[ratio], platform.info.fp8, dev))
            if ratio == 4:
                w.update(wq_idx=rnd(INDEX_HEADS * INDEX_DIM, cfg.q_lora, scale=cfg.q_lora ** -0.5),
                         w_proj=rnd(INDEX_HEADS, d, scale=d ** -0.5),
                         idx_gate=rnd(2 * 2 * INDEX_DIM, d, scale=d ** -0.5),
                         idx_ape=rnd(4, 2 * INDEX_DIM, scale=0.1, dtype=torch.float32),
                         idx_norm=torch.ones(INDEX_DIM, device=dev),
                         idx_cache=IndexerPagedCache.empty(pages + 1, platform.info.fp8, dev))
            if ratio:  # compressor state rings, one per request (slot = request index)
                ring = compress_ring(ratio, tokens_per_request)
                w["state"] = new_state(batch, ratio, w["wkv_gate"].shape[0], dev, ring=ring)
                if ratio == 4:
                    w["idx_state"] = new_state(batch, 4, w["idx_gate"].shape[0], dev, ring=ring)
            if cfg.fp8_linears:  # (FP8 codes, block scales) in place of the bf16 weight
                # wq_a and wkv read the same input: as an engine fuses them, one GEMM (and one quantization of the
                # input) makes both; their row counts are whole 128-row blocks, so the block scales are the same
                w["wqkv_a"] = torch.cat([w.pop("wq_a"), w.pop("wkv")])
                for name in FP8_LINEARS:
                    if name in w:
                        w[name] = dsv4hal.quantize_fp8_block(w[name], platform.info.fp8)
            self.layers.append(w)

    def offload_c4(self, fraction: float = 0.25) -> None:
        """Move the C4 pool (the page ids the page table addresses) to pinned host memory, with a device working
        set of `fraction` of its pages, raised to the distinct pages one decode step can select (dsv4hal.offload)."""
        from dsv4hal.offload.pool import OffloadedPool

        w = next(layer for layer in self.layers if layer["ratio"] == 4)
        used = self.b * self.cfg.max_pages + 1  # C4 page id = SWA page id: pages past the table are never read
        host = V4PagedCache(w["extra"].data[:used].cpu(), w["extra"].page_size, w["extra"].fp8)
        step_pages = min(self.b * self.tpr * C4_TOPK, self.b * self.cfg.max_pages)
        working = min(used, max(int(used * fraction), step_pages, 1))
        w["pool"] = OffloadedPool(self.p, 0, working, host=host, device=self.dev, min_step_pages=step_pages)
        w["extra"] = w["pool"].host  # the device copy is released

    def _experts(self, randn: Any) -> Any:
        """MXFP4 routed experts, quantized in chunks where they are drawn (a V4-Flash layer has 6.4e9 weights)."""
        c = self.cfg
        e, d, i = c.experts, c.hidden, c.inter
        chunk = max(1, (1 << 28) // (3 * d * i))
        parts = [dsv4hal.quantize_experts(randn(min(chunk, e - s), 2 * i, d) * d ** -0.5,
                                  randn(min(chunk, e - s), d, i) * i ** -0.5, "mxfp4") for s in range(0, e, chunk)]
        fields = ("w13", "w13_scale", "w2", "w2_scale")
        return dsv4hal.ExpertWeights("mxfp4", *(torch.cat([getattr(q, f) for q in parts]).to(self.dev) for f in fields))

    def loc(self, req: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        return self.page_table[req, pos // PAGE].long() * PAGE + pos % PAGE

    def swa_loc(self, req: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """The SWA cache slot of (request, position): its full-pool slot through full_to_swa."""
        loc = self.loc(req, pos)
        return self.full_to_swa[loc].long() if self.swa_ring else loc

    def forward(self, x: torch.Tensor, req: torch.Tensor, pos: torch.Tensor, timer: OpTimer,
                decode: bool = False) -> torch.Tensor:
        """x bf16 [T, d] (token embeddings); rows are (request, position) pairs, positions ascending; a decode
        step has tokens_per_request rows per request, request-major, at consecutive positions (a chain)."""
        ops = self.ops
        stream = x[:, None, :].expand(-1, 4, -1).contiguous()
        rows_pt = self.page_table[req]
        pos32 = pos.int()
        with timer("build_attention_metadata"):
            meta = ops.build_attention_metadata(pos32, rows_pt, self.full_to_swa)
        cis = self.cis[pos]
        # what every layer of the step shares, computed once: the rotation at each row's position (and back), the
        # rows' SWA slots and page-table rows, and the compressed-row slots per ratio (_compress_slots)
        self.step = {"cis": cis, "cis_back": cis.conj().resolve_conj(), "swa_loc": self.swa_loc(req, pos),
                     "pos32": pos32, "req32": req.int(), "table": rows_pt, "slots": {}}
        self.layer_outputs = []
        ffn = None  # the previous sublayer's output, mixed in at the next boundary
        for w in self.layers:
            # each boundary between sublayers is one mhc_post_pre (post of one, pre of the next)
            if ffn is None:
                with timer("mhc_pre"):
                    y, post, comb = ops.mhc_pre(stream, *w["hc_attn"])
            else:
                with timer("mhc_post_pre"):
                    stream, y, post, comb = ops.mhc_post_pre(ffn, stream, post, comb, *w["hc_attn"])
                self.layer_outputs.append(stream.mean(1, dtype=torch.float32))
            a = _rms_bf16(y)
            attn = self._attention(w, a, req, pos, meta, timer, decode)
            with timer("mhc_post_pre"):
                stream, y, post, comb = ops.mhc_post_pre(attn, stream, post, comb, *w["hc_ffn"])
            a = _rms_bf16(y)
            logits = _linear_f32(a, w["router"])  # the engine's router projection: outside the op's range
            with timer("moe_route"):
                ids, tw = ops.moe_route(logits, w["bias"])
            ffn = self._moe(w, a, ids, tw, timer, decode)
        with timer("mhc_post"):
            stream = ops.mhc_post(ffn, stream, post, comb)
        self.layer_outputs.append(stream.mean(1, dtype=torch.float32))
        return self.layer_outputs[-1]

    def _moe(self, w: dict, a: torch.Tensor, ids: torch.Tensor, tw: torch.Tensor, timer: OpTimer,
             decode: bool) -> torch.Tensor:
        """A layer's routed experts on its tokens (an expert-parallel model moves them to the experts' ranks here:
        dsv4hal.engine_model.ep_model)."""
        with timer("moe_experts"):
            return self.ops.moe_experts(a, ids, tw, w["experts"])

    def _attention(self, w: dict, a: torch.Tensor, req: torch.Tensor, pos: torch.Tensor, meta: Any,
                   timer: OpTimer, decode: bool) -> torch.Tensor:
        ops, t, h, step = self.ops, a.shape[0], self.q_heads, self.step
        cis = step["cis"]
        q_a, kv_a = self._q_kv_a(a, w, timer)
        q_lora = _rms_bf16(q_a)
        q = _rope_(_rms_bf16(self._proj(q_lora, w["wq_b"], timer).view(t, h, D_HEAD)), cis[:, None])
        kv = _rope_(_rms(kv_a, w["kv_norm"]), cis).bfloat16()
        with timer("pack_store"):
            ops.pack_store(kv, step["swa_loc"], w["swa"])
        extra: dict[str, Any] = {}
        if w["ratio"]:
            self._compress(w, a, req, pos, timer, decode)
            if w["ratio"] == 4:
                pages = self._indexer(w, a, q_lora, req, pos, meta, timer)
                if "pool" in w:  # offloaded: the selected pages fetched into the working set, the indices remapped
                    with timer("offload_fetch"):
                        pages = w["pool"].fetch(pages, side_stream=pages.is_cuda)
                extra = dict(extra_cache=w["pool"].working if "pool" in w else w["extra"], extra_indices=pages,
                             extra_lengths=meta.c4_lengths)
            else:
                extra = dict(extra_cache=w["extra"], extra_indices=meta.c128_indices,
                             extra_lengths=meta.c128_lengths)
        q = pad_heads(q, self.q_heads_padded)  # zero heads up to the count the kernel runs (sink padded likewise)
        with timer("sparse_attention_decode"):
            o, _ = ops.sparse_attention_decode(q, w["swa"], meta.swa_indices, meta.swa_lengths, w["sink"],
                                               D_HEAD ** -0.5, **extra)
        o = _rope_(o[:, :h], step["cis_back"][:, None])
        o = o.reshape(t, self.o_groups, -1)
        if isinstance(w["wo_a"], tuple):
            with timer("fp8_grouped_linear"):
                o = self.ops.fp8_grouped_linear(o, *w["wo_a"])
        else:
            o = torch.einsum("tgk,gok->tgo", o, w["wo_a"])
        return self._output(o.reshape(t, -1), w, timer)

    def _output(self, o: torch.Tensor, w: dict, timer: OpTimer) -> torch.Tensor:
        """The output projection's second GEMM (a tensor-parallel rank's partial sum, all-reduced, in tp_model)."""
        return self._proj(o, w["wo_b"], timer).bfloat16()

    def _q_kv_a(self, a: torch.Tensor, w: dict, timer: OpTimer) -> tuple[torch.Tensor, torch.Tensor]:
        """The query's and the KV's first projections of the normed input: one GEMM through the fused weight
        (wqkv_a) where the layer has it, else two."""
        if "wqkv_a" in w:
            return self._proj(a, w["wqkv_a"], timer).split((self.cfg.q_lora, D_HEAD), dim=1)
        return self._proj(a, w["wq_a"], timer), self._proj(a, w["wkv"], timer)

    def _proj(self, x: torch.Tensor, weight: Any, timer: OpTimer, fp32_out: bool = False) -> torch.Tensor:
        """x bf16 [T, K] @ weight^T: the fp8_linear op on (FP8 codes, block scales), else a bf16 GEMM (with fp32
        output where the bf16 model computes the product in fp32: _linear_f32)."""
        if isinstance(weight, tuple):
            with timer("fp8_linear"):
                return self.ops.fp8_linear(x, *weight)
        return _linear_f32(x, weight) if fp32_out else x @ weight.T

    def _compress(self, w: dict, a: torch.Tensor, req: torch.Tensor, pos: torch.Tensor, timer: OpTimer,
                  decode: bool) -> None:
        """Compressed rows closed by these tokens go to the C4/C128 cache (and the indexer cache for C4)."""
        r = w["ratio"]
        parts = [("state", _linear_f32(a, w["wkv_gate"]), w["ape"], w["c_norm"], False)]
        if r == 4:
            parts.append(("idx_state", _linear_f32(a, w["idx_gate"]), w["idx_ape"], w["idx_norm"], True))
        for key, score, ape, norm, hadamard in parts:
            if decode:  # the decode form on the state ring, token by token of the chain (a call's rows own a ring)
                n, step = self.tpr, self.step
                for j in range(n):
                    rq, ps = step["req32"][j::n].contiguous(), step["pos32"][j::n].contiguous()
                    sj = score[j::n].contiguous()
                    with timer("compress_decode"):
                        rows = self.ops.compress_decode(sj, w[key], rq, ps, ape, norm, self.cos, self.sin, r,
                                                        hadamard=hadamard)
                    if (r, j) not in step["slots"]:  # the C4 layer's two compressors close the same rows
                        step["slots"][r, j] = self._closed_slots(req[j::n], pos[j::n], r)
                    self._store_compressed(w, key, rows, step["slots"][r, j], timer)
                continue
            for b in sorted(set(req.tolist())):  # prefill: the prefill form over each prompt, then seed the ring
                sel = req == b
                rows_b, pos_b = score[sel], pos[sel]
                cu = torch.tensor([0, rows_b.shape[0]], dtype=torch.int32, device=self.dev)
                with timer("compress"):
                    rows = self.ops.compress(rows_b.contiguous(), cu, ape, norm, self.cos, self.sin, r,
                                             hadamard=hadamard, num_groups=rows_b.shape[0] // r)  # no sync
                slots = self.group_slots(b, torch.arange(rows.shape[0], device=self.dev), r)
                self._store_compressed(w, key, rows, slots, timer)
                ring = w[key].shape[1]
                w[key][b, pos_b[-ring:] % ring] = rows_b[-ring:]

    def group_slots(self, req: torch.Tensor | int, group: torch.Tensor, ratio: int) -> torch.Tensor:
        """The compressed-cache slot of compressed row `group` of request `req` (pages of PAGE / ratio rows)."""
        per_page = PAGE // ratio
        return self.page_table[req, group // per_page].long() * per_page + group % per_page

    def _closed_slots(self, req: torch.Tensor, pos: torch.Tensor, ratio: int) -> torch.Tensor:
        """The compressed-cache slot of the row each decode token closes, -1 where it closes none (nothing is
        written, with no host sync)."""
        slots = self.group_slots(req, ((pos + 1) // ratio - 1).clamp(min=0), ratio)
        return torch.where((pos + 1) % ratio == 0, slots, -1)

    def _store_compressed(self, w: dict, key: str, rows: torch.Tensor, slots: torch.Tensor, timer: OpTimer) -> None:
        """Rows that close no group have slot -1: both stores skip them without a host sync."""
        if key == "state":
            cache = w["extra"]
            if "pool" in w:  # offloaded: the rows go to their pages in the working set, marked dirty
                with timer("offload_fetch"):
                    slots, cache = w["pool"].store_slots(slots), w["pool"].working
            kv = rows.bfloat16().contiguous()
            with timer("pack_store"):
                self.ops.pack_store(kv, slots, cache)
        else:
            keys = rows.float().contiguous()
            with timer("indexer_store"):
                self.ops.indexer_store(keys, slots, w["idx_cache"])

    def _indexer(self, w: dict, a: torch.Tensor, q_lora: torch.Tensor, req: torch.Tensor, pos: torch.Tensor,
                 meta: Any, timer: OpTimer) -> torch.Tensor:
        t = a.shape[0]
        q = self._proj(q_lora, w["wq_idx"], timer, fp32_out=True).view(t, INDEX_HEADS, INDEX_DIM)
        head_weights = _linear_f32(a, w["w_proj"])
        with timer("indexer_q_prep"):  # RoPE, Hadamard, per-head FP8 and the folded weights: one op
            q8, weights = self.ops.indexer_q_prep(q, head_weights, self.cos, self.sin, self.step["pos32"],
                                                  self.p.info.fp8)
        table = self.step["table"]
        with timer("indexer_logits"):
            scores = self.ops.indexer_logits(q8, weights, w["idx_cache"], meta.c4_lengths_raw, table)
        with timer("indexer_topk"):
            _, pages = self.ops.indexer_topk(scores, meta.c4_lengths_raw, C4_TOPK, table)
        return pages


def fill_random(model: DemoModel, batch: int, context: int, seed: int = 0, chunk: int = 1 << 17) -> None:
    """A synthetic context: every cache row a prefill of `context` tokens per request would write and decode reads
    (the SWA rows of the last 256 positions, which hold the 128-token window; every C4, C128 and indexer row) gets a
    random row of the real scale through pack_store / indexer_store, and the compressor rings random state, so
    decode runs as after a prefill without its compute."""
    dev, ops = model.dev, model.ops
    g = torch.Generator(dev).manual_seed(seed + 7)
    # the last PAGE positions: a ring page holds exactly those (no slot twice a call), and the same rows go to a
    # full SWA cache, so a ring and a full cache decode the same bits
    first = max(context - PAGE, 0)
    req = torch.arange(batch, device=dev).repeat_interleave(context - first)
    pos = torch.arange(first, context, device=dev).repeat(batch)

    def rows(n: int) -> torch.Tensor:
        return _rms(torch.randn(n, D_HEAD, generator=g, device=dev)).bfloat16()

    for w in model.layers:
        for s in range(0, req.numel(), chunk):
            r, p = req[s:s + chunk], pos[s:s + chunk]
            ops.pack_store(rows(r.numel()), model.swa_loc(r, p), w["swa"])
        ratio = w["ratio"]
        if not ratio:
            continue
        n = context // ratio
        for s in range(0, batch * n, chunk):  # in chunks: at 1M context and batch 64 a layer has 16.8M C4 rows
            flat = torch.arange(s, min(s + chunk, batch * n), device=dev)
            slots = model.group_slots(flat // n, flat % n, ratio)
            ops.pack_store(rows(slots.numel()), slots, w["extra"])
            if ratio == 4:
                ops.indexer_store(torch.randn(slots.numel(), INDEX_DIM, generator=g, device=dev), slots,
                                  w["idx_cache"])
        for key in ("state", "idx_state") if ratio == 4 else ("state",):
            w[key].copy_(torch.randn(w[key].shape, generator=g, device=dev))


