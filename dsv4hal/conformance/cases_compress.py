"""Conformance catalog for `compress` (spec 4.1, prefill form) with an independent float64 oracle.

The oracle walks requests and groups one at a time and builds each window row by row from the layout
description, so it shares no indexing code with the vectorised reference."""

from __future__ import annotations

import math

import torch

from dsv4hal.conformance.types import CaseSpec, Fixture, Tolerance
from dsv4hal.reference.rope import DSV4_YARN, make_rope_table

OP = "compress"
COMPRESS_ROPE_BASE = 160000.0  # compress_rope_theta of the HF config (spec 1.1)

DECODE_OP = "compress_decode"

TOLERANCES: dict[str, Tolerance] = {
    DECODE_OP: Tolerance(5e-3, 5e-3, "as the prefill form: the same window math on the state ring"),
    OP: Tolerance(
        atol=5e-3, rtol=5e-3,
        reason="as SGLang test_c4_v2/test_c128_v2 (fp64 ground truth, atol=rtol=5e-3); an fp32 softmax, RMSNorm "
        "and RoPE err by ~1e-6 on O(1) outputs, the margin admits fused kernels' fast exp/rsqrt",
    ),
}

_GRAPH_UNREACHABLE = (
    "the prefill-form compressor runs in eager extend only (CUDA graphs capture decode, whose compressor is the "
    "state-ring form); its output row count depends on cu_seqlens values"
)


def _case(name: str, ratio: int, hd: int, lengths: tuple[int, ...], hadamard: bool = False,
          gpu_only: bool = False, num_groups: bool = False) -> CaseSpec:
    """num_groups: the call passes M (as an engine that scheduled the prompts can): no host sync, so the case also
    runs captured in a CUDA graph."""
    return CaseSpec(
        op=OP, name=name, compress_ratio=ratio, gpu_only=gpu_only,
        params={"lengths": lengths, "hd": hd, "hadamard": hadamard, "num_groups": num_groups},
        unreachable={} if num_groups else {"graph": _GRAPH_UNREACHABLE},
    )


CASES: list[CaseSpec] = [
    _case("c4_main_short_requests", 4, 512, (3, 4, 7, 8, 9, 130)),
    _case("c4_main_single_group", 4, 512, (4,)),
    _case("c4_main_no_full_group", 4, 512, (3, 0, 2)),
    _case("c4_indexer_hadamard", 4, 128, (4, 9, 130, 256), hadamard=True),
    _case("c128_main", 128, 512, (130, 7, 256)),
    _case("c128_main_exact_group", 128, 512, (128,)),
    _case("c4_main_long", 4, 512, (4096, 1027, 8191), gpu_only=True),
    _case("c4_indexer_long", 4, 128, (8192, 333), hadamard=True, gpu_only=True),
    _case("c128_main_long", 128, 512, (8192, 4000, 129), gpu_only=True),
    # V4-Flash and V4-Pro share the compressor shapes (hd 512 main, hd 128 indexer); these are prompt sizes:
    # 32K prompts, and Pro's long ones past YaRN's original 64K context
    _case("flash_c4_main_32k", 4, 512, (32768, 4093, 7), gpu_only=True),
    _case("flash_c4_indexer_32k", 4, 128, (32768, 1030), hadamard=True, gpu_only=True),
    _case("flash_c128_main_32k", 128, 512, (32768, 4000, 127), gpu_only=True),
    _case("pro_c4_main_66k", 4, 512, (66563,), gpu_only=True),
    _case("pro_c4_indexer_66k", 4, 128, (66563, 5), hadamard=True, gpu_only=True),
    _case("pro_c128_main_66k", 128, 512, (66563,), gpu_only=True),
    # M given by the caller: the same rows with no sync, eager and captured
    _case("c4_main_num_groups", 4, 512, (3, 4, 7, 8, 9, 130), num_groups=True),
    _case("c4_indexer_num_groups", 4, 128, (4, 0, 130, 2), hadamard=True, num_groups=True),
    _case("c128_main_num_groups", 128, 512, (130, 7, 256), num_groups=True),
    _case("flash_c4_indexer_32k_num_groups", 4, 128, (32768, 1030), hadamard=True, gpu_only=True, num_groups=True),
    _case("flash_c128_main_32k_num_groups", 128, 512, (32768, 4000, 127), gpu_only=True, num_groups=True),
]


