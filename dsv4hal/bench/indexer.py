"""Indexer benchmark (`dsv4hal bench indexer`).

indexer_logits at the demo's decode shape (batch 64 at 32K context: C4 -> 8192 compressed rows a request, 64
index heads) and at 128K context, for every eligible implementation of the bound op, the PyTorch reference,
and a direct DeepGEMM call on the same inputs (schedule made once outside the timed call, no -inf tail: what an
engine calling DeepGEMM itself would run; and with the schedule made in each call, the like-for-like comparison
for the bound op outside a step). The bound op is timed per call (its own schedule each call) and inside
`platform.decode_step()` (schedule shared by the step's layers, as an engine runs it). The floor is the bytes a
call must move (cache rows read, queries, weights, block table, logits written) at the copy bandwidth measured in
the same run. Several disjoint page sets rotate between the calls of one CUDA graph, so the cache rows come from
HBM, not from the L2 the previous call filled.

indexer_store at decode (batch 64 rows) and prefill (64K rows) sizes, against the bytes it must move."""

from __future__ import annotations

from typing import Any

import torch

from dsv4hal.bench.common import bound_op, candidates
from dsv4hal.bench.timing import eager_us, graph_us
from dsv4hal.formats.indexer_cache import PAGE_SIZE, TOKEN_BYTES, IndexerPagedCache

