"""Attention benchmark: dsv4hal's bound sparse_attention_decode against a direct FlashMLA call (and any
other implementation registered for the platform) on the same inputs, V4-Flash and V4-Pro shapes."""

from __future__ import annotations

import contextvars
from dataclasses import dataclass
from typing import Any

import torch

from dsv4hal.bench.common import bound_op, candidates
from dsv4hal.bench.pools import random_pool
from dsv4hal.bench.timing import graph_us, host_us_interleaved
from dsv4hal.dispatch.fast_path import metadata_key

POOL_SLOTS = 1 << 22  # ~4M entries per pool: gathers miss the L2 as in serving
SCALE = 512 ** -0.5


@dataclass(frozen=True)
class AttnConfig:
    name: str
    h_q: int
    ratio: int  # 0, 4 or 128
    extra: int  # extra entries attended per query (top-k for C4, ceil(L/128) for C128)


CONFIGS = (
    AttnConfig("flash-c4 (SWA 128 + top-512)", 64, 4, 512),
    AttnConfig("flash-c128-8k (SWA 128 + 64)", 64, 128, 64),
    AttnConfig("flash-c128-128k (SWA 128 + 1024)", 64, 128, 1024),
    AttnConfig("flash-c128-1m (SWA 128 + 8192)", 64, 128, 8192),
    AttnConfig("pro-c4 (h128, SWA 128 + top-1024)", 128, 4, 1024),
)
TOKENS = (1, 8, 64, 256, 1024)