def _decode_case(name: str, ratio: int, hd: int, positions: tuple[int, ...], hadamard: bool = False,
                 ring: int | None = None, gpu_only: bool = False) -> CaseSpec:
    return CaseSpec(op=DECODE_OP, name=name, compress_ratio=ratio, gpu_only=gpu_only,
                    params={"positions": positions, "hd": hd, "hadamard": hadamard, "ring": ring})


def _batch_positions(batch: int, context: int, ratio: int) -> tuple[int, ...]:
    """A decode batch spread over [0, context): two rows of three close a group (the first closes group 0),
    the third does not."""
    out = []
    for i in range(batch):
        closing = max(1, context * (i + 1) // batch // ratio) * ratio - 1 if i else ratio - 1
        out.append(closing - 1 if i % 3 == 2 else closing)
    return tuple(out)


# Rows whose token closes a group (pos + 1 divisible by the ratio) return the group's row; others return 0.
CASES_DECODE: list[CaseSpec] = [
    _decode_case("c4_main_decode", 4, 512, (3, 7, 8, 11, 100, 103)),
    _decode_case("c4_indexer_decode", 4, 128, (3, 50, 51, 1023), hadamard=True),
    _decode_case("c4_main_decode_ring16", 4, 512, (15, 20, 23), ring=16),
    _decode_case("c128_main_decode", 128, 512, (127, 255, 300, 383)),
    _decode_case("c128_main_decode_ring256", 128, 512, (127, 255, 300, 511), ring=256),  # spec decode's C128 ring
    # the demo's batch (64) at V4-Flash's 32K and V4-Pro's 1M context
    _decode_case("flash_c4_main_decode_b64", 4, 512, _batch_positions(64, 32768, 4), gpu_only=True),
    _decode_case("flash_c4_indexer_decode_b64", 4, 128, _batch_positions(64, 32768, 4), hadamard=True,
                 gpu_only=True),
    _decode_case("flash_c128_main_decode_b64", 128, 512, _batch_positions(64, 32768, 128), gpu_only=True),
    _decode_case("pro_c4_main_decode_1m", 4, 512, _batch_positions(64, 1 << 20, 4), gpu_only=True),
    _decode_case("pro_c4_indexer_decode_1m_ring16", 4, 128, _batch_positions(64, 1 << 20, 4), hadamard=True,
                 ring=16, gpu_only=True),
    _decode_case("pro_c128_main_decode_1m", 128, 512, _batch_positions(64, 1 << 20, 128), gpu_only=True),
]


# ---------------------------------------------------------------- float64 oracle
# Windows are listed slot by slot in plain Python from the layout description (no shared indexing code with
# the reference); the arithmetic is then batched per request so the oracle stays fast on a busy CPU.

_MASKED = (-1, 0, 0, 0)  # a window slot with no token: weight exp(-inf) = 0


def _window_slots(length: int, ratio: int, hd: int, first_group: int = 0) -> list[list[tuple[int, int, int, int]]]:
    """Per group from first_group on, per window slot: (position, kv column, score column, ape row); ape column =
    kv column."""
    groups = []
    for i in range(first_group, length // ratio):
        last = i * ratio + ratio - 1
        if ratio == 128:
            groups.append([(last - 127 + w, 0, hd, w) for w in range(128)])
            continue
        slots = []
        for r in range(8):  # C4: slots 0..3 previous group (ov halves), 4..7 own group (cur halves)
            pos = last - 7 + r
            if pos < 0:
                slots.append(_MASKED)
            elif r < 4:
                slots.append((pos, 0, 2 * hd, r))
            else:
                slots.append((pos, hd, 3 * hd, r - 4))
        groups.append(slots)
    return groups


def _pool(rows: torch.Tensor, ape: torch.Tensor, groups: list, hd: int, base: int = 0) -> torch.Tensor:
    """[G, hd]: per-channel softmax-weighted kv over each group's window slots; rows[0] is position `base`."""
    if any(0 <= s[0] < base for g in groups for s in g):
        raise ValueError(f"a window reaches before the rows given (position {base})")
    cols = torch.arange(hd)
    pos = torch.tensor([[s[0] - base if s[0] >= 0 else -1 for s in g] for g in groups])
    kv_col = torch.tensor([[s[1] for s in g] for g in groups])[..., None] + cols
    sc_col = torch.tensor([[s[2] for s in g] for g in groups])[..., None] + cols
    ape_row = torch.tensor([[s[3] for s in g] for g in groups])
    valid = (pos >= 0)[..., None]
    safe = pos.clamp_min(0)[..., None]
    kv = torch.where(valid, rows[safe, kv_col], 0.0)
    # ape's column for a slot is its kv column: the ov half (columns 0..hd-1) or the cur half (hd..2hd-1)
    score = torch.where(valid, rows[safe, sc_col] + ape[ape_row[..., None], kv_col], float("-inf"))
    weights = torch.exp(score - score.max(dim=1, keepdim=True).values)
    return (weights / weights.sum(dim=1, keepdim=True) * kv).sum(dim=1)


def sylvester(n: int) -> torch.Tensor:
    """float64 [n, n] +-1 Sylvester Hadamard matrix by Kronecker products (the oracles' own, no kernel code)."""
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.cat((torch.cat((h, h), 1), torch.cat((h, -h), 1)), 0)
    return h


def _finish(c: torch.Tensor, weight: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, pos: torch.Tensor,
            eps: float, hadamard: bool) -> torch.Tensor:
    """RMSNorm, complex rotation of the last 64 dims at `pos`, optional orthonormal Hadamard; [G, hd]."""
    hd = c.shape[1]
    c = c / torch.sqrt((c * c).mean(dim=1, keepdim=True) + eps) * weight
    z = torch.complex(c[:, hd - 64 :: 2], c[:, hd - 63 :: 2]) * torch.complex(cos[pos], sin[pos])
    c[:, hd - 64 :: 2], c[:, hd - 63 :: 2] = z.real, z.imag
    return c @ sylvester(hd).t() / math.sqrt(hd) if hadamard else c


def oracle(kv_score: torch.Tensor, lengths: tuple[int, ...], ape: torch.Tensor, weight: torch.Tensor,
           cos: torch.Tensor, sin: torch.Tensor, ratio: int, eps: float, hadamard: bool) -> torch.Tensor:
    """float64 [M, hd], request by request."""
    rows, ape, weight = kv_score.double().cpu(), ape.double().cpu(), weight.double().cpu()
    cos, sin = cos.double().cpu(), sin.double().cpu()
    hd = weight.shape[0]
    out, start = [torch.zeros(0, hd, dtype=torch.float64)], 0
    for length in lengths:
        groups = _window_slots(length, ratio, hd)
        if groups:
            pooled = _pool(rows[start : start + length], ape, groups, hd)
            pos = torch.arange(len(groups)) * ratio
            out.append(_finish(pooled, weight, cos, sin, pos, eps, hadamard))
        start += length
    return torch.cat(out)


def closed_group(rows: torch.Tensor, base: int, pos: int, ratio: int, ape: torch.Tensor, weight: torch.Tensor,
                 cos: torch.Tensor, sin: torch.Tensor, hadamard: bool, eps: float = 1e-6) -> torch.Tensor:
    """float64 [hd]: the row of the group the token at `pos` closes, pooled over `rows` (rows[0] is position
    `base`; they reach back over the group's window)."""
    hd = weight.shape[0]
    group = (pos + 1) // ratio - 1
    pooled = _pool(rows.double(), ape.double(), _window_slots(pos + 1, ratio, hd, first_group=group), hd, base=base)
    first = group * ratio
    return _finish(pooled, weight.double(), cos[first:first + 1].double(), sin[first:first + 1].double(),
                   torch.tensor([0]), eps, hadamard)[0]


# ---------------------------------------------------------------- fixture

def _build_decode(spec: CaseSpec, device: torch.device, gen: torch.Generator) -> Fixture:
    """Each row is a request at its position: the state ring holds its earlier tokens' rows; the expected
    row comes from the float64 prefill-form oracle over the request's whole history."""
    from dsv4hal.reference.compress import new_state

    ratio, hd, hadamard = spec.compress_ratio, spec.params["hd"], bool(spec.params["hadamard"])
    positions = tuple(spec.params["positions"])
    coff = 2 if ratio == 4 else 1
    width = 2 * coff * hd
    ape = 0.5 * torch.randn(ratio, coff * hd, generator=gen)
    weight = 1.0 + 0.1 * torch.randn(hd, generator=gen)
    cos, sin = make_rope_table(max(positions) + ratio + 1, COMPRESS_ROPE_BASE, DSV4_YARN)
    state = new_state(len(positions) + 1, ratio, width, ring=spec.params.get("ring"))
    ring = state.shape[1]
    new_rows, expected = [], []
    for b, pos in enumerate(positions):
        base = max(0, pos - ring + 1)  # the request's rows from `base` on: what the ring holds, plus this token
        hist = torch.randn(pos + 1 - base, width, generator=gen)
        hist[:, coff * hd:] *= 2.0
        for p in range(base, pos):
            state[b + 1, p % ring] = hist[p - base]
        new_rows.append(hist[-1])
        if (pos + 1) % ratio == 0:  # the closed group, from the prefill-form window description
            expected.append(closed_group(hist, base, pos, ratio, ape, weight, cos, sin, hadamard))
        else:
            expected.append(torch.zeros(hd, dtype=torch.float64))
    args = {
        "kv_score": torch.stack(new_rows).to(device), "state": state.to(device),
        "slots": torch.arange(1, len(positions) + 1, dtype=torch.int32).to(device),
        "positions": torch.tensor(positions, dtype=torch.int32).to(device), "ape": ape.to(device),
        "norm_weight": weight.to(device), "cos": cos.to(device), "sin": sin.to(device), "ratio": ratio,
        "eps": 1e-6, "hadamard": hadamard,
    }
    return Fixture(args=args, expected=torch.stack(expected), tolerance=TOLERANCES[DECODE_OP])


def build(spec: CaseSpec, device: torch.device, gen: torch.Generator) -> Fixture:
    if spec.op == DECODE_OP:
        return _build_decode(spec, device, gen)
    ratio, hd = spec.compress_ratio, spec.params["hd"]
    lengths, hadamard = tuple(spec.params["lengths"]), bool(spec.params["hadamard"])
    coff = 2 if ratio == 4 else 1
    n = sum(lengths)
    kv_score = torch.randn(n, 2 * coff * hd, generator=gen)
    kv_score[:, coff * hd :] *= 2.0  # wider scores so the softmax is far from uniform
    ape = 0.5 * torch.randn(ratio, coff * hd, generator=gen)
    weight = 1.0 + 0.1 * torch.randn(hd, generator=gen)
    cos, sin = make_rope_table(max(lengths) + ratio, COMPRESS_ROPE_BASE, DSV4_YARN)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    eps = 1e-6
    expected = oracle(kv_score, lengths, ape, weight, cos, sin, ratio, eps, hadamard)
    args = {
        "kv_score": kv_score.to(device), "cu_seqlens": cu.to(device), "ape": ape.to(device),
        "norm_weight": weight.to(device), "cos": cos.to(device), "sin": sin.to(device),
        "ratio": ratio, "eps": eps, "hadamard": hadamard,
    }
    if spec.params.get("num_groups"):
        args["num_groups"] = sum(n // ratio for n in lengths)
    return Fixture(args=args, expected=expected, tolerance=TOLERANCES[OP])
