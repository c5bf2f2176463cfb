"""Conformance catalog for `indexer_logits` (FP8 paged indexer cache, spec 4.2 step 5) and `indexer_q_prep` (steps
2-3), each with a float64 oracle.

indexer_logits: the fixture writes every slot of the cache from fp32 keys with `write_rows`; the oracle uses the
exact dequantized values of those same fp32 keys (`exact_dequant`), never bytes read back from the cache, and
walks the block table one token at a time.
indexer_q_prep: the oracle rotates and transforms q in float64 (its own RoPE pairs, the compressor oracle's
Sylvester matrix; no code shared with the reference), takes the float64 scale, and the codes are checked as values
(code * scale against the float64 head, within half an FP8 step) and the folded weights against the float64
product."""

from __future__ import annotations

import math

import torch

from dsv4hal.conformance.cases_compress import sylvester
from dsv4hal.conformance.types import CaseSpec, Fixture, Tolerance, compare_close
from dsv4hal.formats.fp8 import FP8_MAX, fp8_dtype, fp8_to_float
from dsv4hal.formats.indexer_cache import (
    INDEX_DIM,
    PAGE_SIZE,
    IndexerPagedCache,
    exact_dequant,
    quantize_rows,
    write_rows,
)
from dsv4hal.ops.indexer_logits import INDEX_HEADS, WEIGHT_FOLD

OP = "indexer_logits"
Q_PREP_OP = "indexer_q_prep"
SPARE_PAGES = 3  # pages no token uses, so a kernel reading the wrong page reads real but wrong data

TOLERANCES: dict[str, Tolerance] = {
    OP: Tolerance(
        atol=1e-3, rtol=1e-3,
        reason="same FP8 inputs as the oracle, so only accumulation differs, and its error scales with the terms "
        "summed, not with their (signed, cancelling) sum: |got - exp| <= atol + rtol * |exp| + 2^-11 * "
        "sum_h |w_h| sum_i |q_hi k_i|. fp32 sums of exact fp8 products err by ~1e-6 of that sum; Hopper's FP8 "
        "tensor-core accumulation keeps ~13 mantissa bits per partial sum (DeepGEMM, measured on the H200: up to "
        "0.02 on logits of keys ~e^4 at 1M context, over the plain 1e-3 bound); a wrong page, offset or scale errs "
        "by O(1) of the terms",
    ),
}
ACCUMULATION = 2.0**-11  # relative to the sum of absolute products (see the tolerance's reason)
TOLERANCES[Q_PREP_OP] = Tolerance(
    atol=0.0, rtol=1e-5,
    reason="codes: code * scale within half an FP8 step of the float64 head (2^-4 |h|, or 2^-10 / 2^-11 of the "
    "scale for e4m3fn / e4m3fnuz subnormals) plus 1e-5 of the head's amax, since an fp32 head rounds differently "
    "from float64 near a rounding boundary; weights: rtol 1e-5 (fp32 RoPE, Hadamard, amax and two products, "
    "~1e-7 each). A missing or misplaced RoPE, Hadamard or scale errs by O(1)",
)


def _case(name: str, contexts: tuple[int, ...], fp8: str = "e4m3fn", gpu_only: bool = False,
          pairs: bool = False) -> CaseSpec:
    """contexts: compressed rows per query token; pairs: tokens 2i and 2i+1 share one block-table row (two query
    tokens of one request, MTP)."""
    params: dict[str, object] = {"contexts": contexts, "fp8": fp8}
    if pairs:
        params["pairs"] = True
    return CaseSpec(op=OP, name=name, params=params, compress_ratio=4, gpu_only=gpu_only)


