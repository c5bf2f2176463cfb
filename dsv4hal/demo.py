"""An engine-shaped program on the public API only: three DSV4 layers (SWA-only, C4 with the lightning
indexer, C128), each followed by MoE and wrapped in mHC, over paged caches; a batch of prompts is
prefilled, then decoded token by token. It prints decode tokens per second and the time of each op.

Small shapes run on the CPU (CI runs it there against the same program with dsv4hal's Triton kernels
forced under the interpreter). Prefill compresses each prompt with the prefill-form compressor and seeds
the compressors' state rings; decode steps run the decode form (compress_decode) on those rings. Not done
yet: CUDA-graph capture of the decode step and full-size layers."""

from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

D_HEAD, ROPE, WINDOW, PAGE, C4_TOPK = 512, 64, 128, 256, 512
RATIOS = (0, 4, 128)


@dataclass(frozen=True)
class DemoConfig:
    hidden: int = 256
    heads: int = 64
    experts: int = 8
    inter: int = 64
    top_k: int = 6
    max_pages: int = 4  # per request: 1024 tokens


class _Timer:
    def __init__(self, device: torch.device) -> None:
        self.device, self.seconds, self.calls = device, defaultdict(float), defaultdict(int)

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        yield
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        self.seconds[name] += time.perf_counter() - t0
        self.calls[name] += 1


def _rms(x: torch.Tensor, w: torch.Tensor | None = None, eps: float = 1e-6) -> torch.Tensor:
    x32 = x.float()
    y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return y * w if w is not None else y


class Tape:
    """Stands in for platform.ops and records every call (inputs and outputs), so each op of the program
    can later be replayed on another platform or kernel with the program's real inputs."""

    def __init__(self, ops: Any) -> None:
        self._ops, self.calls = ops, []

    def __getattr__(self, name: str) -> Any:
        op = getattr(self._ops, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            out = op(*args, **kwargs)
            self.calls.append((name, args, kwargs, out))
            return out

        call.prepare_weights = getattr(op, "prepare_weights", None)  # type: ignore[attr-defined]
        return call


# per-op comparison when replaying a tape: (absolute, relative) tolerance, None = exact
REPLAY_TOLERANCE = {"sparse_attention_decode": (2e-2, 2e-2), "mhc_pre": (2e-3, 1e-2), "mhc_post": (2e-3, 1e-2),
                    "moe_experts": (5e-2, 5e-2), "compress": (5e-3, 5e-3), "indexer_logits": (1e-3, 1e-3),
                    "moe_route": (1e-5, 1e-5)}


def replay(tape: Tape, platform: Any) -> dict[str, float]:
    """Re-run each recorded call on `platform` and return the worst error per op (raises on a mismatch).
    In-place ops (pack_store) are checked bit-exactly by the conformance suite and skipped here."""
    worst: dict[str, float] = {}
    for name, args, kwargs, want in tape.calls:
        if name == "pack_store":
            continue
        got = getattr(platform.ops, name)(*args, **kwargs)
        got_t = [x for x in _tensors(got)]
        want_t = [x for x in _tensors(want)]
        for g, w in zip(got_t, want_t, strict=True):
            if name == "indexer_topk":  # same set per row; order is free beyond k
                g, w = g.sort(dim=-1).values, w.sort(dim=-1).values
            err = (g.double() - w.double()).abs()
            err = err[torch.isfinite(w.double())]
            e = float(err.max()) if err.numel() else 0.0
            tol = REPLAY_TOLERANCE.get(name)
            bound = 0.0 if tol is None else tol[0] + tol[1] * float(w.double()[torch.isfinite(w.double())].abs().max()
                                                                     if w.numel() else 0.0)
            if e > bound or not bool(torch.equal(torch.isfinite(g.double()), torch.isfinite(w.double()))):
                raise AssertionError(f"replay of {name}: max error {e:.3g} over {bound:.3g}")
            worst[name] = max(worst.get(name, 0.0), e)
    return worst


def _tensors(x: Any) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (tuple, list)):
        return [t for v in x for t in _tensors(v)]
    if hasattr(x, "__dataclass_fields__"):
        return [t for f in x.__dataclass_fields__ for t in _tensors(getattr(x, f))]
    return []