def _inputs(cfg: AttnConfig, t: int, pools: dict[int, Any], gen: torch.Generator) -> dict[str, Any]:
    dev = "cuda"
    q = torch.randn(t, cfg.h_q, 512, device=dev, dtype=torch.bfloat16)
    swa = pools[0]
    args: dict[str, Any] = dict(
        q=q, swa_cache=swa, sink=torch.randn(cfg.h_q, device=dev),
        swa_indices=torch.randint(0, swa.num_slots, (t, 128), device=dev, dtype=torch.int32, generator=gen),
        swa_lengths=torch.full((t,), 128, device=dev, dtype=torch.int32), softmax_scale=SCALE)
    if cfg.ratio:
        x = pools[cfg.ratio]
        width = -(-cfg.extra // 64) * 64
        args.update(extra_cache=x, extra_indices=torch.randint(0, x.num_slots, (t, width), device=dev,
                                                                dtype=torch.int32, generator=gen),
                    extra_lengths=torch.full((t,), cfg.extra, device=dev, dtype=torch.int32))
    return args


def _direct_flashmla(args: dict[str, Any], views_per_call: bool = False,  # noqa: ANN202
                     shared_plan: bool = False):
    """The vendor call written by hand, as an engine would without dsv4hal. FlashMLA takes [T, 1, ...] query and
    index tensors: with views_per_call they are made in each call (an engine's q and top-k indices are new
    tensors every layer), otherwise once, outside the timed call (the cheapest direct call there is).
    shared_plan: one scheduler metadata object for every call (planned by the first), as an engine shares one
    plan a layer type in a decode step; else a plan a call."""
    import flash_mla.flash_mla_interface as fm

    swa = args["swa_cache"].flashmla_view()  # a cache's view lives as long as the cache, in an engine too
    extra_view = args["extra_cache"].flashmla_view() if args.get("extra_cache") is not None else None

    def views() -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
        extra = {}
        if extra_view is not None:
            extra = dict(extra_k_cache=extra_view, extra_indices_in_kvcache=args["extra_indices"].unsqueeze(1),
                         extra_topk_length=args["extra_lengths"])
        return args["q"].unsqueeze(1), args["swa_indices"].unsqueeze(1), extra

    hoisted = views()
    shared = fm.get_mla_metadata()[0] if shared_plan else None

    def run():  # noqa: ANN202
        q, idx, extra = views() if views_per_call else hoisted
        meta = fm.get_mla_metadata()[0] if shared is None else shared
        return fm.flash_mla_with_kvcache(q, swa, None, None, 512, meta, softmax_scale=SCALE,
                                         is_fp8_kvcache=True, indices=idx, attn_sink=args["sink"],
                                         topk_length=args["swa_lengths"], use_legacy=True, **extra)
    return run


def _in_decode_step() -> contextvars.Context:
    """A context inside its own declared decode step (dsv4hal.step), entered once: calls run in it (Context.run)
    share that step's plans, as the calls of an engine's step do, while other calls stay outside it."""
    from dsv4hal.step import decode_step

    ctx = contextvars.copy_context()
    ctx.run(decode_step().__enter__)
    return ctx


def run(platform: Any, ceilings: dict[str, float], quick: bool = False) -> list[dict[str, Any]]:
    gen = torch.Generator(device="cuda").manual_seed(0)
    pools = {0: random_pool(POOL_SLOTS, 256), 4: random_pool(POOL_SLOTS, 64), 128: random_pool(POOL_SLOTS, 2)}
    impls = candidates(platform, "sparse_attention_decode")
    rows = []
    for cfg in CONFIGS:
        for t in TOKENS if not quick else (1, 64, 1024):
            args = _inputs(cfg, t, pools, gen)
            attended = 128 + cfg.extra
            row: dict[str, Any] = {"config": cfg.name, "h_q": cfg.h_q, "compress_ratio": cfg.ratio, "T": t,
                                   "attended_per_query": attended, "us": {}, "host_us": {}}
            timed = {"direct_flashmla": _direct_flashmla(args)} if platform.info.has("flash_mla") else {}
            raw = {"direct_flashmla (views per call)": _direct_flashmla(args, True),
                   "direct_flashmla (plan shared)": _direct_flashmla(args, shared_plan=True)} if timed else {}
            for impl in impls:
                op = bound_op(platform, "sparse_attention_decode", impl)
                timed[f"dsv4hal[{impl}]"] = lambda op=op, args=args: op(**args)
                fast = bound_op(platform, "sparse_attention_decode", impl, validate=False)
                raw[f"dsv4hal[{impl}] no validation"] = lambda op=fast, args=args: op(**args)
                kernel = fast.kernel(fast.case_of(**args))
                raw[f"{impl} kernel (hoisted dispatch)"] = lambda k=kernel, args=args: k(**args)
                step = _in_decode_step()  # the bound call inside one declared step: one plan shared by the calls
                raw[f"dsv4hal[{impl}] in a decode step"] = lambda op=op, args=args, step=step: step.run(op, **args)
                # the kernel op.plan() hands back, called in the step: the hot-loop form, without the per-call lookup
                raw[f"{impl} kernel (hoisted dispatch) in a decode step"] = (
                    lambda k=kernel, args=args, step=step: step.run(k, **args))
                if impl.startswith("flashmla") and impl.endswith("_sgl"):  # the same call with the Python glue
                    from dsv4hal.kernels.flashmla_glue import _decoder

                    python_glue = _decoder("sgl", use_native=False)
                    raw[f"{impl} kernel, Python glue (hoisted dispatch)"] = lambda k=python_glue, args=args: k(**args)
                    # outside a step, the parallel plan made each call in place of the op's own and the clamps
                    planned = _decoder("sgl", plan_each_call=True)
                    timed[f"{impl} kernel, parallel plan a call (hoisted dispatch)"] = (
                        lambda k=planned, args=args: k(**args))
            if impls and t == 1:  # the bound op's two lookups alone, no kernel: what each mode adds, in parts
                raw["dsv4hal validation lookup alone (memo key)"] = lambda args=args: metadata_key((), args)
                raw["dsv4hal selection lookup alone (case)"] = lambda op=op, args=args: op.case_of(**args)
            if "direct_flashmla" in timed:  # the same kernel on the same inputs: the same bytes, whatever the path
                want = timed["direct_flashmla"]()[0]
                row["same_output_as_direct"] = {
                    n: bool(torch.equal(fn()[0].reshape(want.shape), want))
                    for n, fn in {**timed, **raw}.items() if "flashmla" in n and "direct" not in n}
            for name, fn in timed.items():
                row["us"][name] = graph_us(fn)
            if t == 1:  # every way of making the call, timed in turns (ratios between them are what is read)
                row["host_us"] = host_us_interleaved({**timed, **raw})
                if "direct_flashmla" in row["host_us"]:
                    base = row["host_us"]["direct_flashmla"]
                    row["host_ratio_vs_direct"] = {k: v / base for k, v in row["host_us"].items()}
                    shared = row["host_us"]["direct_flashmla (plan shared)"]  # the in-step calls' direct twin
                    row["host_ratio_in_step_vs_direct_plan_shared"] = {
                        k: v / shared for k, v in row["host_us"].items() if k.endswith("in a decode step")}
            best = min(row["us"].values())
            tok_s = t * attended / (best * 1e-6)
            flop_per_tok = 2 * cfg.h_q * 1024
            row.update(tokens_per_s=tok_s, tflops=tok_s * flop_per_tok / 1e12,
                       fraction_hbm=tok_s / (ceilings["copy_bytes_per_s"] / 584),
                       fraction_mma=tok_s / (ceilings["bf16_tflops"] * 1e12 / flop_per_tok),
                       fraction_dequant=tok_s / (5.97e9 if cfg.h_q == 64 else 11.9e9))
            if "direct_flashmla" in row["us"]:
                row["ratio_vs_direct"] = {k: v / row["us"]["direct_flashmla"] for k, v in row["us"].items()}
            rows.append(row)
            print(f"attention {cfg.name} T={t}: " + ", ".join(f"{k} {v:.1f}us" for k, v in row["us"].items()),
                  flush=True)
    return rows