_LONG = tuple(range(37, 8192, 8192 // 32))[:32]
# V4-Flash at 64K context: 16384 compressed rows a token, lengths not multiples of the 64-row page
_FLASH_64K = tuple(16384 - 37 * i for i in range(64))
# V4-Pro at 1M context: 262144 compressed rows a token
_PRO_1M = (262144, 262144 - 1, 262144 - 64, 262144 - 65)

CASES: list[CaseSpec] = [
    _case("t1_ctx200", (200,)),
    _case("t1_empty", (0,)),
    _case("t4_page_edges", (1, 63, 64, 65)),
    _case("t16_mixed", (0, 1, 63, 64, 65, 200, 7, 128, 129, 191, 192, 2, 100, 255, 256, 33)),
    _case("t4_fnuz", (65, 200, 1, 64), fp8="e4m3fnuz"),
    _case("t4_mtp_pairs", (199, 200, 63, 64), pairs=True),
    _case("t32_long", _LONG, gpu_only=True),
    _case("flash_t64_ctx64k", _FLASH_64K, gpu_only=True),
    _case("flash_t64_ctx64k_mtp", _FLASH_64K, gpu_only=True, pairs=True),
    _case("flash_t64_ctx64k_fnuz", _FLASH_64K, fp8="e4m3fnuz", gpu_only=True),
    _case("pro_t4_ctx1m", _PRO_1M, gpu_only=True),
    _case("pro_t2_ctx1m_mtp", _PRO_1M[:2], gpu_only=True, pairs=True),
]


def oracle(q: torch.Tensor, weights: torch.Tensor, keys: torch.Tensor, fp8: str, contexts: tuple[int, ...],
           block_table: torch.Tensor, absolute: bool = False) -> torch.Tensor:
    """float64 [T, P*64] from the fp8 queries (as float) and the exact dequantized fp32 keys; absolute=True gives
    sum_h |w_h| sum_i |q_hi k_i| instead (0 past the context), the scale of the accumulation error."""
    k = exact_dequant(keys.cpu(), fp8)  # [slots, 128] float64, value * scale exactly
    q = q.cpu().to(torch.float64)
    w = weights.cpu().to(torch.float64)
    if absolute:
        k, q, w = k.abs(), q.abs(), w.abs()
    out = torch.full((len(contexts), block_table.shape[1] * PAGE_SIZE), 0.0 if absolute else float("-inf"),
                     dtype=torch.float64)
    for t, ctx in enumerate(contexts):
        j = torch.arange(ctx)
        slots = block_table[t].long().cpu()[j // PAGE_SIZE] * PAGE_SIZE + j % PAGE_SIZE
        scores = (q[t] @ k[slots].t()).clamp_min(0.0)  # [64, ctx]; relu(<q, v*s>) = relu(<q, v> * s), s > 0
        out[t, :ctx] = w[t] @ scores
    return out


# ---------------------------------------------------------------- fixture

def _keys(num_slots: int, gen: torch.Generator) -> torch.Tensor:
    """fp32 keys with per-row magnitudes spread over ~e^+-2, plus a zero row and a tiny row (amax floor)."""
    keys = torch.randn(num_slots, INDEX_DIM, generator=gen) * torch.exp(torch.randn(num_slots, 1, generator=gen))
    keys[0] = 0.0
    keys[1] *= 1e-7
    return keys


def _blocks(contexts: tuple[int, ...], pairs: bool) -> list[int]:
    """Blocks each token's table row holds: a pair's two tokens share the larger of their needs."""
    blocks = [(c + PAGE_SIZE - 1) // PAGE_SIZE for c in contexts]
    if pairs:
        for t in range(0, len(blocks) - 1, 2):
            blocks[t] = blocks[t + 1] = max(blocks[t], blocks[t + 1])
    return blocks


def _block_table(contexts: tuple[int, ...], num_pages: int, gen: torch.Generator, pairs: bool = False
                 ) -> torch.Tensor:
    """int32 [T, max_blocks + 1]: distinct random pages for the blocks each context uses (a pair's tokens share
    theirs), -1 elsewhere."""
    blocks = _blocks(contexts, pairs)
    table = torch.full((len(contexts), max(blocks, default=0) + 1), -1, dtype=torch.int32)
    perm = torch.randperm(num_pages, generator=gen).to(torch.int32)
    used = 0
    for t, b in enumerate(blocks):
        if pairs and t % 2 == 1:
            table[t] = table[t - 1]
            continue
        table[t, :b] = perm[used : used + b]
        used += b
    return table


def _queries(num_tokens: int, fp8: str, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(q fp8 [T, 64, 128], weights fp32 [T, 64]) quantized per (token, head) as the indexer q prep does."""
    q = torch.randn(num_tokens * INDEX_HEADS, INDEX_DIM, generator=gen)
    raw, qs = quantize_rows(q, fp8)  # same rule as the keys: max(amax, 1e-4) / FP8_MAX per (token, head)
    q8 = raw.view(fp8_dtype(fp8)).view(num_tokens, INDEX_HEADS, INDEX_DIM)
    weights = torch.randn(num_tokens, INDEX_HEADS, generator=gen) * qs.view(num_tokens, INDEX_HEADS) * WEIGHT_FOLD
    return q8, weights


def build(spec: CaseSpec, device: torch.device, gen: torch.Generator) -> Fixture:
    if spec.op == Q_PREP_OP:
        return _build_q_prep(spec, device, gen)
    contexts, fp8, pairs = tuple(spec.params["contexts"]), spec.params["fp8"], bool(spec.params.get("pairs"))
    blocks = _blocks(contexts, pairs)
    num_pages = sum(blocks[::2] if pairs else blocks) + SPARE_PAGES
    keys = _keys(num_pages * PAGE_SIZE, gen)
    cache = IndexerPagedCache.empty(num_pages, fp8, device)
    raw, scale = quantize_rows(keys.to(device), fp8)
    write_rows(cache, torch.arange(num_pages * PAGE_SIZE, device=device), raw, scale)
    table = _block_table(contexts, num_pages, gen, pairs)
    q, weights = _queries(len(contexts), fp8, gen)
    expected = oracle(q, weights, keys, fp8, contexts, table)
    slack = oracle(q, weights, keys, fp8, contexts, table, absolute=True) * ACCUMULATION
    args = {
        "q": q.to(device), "weights": weights.to(device), "cache": cache,
        "context_lens": torch.tensor(contexts, dtype=torch.int32, device=device), "block_table": table.to(device),
    }
    return Fixture(args=args, expected=expected, tolerance=TOLERANCES[OP],
                   compare=lambda got, exp: compare_close(got, exp, TOLERANCES[OP], slack))



# ---------------------------------------------------------------- indexer_q_prep

def _q_prep_case(name: str, t: int, dtype: str = "bfloat16", fp8: str = "e4m3fn", max_pos: int = 4096,
                 gpu_only: bool = False, **extra: object) -> CaseSpec:
    params: dict[str, object] = {"T": t, "dtype": dtype, "fp8": fp8, "max_pos": max_pos, **extra}
    return CaseSpec(op=Q_PREP_OP, name=name, params=params, gpu_only=gpu_only)


CASES_Q_PREP: list[CaseSpec] = [
    _q_prep_case("t1", 1),
    _q_prep_case("t7_fp32_bf16_weights", 7, dtype="float32", weights="bfloat16"),
    _q_prep_case("t5_fnuz", 5, fp8="e4m3fnuz"),
    _q_prep_case("t6_edges", 6, edges=True),  # zero heads (amax floor), one huge entry among tiny ones
    _q_prep_case("t6_edges_fnuz", 6, fp8="e4m3fnuz", edges=True),
    _q_prep_case("t9_strided_weights", 9, weights_stride=80),
    _q_prep_case("t0", 0),
    _q_prep_case("flash_t64_decode_128k", 64, max_pos=131072, gpu_only=True),
    _q_prep_case("flash_t4096_prefill", 4096, max_pos=8192, gpu_only=True),
]


def q_prep_oracle(q: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor
                  ) -> torch.Tensor:
    """float64 [T, 64, 128]: RoPE on each head's last 64 dims (pairs (2i, 2i+1), angle of pair i at the position),
    then the orthonormal Sylvester Hadamard transform."""
    h = q.cpu().to(torch.float64).clone()
    pos = positions.cpu().long()
    c = cos.cpu().to(torch.float64)[pos][:, None, :]  # [T, 1, 32]
    s_ = sin.cpu().to(torch.float64)[pos][:, None, :]
    re, im = h[..., 64::2].clone(), h[..., 65::2].clone()
    h[..., 64::2] = re * c - im * s_
    h[..., 65::2] = re * s_ + im * c
    return h @ sylvester(INDEX_DIM).t() / math.sqrt(INDEX_DIM)


def _compare_q_prep(got: tuple[torch.Tensor, torch.Tensor], expected: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
                    fp8: str) -> tuple[float, bool, str]:
    q8, w = got
    head, qs, w_exp = expected
    if q8.dtype != fp8_dtype(fp8) or tuple(q8.shape) != tuple(head.shape):
        want = f"{fp8_dtype(fp8)} {tuple(head.shape)}"
        return float("inf"), False, f"q: expected {want}, got {q8.dtype} {tuple(q8.shape)}"
    value = fp8_to_float(q8.detach().cpu().view(torch.uint8), fp8).to(torch.float64) * qs[..., None]
    sub = 2.0 ** (-10 if fp8 == "e4m3fn" else -11)  # half the subnormal step, in units of the scale
    amax = head.abs().amax(-1, keepdim=True)
    bound = torch.maximum(2.0**-4 * head.abs(), sub * qs[..., None]) + 1e-5 * amax
    err = (value - head).abs()
    if torch.isnan(value).any():
        return float("nan"), False, "NaN in q"
    worst_q = float((err / bound).max()) if err.numel() else 0.0
    werr, wok, wd = compare_close(w, w_exp, TOLERANCES[Q_PREP_OP])
    ok = worst_q <= 1.0 and wok
    detail = [] if worst_q <= 1.0 else [f"q: {int((err > bound).sum())} codes beyond half an FP8 step (worst "
                                        f"{worst_q:.3g}x the bound)"]
    return max(worst_q, werr), ok, "; ".join(detail + ([f"weights: {wd}"] if not wok else []))


def _build_q_prep(spec: CaseSpec, device: torch.device, gen: torch.Generator) -> Fixture:
    from dsv4hal.reference.rope import DSV4_YARN, make_rope_table

    p = spec.params
    t, fp8, max_pos = int(p["T"]), str(p["fp8"]), int(p["max_pos"])
    q = torch.randn(t, INDEX_HEADS, INDEX_DIM, generator=gen) * torch.exp(torch.randn(t, INDEX_HEADS, 1, generator=gen))
    if p.get("edges") and t:
        q[0, :3] = 0.0  # amax floored at 1e-4
        q[1, 5] *= 1e-3
        q[1, 5, 7] = 1e4  # one huge entry: the others land in FP8 subnormals or zero
        q[2, 9] *= 1e-8  # amax below the floor after the transform
    q = q.to(getattr(torch, str(p["dtype"])))
    weights = torch.randn(t, INDEX_HEADS, generator=gen).to(getattr(torch, str(p.get("weights", "float32"))))
    positions = torch.randint(0, max_pos, (t,), generator=gen, dtype=torch.int32)
    if t:
        positions[0] = max_pos - 1
    cos, sin = make_rope_table(max_pos, 10000.0, DSV4_YARN)
    head = q_prep_oracle(q.float(), cos, sin, positions)
    qs = head.abs().amax(-1).clamp_min(1e-4) / FP8_MAX[fp8]
    w_exp = weights.to(torch.float64) * WEIGHT_FOLD * qs
    w_dev = weights.to(device)
    if p.get("weights_stride"):  # a view of a wider buffer: row stride past 64, unit stride along heads
        wide = torch.zeros(t, int(p["weights_stride"]), dtype=weights.dtype, device=device)
        wide[:, :INDEX_HEADS] = w_dev
        w_dev = wide[:, :INDEX_HEADS]
    args = {"q": q.to(device), "weights": w_dev, "cos": cos.to(device), "sin": sin.to(device),
            "positions": positions.to(device), "fp8": fp8}
    return Fixture(args=args, expected=(head, qs, w_exp), tolerance=TOLERANCES[Q_PREP_OP],
                   compare=lambda got, exp: _compare_q_prep(got, exp, fp8))