HEADS, DIM = 64, 128
LOGITS_SHAPES = [(64, 32768 // 4), (64, 131072 // 4), (1, 1048576 // 4)]  # (T, compressed rows a token)
ROTATE = 3  # disjoint page sets cycled by consecutive calls (3 x 69 MB at the demo shape, well over the L2)
STORE_ROWS = (64, 65536)


def _logit_inputs(t: int, n: int, fp8: str, sets: int) -> list[dict[str, Any]]:
    blocks = -(-n // PAGE_SIZE)
    pages = t * blocks * sets
    cache = IndexerPagedCache.empty(pages, fp8, "cuda")
    from dsv4hal.formats.indexer_cache import quantize_rows, write_rows

    for s in range(0, pages * PAGE_SIZE, 1 << 20):  # random rows of the real scale, in chunks
        loc = torch.arange(s, min(s + (1 << 20), pages * PAGE_SIZE), device="cuda")
        raw, scale = quantize_rows(torch.randn(loc.numel(), DIM, device="cuda"), fp8)
        write_rows(cache, loc, raw, scale)
    perm = torch.randperm(pages, device="cuda").to(torch.int32).view(sets, t, blocks)
    lens = torch.full((t,), n, dtype=torch.int32, device="cuda")
    lens[1::2] -= 37  # ragged ends: not a multiple of 64
    out = []
    for s in range(sets):
        q = torch.randn(t, HEADS, DIM, device="cuda").to(torch.float8_e4m3fn if fp8 == "e4m3fn"
                                                          else torch.float8_e4m3fnuz)
        w = torch.randn(t, HEADS, device="cuda") * DIM**-0.5 * HEADS**-0.5
        out.append({"q": q, "weights": w, "cache": cache, "context_lens": lens, "block_table": perm[s].contiguous()})
    return out


def _rotating(fn: Any, inputs: list[dict[str, Any]]) -> Any:
    """A callable whose consecutive calls use consecutive input sets (captured calls bind different pages)."""
    state = {"i": 0}

    def call() -> Any:
        args = inputs[state["i"] % len(inputs)]
        state["i"] += 1
        return fn(args)

    return call


def _time(us: dict[str, float], name: str, fn: Any) -> None:
    """us[name] = CUDA-graph time of fn; what cannot be captured (a host sync) is timed eagerly, named so."""
    try:
        us[name] = graph_us(fn)
    except Exception:
        torch.cuda.synchronize()
        us[f"{name} (eager)"] = eager_us(fn)


def _logits_bytes(a: dict[str, Any]) -> int:
    t, p = a["block_table"].shape
    return (int(a["context_lens"].sum()) * TOKEN_BYTES + a["q"].numel() + a["weights"].numel() * 4
            + a["block_table"].numel() * 4 + t * p * PAGE_SIZE * 4 + t * 4)


def _direct_deepgemm(inputs: list[dict[str, Any]], schedule_per_call: bool = False) -> Any:
    """DeepGEMM called as an engine would: one schedule made beforehand (or, schedule_per_call, one made in each
    call: what a call outside a step with fixed lengths must do, as the bound op does there), no -inf tail."""
    try:
        import deep_gemm
    except ImportError:
        return None
    from dsv4hal.kernels.deepgemm_indexer import BLOCK_KV, fused_cache_view

    prepared = []
    for a in inputs:
        t = a["q"].shape[0]
        ctx = a["context_lens"].view(t, 1).contiguous()
        meta = deep_gemm.get_paged_mqa_logits_metadata(ctx, BLOCK_KV, deep_gemm.get_num_sms())
        prepared.append({"q": a["q"].view(t, 1, HEADS, DIM), "kv": fused_cache_view(a["cache"]), "w": a["weights"],
                         "ctx": ctx, "table": a["block_table"], "meta": meta,
                         "width": a["block_table"].shape[1] * PAGE_SIZE})
    def call(d: dict[str, Any]) -> Any:
        meta = (deep_gemm.get_paged_mqa_logits_metadata(d["ctx"], BLOCK_KV, deep_gemm.get_num_sms())
                if schedule_per_call else d["meta"])
        return deep_gemm.fp8_paged_mqa_logits(d["q"], d["kv"], d["w"], d["ctx"], d["table"], meta, d["width"], False)

    return _rotating(call, prepared)


def _run_logits(platform: Any, ceilings: dict[str, float], t: int, n: int) -> dict[str, Any]:
    fp8 = platform.info.fp8
    inputs = _logit_inputs(t, n, fp8, ROTATE)
    row: dict[str, Any] = {"T": t, "context_rows": n, "fp8": fp8, "us": {}}
    names = candidates(platform, "indexer_logits", case={"fp8": fp8}) + ["torch_reference"]
    for impl in names:
        if impl == "torch_reference" and t * n > 64 * 8192:
            continue  # the reference gathers [T, P*64, 128] fp32: minutes at 1M context
        op = bound_op(platform, "indexer_logits", impl)
        _time(row["us"], impl, _rotating(lambda a, op=op: op(**a), inputs))
        if impl.startswith("deepgemm"):
            with platform.decode_step():  # the warm-up call makes the step's plan; the captured calls share it
                _time(row["us"], f"{impl} (in decode_step)", _rotating(lambda a, op=op: op(**a), inputs))
    direct = _direct_deepgemm(inputs) if any(i.startswith("deepgemm") for i in names) else None
    if direct is not None:
        _time(row["us"], "deep_gemm direct", direct)
        _time(row["us"], "deep_gemm direct (schedule per call)", _direct_deepgemm(inputs, schedule_per_call=True))
    row["floor_us"] = _logits_bytes(inputs[0]) / ceilings["copy_bytes_per_s"] * 1e6
    row["x_floor"] = {i: u / row["floor_us"] for i, u in row["us"].items()}
    if "deep_gemm direct" in row["us"]:
        d = row["us"]["deep_gemm direct"]
        row["direct_over_bound"] = {i: d / u for i, u in row["us"].items() if i.startswith("deepgemm") and u > 0}
    if "deep_gemm direct (schedule per call)" in row["us"]:  # like for like with the bound op outside a step
        d = row["us"]["deep_gemm direct (schedule per call)"]
        row["direct_per_call_over_bound"] = {i: d / u for i, u in row["us"].items()
                                             if i.startswith("deepgemm") and "decode_step" not in i and u > 0}
    print(f"indexer_logits T={t} rows={n}: " + ", ".join(f"{i} {u:.1f}us" for i, u in row["us"].items())
          + f"; floor {row['floor_us']:.1f}us", flush=True)
    return row


def _run_store(platform: Any, ceilings: dict[str, float], n: int) -> dict[str, Any]:
    fp8 = platform.info.fp8
    pages = -(-4 * n // PAGE_SIZE)
    cache = IndexerPagedCache.empty(pages, fp8, "cuda")
    k = torch.randn(n, DIM, device="cuda")
    loc = torch.randperm(pages * PAGE_SIZE, device="cuda")[:n]
    row: dict[str, Any] = {"rows": n, "fp8": fp8, "us": {}}
    for scale in ("amax", "pow2"):
        for impl in candidates(platform, "indexer_store", case={"fp8": fp8, "scale": scale}) + ["torch_reference"]:
            op = bound_op(platform, "indexer_store", impl)
            _time(row["us"], f"{impl} {scale}", lambda op=op, s=scale: op(k, loc, cache, s))
    row["floor_us"] = (k.numel() * 4 + loc.numel() * 8 + n * TOKEN_BYTES) / ceilings["copy_bytes_per_s"] * 1e6
    row["x_floor"] = {i: u / row["floor_us"] for i, u in row["us"].items()}
    print(f"indexer_store rows={n}: " + ", ".join(f"{i} {u:.1f}us" for i, u in row["us"].items())
          + f"; floor {row['floor_us']:.2f}us", flush=True)
    return row


def run(platform: Any, ceilings: dict[str, float], quick: bool = False) -> dict[str, list[dict[str, Any]]]:
    shapes = LOGITS_SHAPES[:1] if quick else LOGITS_SHAPES
    logits = [_run_logits(platform, ceilings, t, n) for t, n in shapes]
    torch.cuda.empty_cache()
    store = [_run_store(platform, ceilings, n) for n in STORE_ROWS]
    return {"indexer_logits": logits, "indexer_store": store}