class DemoModel:
    """Random weights with DSV4's structure (scaled down), caches, and the forward pass."""

    def __init__(self, platform: Any, cfg: DemoConfig, batch: int, seed: int = 0, ops: Any = None) -> None:
        from dsv4hal.formats.indexer_cache import IndexerPagedCache
        from dsv4hal.formats.v4_cache import PAGE_SIZE_BY_RATIO, V4PagedCache
        from dsv4hal.reference.moe import quantize_experts
        from dsv4hal.reference.rope import make_rope_table

        self.p, self.cfg, self.b = platform, cfg, batch
        self.ops = ops if ops is not None else platform.ops
        dev = self.dev = torch.device(platform.device_type)
        g = torch.Generator().manual_seed(seed)
        d, h = cfg.hidden, cfg.heads

        def rnd(*shape: int, scale: float = 1.0, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
            return (torch.randn(*shape, generator=g) * scale).to(dtype).to(dev)

        self.cos, self.sin = (t.to(dev) for t in make_rope_table(cfg.max_pages * PAGE, 10000.0))
        pages = batch * cfg.max_pages
        self.page_table = (torch.arange(pages).view(batch, cfg.max_pages) + 1).int().to(dev)  # page 0: null
        self.full_to_swa = torch.arange((pages + 1) * PAGE, device=dev)
        self.layers = []
        for ratio in RATIOS:
            w: dict[str, Any] = {
                "ratio": ratio, "wq": rnd(h * D_HEAD, d, scale=d ** -0.5), "wkv": rnd(D_HEAD, d, scale=d ** -0.5),
                "kv_norm": torch.ones(D_HEAD, device=dev), "wo": rnd(d, h * D_HEAD, scale=(h * D_HEAD) ** -0.5),
                "sink": rnd(h, dtype=torch.float32), "router": rnd(cfg.experts, d, scale=d ** -0.5),
                "bias": rnd(cfg.experts, scale=0.1, dtype=torch.float32),
                "swa": V4PagedCache.empty(pages + 1, PAGE, platform.info.fp8, dev),
            }
            for name in ("attn", "ffn"):
                w[f"hc_{name}"] = (rnd(24, 4 * d, scale=0.01, dtype=torch.float32), torch.zeros(24, device=dev),
                                   torch.ones(3, device=dev))
            experts = quantize_experts(torch.randn(cfg.experts, 2 * cfg.inter, d, generator=g) * d ** -0.5,
                                       torch.randn(cfg.experts, d, cfg.inter, generator=g) * cfg.inter ** -0.5,
                                       "mxfp4")
            w["experts"] = self.ops.moe_experts.prepare_weights(_to(experts, dev))
            if ratio:
                coff = 2 if ratio == 4 else 1
                w.update(wkv_gate=rnd(2 * coff * D_HEAD, d, scale=d ** -0.5),
                         ape=rnd(ratio, coff * D_HEAD, scale=0.1, dtype=torch.float32),
                         c_norm=torch.ones(D_HEAD, device=dev),
                         extra=V4PagedCache.empty((pages + 1) * PAGE // PAGE_SIZE_BY_RATIO[ratio] + 1,
                                                  PAGE_SIZE_BY_RATIO[ratio], platform.info.fp8, dev))
            if ratio == 4:
                w.update(wq_idx=rnd(64 * 128, d, scale=d ** -0.5), w_proj=rnd(64, d, scale=d ** -0.5),
                         idx_gate=rnd(2 * 2 * 128, d, scale=d ** -0.5),
                         idx_ape=rnd(4, 2 * 128, scale=0.1, dtype=torch.float32),
                         idx_norm=torch.ones(128, device=dev),
                         idx_cache=IndexerPagedCache.empty(pages + 1, platform.info.fp8, dev))
            if ratio:  # compressor state rings, one per request (slot = request index)
                from dsv4hal.reference.compress import new_state

                w["state"] = new_state(batch, ratio, w["wkv_gate"].shape[0], dev)
                if ratio == 4:
                    w["idx_state"] = new_state(batch, 4, w["idx_gate"].shape[0], dev)
            self.layers.append(w)

    def loc(self, req: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        return self.page_table[req, pos // PAGE].long() * PAGE + pos % PAGE

    def forward(self, x: torch.Tensor, req: torch.Tensor, pos: torch.Tensor, timer: _Timer,
                decode: bool = False) -> torch.Tensor:
        """x bf16 [T, d] (token embeddings); rows are (request, position) pairs, positions ascending; a decode
        step has one row per request."""
        ops = self.ops
        stream = x[:, None, :].expand(-1, 4, -1).contiguous()
        rows_pt = self.page_table[req]
        with timer("build_attention_metadata"):
            meta = ops.build_attention_metadata(pos.int(), rows_pt, self.full_to_swa)
        for w in self.layers:
            with timer("mhc_pre"):
                y, post, comb = ops.mhc_pre(stream, *w["hc_attn"])
            a = _rms(y).bfloat16()
            attn = self._attention(w, a, req, pos, meta, timer, decode)
            with timer("mhc_post"):
                stream = ops.mhc_post(attn, stream, post, comb)
            with timer("mhc_pre"):
                y, post, comb = ops.mhc_pre(stream, *w["hc_ffn"])
            a = _rms(y).bfloat16()
            with timer("moe_route"):
                ids, tw = ops.moe_route((a.float() @ w["router"].float().T).contiguous(), w["bias"])
            with timer("moe_experts"):
                ffn = ops.moe_experts(a, ids, tw, w["experts"])
            with timer("mhc_post"):
                stream = ops.mhc_post(ffn, stream, post, comb)
        return stream.float().mean(1)

    def _attention(self, w: dict, a: torch.Tensor, req: torch.Tensor, pos: torch.Tensor, meta: Any,
                   timer: _Timer, decode: bool) -> torch.Tensor:
        from dsv4hal.reference.rope import apply_rope

        ops, t, h = self.ops, a.shape[0], self.cfg.heads
        cos, sin = self.cos[pos], self.sin[pos]
        q = _rms((a @ w["wq"].T).view(t, h, D_HEAD))
        q = apply_rope(q, cos[:, None], sin[:, None]).bfloat16()
        kv = apply_rope(_rms(a @ w["wkv"].T, w["kv_norm"]), cos, sin).bfloat16()
        with timer("pack_store"):
            ops.pack_store(kv, self.loc(req, pos), w["swa"])
        extra: dict[str, Any] = {}
        if w["ratio"]:
            self._compress(w, a, req, pos, timer, decode)
            if w["ratio"] == 4:
                pages = self._indexer(w, a, req, pos, meta, timer)
                extra = dict(extra_cache=w["extra"], extra_indices=pages, extra_lengths=meta.c4_lengths)
            else:
                extra = dict(extra_cache=w["extra"], extra_indices=meta.c128_indices,
                             extra_lengths=meta.c128_lengths)
        with timer("sparse_attention_decode"):
            o, _ = ops.sparse_attention_decode(q, w["swa"], meta.swa_indices, meta.swa_lengths, w["sink"],
                                               D_HEAD ** -0.5, **extra)
        o = apply_rope(o.float(), cos[:, None], sin[:, None], inverse=True)
        return (o.flatten(1).bfloat16() @ w["wo"].T).bfloat16()

    def _compress(self, w: dict, a: torch.Tensor, req: torch.Tensor, pos: torch.Tensor, timer: _Timer,
                  decode: bool) -> None:
        """Compressed rows closed by these tokens go to the C4/C128 cache (and the indexer cache for C4)."""
        r = w["ratio"]
        parts = [("state", a.float() @ w["wkv_gate"].float().T, w["ape"], w["c_norm"], False)]
        if r == 4:
            parts.append(("idx_state", a.float() @ w["idx_gate"].float().T, w["idx_ape"], w["idx_norm"], True))
        per_page = PAGE // r
        for key, score, ape, norm, hadamard in parts:
            if decode:  # one token a request: the decode form on the state ring
                with timer("compress_decode"):
                    rows = self.ops.compress_decode(score, w[key], req.int(), pos.int(), ape, norm, self.cos,
                                                    self.sin, r, hadamard=hadamard)
                group = ((pos + 1) // r - 1).clamp(min=0)
                slots = self.page_table[req, group // per_page].long() * per_page + group % per_page
                slots = torch.where((pos + 1) % r == 0, slots, -1)  # -1: nothing closed, nothing written
                self._store_compressed(w, key, rows, slots, timer)
                continue
            for b in sorted(set(req.tolist())):  # prefill: the prefill form over each prompt, then seed the ring
                sel = req == b
                rows_b, pos_b = score[sel], pos[sel]
                cu = torch.tensor([0, rows_b.shape[0]], dtype=torch.int32, device=self.dev)
                with timer("compress"):
                    rows = self.ops.compress(rows_b.contiguous(), cu, ape, norm, self.cos, self.sin, r,
                                             hadamard=hadamard)
                group = torch.arange(rows.shape[0], device=self.dev)
                slots = self.page_table[b, group // per_page].long() * per_page + group % per_page
                self._store_compressed(w, key, rows, slots, timer)
                ring = w[key].shape[1]
                w[key][b, pos_b[-ring:] % ring] = rows_b[-ring:]

    def _store_compressed(self, w: dict, key: str, rows: torch.Tensor, slots: torch.Tensor, timer: _Timer) -> None:
        if key == "state":
            with timer("pack_store"):
                self.ops.pack_store(rows.bfloat16().contiguous(), slots, w["extra"])
        else:
            from dsv4hal.formats.indexer_cache import quantize_rows, write_rows

            raw, scale = quantize_rows(rows, self.p.info.fp8)
            write_rows(w["idx_cache"], slots, raw, scale)

    def _indexer(self, w: dict, a: torch.Tensor, req: torch.Tensor, pos: torch.Tensor, meta: Any,
                 timer: _Timer) -> torch.Tensor:
        from dsv4hal.formats.fp8 import FP8_MAX, fp8_dtype
        from dsv4hal.reference.compress import hadamard_transform
        from dsv4hal.reference.rope import apply_rope

        t = a.shape[0]
        q = (a.float() @ w["wq_idx"].float().T).view(t, 64, 128)
        q = hadamard_transform(apply_rope(q, self.cos[pos][:, None], self.sin[pos][:, None]))
        qs = q.abs().amax(-1).clamp_min(1e-4) / FP8_MAX[self.p.info.fp8]
        q8 = (q / qs[..., None]).to(fp8_dtype(self.p.info.fp8))
        weights = ((a.float() @ w["w_proj"].float().T) * 128 ** -0.5 * 64 ** -0.5 * qs).contiguous()
        table = self.page_table[req]
        with timer("indexer_logits"):
            scores = self.ops.indexer_logits(q8, weights, w["idx_cache"], meta.c4_lengths_raw, table)
        with timer("indexer_topk"):
            _, pages = self.ops.indexer_topk(scores, meta.c4_lengths_raw, C4_TOPK, table)
        return pages


def _to(ew: Any, dev: torch.device) -> Any:
    from dataclasses import fields, replace

    return replace(ew, **{f.name: getattr(ew, f.name).to(dev) for f in fields(ew)
                          if isinstance(getattr(ew, f.name), torch.Tensor)})


def run_demo(platform: Any, batch: int = 2, context: int = 40, steps: int = 3, seed: int = 0,
             cfg: DemoConfig | None = None, tape: Tape | None = None) -> dict[str, Any]:
    """Prefill `batch` prompts of `context` tokens, then decode `steps` tokens; returns outputs and times.
    With a `tape` (Tape(platform.ops)) every op call is recorded for `replay`."""
    cfg = cfg or DemoConfig()
    model = DemoModel(platform, cfg, batch, seed, ops=tape)
    dev, g = model.dev, torch.Generator().manual_seed(seed + 1)
    timer = _Timer(dev)
    embed = lambda n: (torch.randn(n, cfg.hidden, generator=g) * 0.5).bfloat16().to(dev)  # noqa: E731
    req = torch.arange(batch, device=dev).repeat_interleave(context)
    pos = torch.arange(context, device=dev).repeat(batch)
    t0 = time.perf_counter()
    outputs = [model.forward(embed(batch * context), req, pos, timer)]
    prefill_s = time.perf_counter() - t0
    decode = _Timer(dev)
    t0 = time.perf_counter()
    for s in range(steps):
        r = torch.arange(batch, device=dev)
        outputs.append(model.forward(embed(batch), r, torch.full((batch,), context + s, device=dev), decode,
                                     decode=True))
    decode_s = time.perf_counter() - t0
    return {"platform": platform.name, "batch": batch, "context": context, "steps": steps,
            "prefill_s": prefill_s, "decode_tokens_per_s": batch * steps / decode_s if steps else 0.0,
            "decode_breakdown_s": dict(decode.seconds), "decode_calls": dict(decode.calls),
            "kernels": {op.name: op.decide().chosen.name for op in platform.ops},
            "outputs": outputs}


def main(args: argparse.Namespace) -> int:
    import dsv4hal

    platform = dsv4hal.select_platform(args.platform)
    res = run_demo(platform, args.batch, args.context, args.steps)
    outputs = res.pop("outputs")
    res["output_rms"] = [float(o.pow(2).mean().sqrt()) for o in outputs]
    print(f"{res['platform']}: prefill {res['batch']}x{res['context']} in {res['prefill_s']:.2f}s, "
          f"decode {res['decode_tokens_per_s']:.1f} tokens/s")
    total = sum(res["decode_breakdown_s"].values()) or 1.0
    for name, sec in sorted(res["decode_breakdown_s"].items(), key=lambda kv: -kv[1]):
        print(f"  {name:<26} {sec * 1e3:9.2f} ms  {100 * sec / total:5.1f}%  ({res['kernels'].get(name, '-')})")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(res, indent=1) + "\n")
    return 0
