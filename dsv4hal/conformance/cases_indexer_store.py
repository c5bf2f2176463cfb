"""Conformance catalog of `indexer_store` (contract in dsv4hal.ops.indexer_store).

The oracle builds the expected cache image from the contract's formula in float64, independently of the
reference's code: amax over the row, s = amax / FP8_MAX rounded once to fp32 (a float64 quotient of two fp32
numbers rounded to fp32 is the correctly rounded fp32 quotient), for "pow2" 2**ceil(log2 s) (exact in float64
for an fp32 s), values k / s rounded to fp32, clamped, then cast to FP8. The cache starts with random bytes, so
every byte the op must not touch (other slots, skipped rows) is checked too. The format is integer-exact:
no tolerance."""

from __future__ import annotations

import math

import torch

from dsv4hal.conformance.types import CaseSpec, Fixture, Tolerance
from dsv4hal.formats.fp8 import FP8_MAX, float_to_fp8_bytes
from dsv4hal.formats.indexer_cache import (
    AMAX_FLOOR,
    INDEX_DIM,
    PAGE_BYTES,
    PAGE_SIZE,
    SCALE_OFFSET,
    IndexerPagedCache,
)

OP = "indexer_store"
TOLERANCES = {OP: Tolerance(0.0, 0.0, "bit-exact: the scale and the fp8 rounding are fixed by the contract, so "
                                      "every correct kernel writes identical bytes (max_error counts differing bytes)")}
SKIP_FRACTION = 0.15


def _case(name: str, n: int, fp8: str = "e4m3fn", scale: str = "amax", kind: str = "random",
          dtype: str = "float32", loc_dtype: str = "int64", gpu_only: bool = False, decode: bool = False) -> CaseSpec:
    params = {"n": n, "fp8": fp8, "scale": scale, "kind": kind, "dtype": dtype, "loc_dtype": loc_dtype,
              "decode": decode}
    return CaseSpec(op=OP, name=name, params=params, compress_ratio=4, gpu_only=gpu_only)


CASES: list[CaseSpec] = [
    _case("n1", 1),
    _case("n64_int32_bf16", 64, dtype="bfloat16", loc_dtype="int32"),
    # decode at batch 64: one token in four closes a C4 group, the others pass -1
    _case("decode_b64", 64, decode=True),
    _case("decode_b64_pow2", 64, scale="pow2", decode=True),
    _case("n1000_pow2", 1000, scale="pow2"),
]
for _fp8 in ("e4m3fn", "e4m3fnuz"):
    for _scale in ("amax", "pow2"):
        for _kind in ("zeros", "tiny", "huge", "pow2"):
            CASES.append(_case(f"{_fp8}_{_scale}_{_kind}_n64", 64, _fp8, _scale, _kind))
CASES += [
    # prefill of a 256K-token prompt: 64K compressed rows
    _case("prefill_n65536", 65536, gpu_only=True),
    _case("prefill_n65536_pow2_fnuz", 65536, fp8="e4m3fnuz", scale="pow2", gpu_only=True),
]


# ---------------------------------------------------------------- inputs

def _keys(n: int, kind: str, fp8: str, gen: torch.Generator) -> torch.Tensor:
    k = torch.randn(n, INDEX_DIM, generator=gen)
    if kind == "random":  # row magnitudes over ~e^+-3
        return k * torch.exp(1.5 * torch.randn(n, 1, generator=gen))
    if kind == "zeros":  # whole zero rows: amax hits the 1e-4 floor
        k[::3] = 0.0
        return k
    if kind == "tiny":  # below the floor: values reach fp8 subnormals and zero
        return k * torch.pow(10.0, torch.randint(-10, -5, (n, 1), generator=gen).float())
    if kind == "huge":
        return k * 3e4
    if kind == "pow2":  # amax = FP8_MAX * 2**j (s itself a power of two) or 2**j, planted at a random column
        j = torch.randint(-12, 12, (n,), generator=gen).float()
        amax = torch.where(torch.arange(n) % 2 == 0, FP8_MAX[fp8], 1.0) * torch.exp2(j)
        k = k / k.abs().amax(1, keepdim=True) * amax[:, None] * 0.99
        col = torch.randint(0, INDEX_DIM, (n, 1), generator=gen)
        return k.scatter(1, col, (amax * torch.where(torch.rand(n, generator=gen) < 0.5, -1.0, 1.0))[:, None])
    raise ValueError(f"unknown key kind {kind!r}")


def _locations(n: int, num_slots: int, decode: bool, gen: torch.Generator) -> torch.Tensor:
    """Distinct slots with rows skipped: -1 (and, outside decode, a few other negatives, which unchecked mode
    skips too)."""
    loc = torch.randperm(num_slots, generator=gen)[:n]
    if decode:
        return torch.where(torch.arange(n) % 4 == 3, loc, -1)
    skip = torch.rand(n, generator=gen) < SKIP_FRACTION
    if n == 1:
        skip[:] = False
    return torch.where(skip, torch.where(torch.arange(n) % 2 == 0, -1, -(loc + 2)), loc)


# ---------------------------------------------------------------- oracle

def expected_image(cache_bytes: torch.Tensor, k: torch.Tensor, loc: torch.Tensor, fp8: str, scale: str
                   ) -> torch.Tensor:
    """The cache bytes after the store, from the contract's formula (float64, row by row in Python only for
    the pow2 exponent)."""
    image = cache_bytes.clone().view(-1)
    x = k.cpu().to(torch.float64)
    amax = x.abs().amax(1).clamp_min(float(torch.tensor(AMAX_FLOOR, dtype=torch.float32)))
    s = (amax / FP8_MAX[fp8]).to(torch.float32).to(torch.float64)
    if scale == "pow2":
        s = torch.tensor([2.0 ** math.ceil(math.log2(v)) for v in s.tolist()], dtype=torch.float64)
    q = (x / s[:, None]).to(torch.float32)
    raw = float_to_fp8_bytes(q, fp8)
    s32 = s.to(torch.float32)
    for i, slot in enumerate(loc.cpu().tolist()):
        if slot < 0 or slot >= cache_bytes.shape[0] * PAGE_SIZE:
            continue
        page, off = divmod(slot, PAGE_SIZE)
        base = page * PAGE_BYTES
        image[base + off * INDEX_DIM: base + (off + 1) * INDEX_DIM] = raw[i]
        image[base + SCALE_OFFSET + off * 4: base + SCALE_OFFSET + off * 4 + 4] = s32[i:i + 1].view(torch.uint8)
    return image.view(cache_bytes.shape)


def compare_bytes(got: torch.Tensor, expected: torch.Tensor) -> tuple[float, bool, str]:
    """Byte equality of two cache images; max_error is the number of differing bytes."""
    if not isinstance(got, torch.Tensor) or got.dtype != torch.uint8 or got.shape != expected.shape:
        return float("inf"), False, f"expected uint8 {tuple(expected.shape)}, got {got!r:.80}"
    diff = (got.cpu() != expected.cpu()).reshape(-1)
    count = int(diff.sum())
    if count == 0:
        return 0.0, True, ""
    first = int(diff.nonzero()[0])
    page, at = divmod(first, PAGE_BYTES)
    where = f"slot {at // INDEX_DIM} value byte {at % INDEX_DIM}" if at < SCALE_OFFSET else \
        f"slot {(at - SCALE_OFFSET) // 4} scale byte {(at - SCALE_OFFSET) % 4}"
    return float(count), False, f"{count} bytes differ; first in page {page}, {where}"


def build(spec: CaseSpec, device: torch.device, gen: torch.Generator) -> Fixture:
    p = spec.params
    n, fp8 = p["n"], p["fp8"]
    k = _keys(n, p["kind"], fp8, gen).to(getattr(torch, p["dtype"]))
    num_pages = -(-(2 * n + 8) // PAGE_SIZE)  # about twice the slots needed: scattered, with gaps
    loc = _locations(n, num_pages * PAGE_SIZE, p["decode"], gen).to(getattr(torch, p["loc_dtype"]))
    garbage = torch.randint(0, 256, (num_pages, PAGE_BYTES), generator=gen, dtype=torch.uint8)
    expected = expected_image(garbage, k, loc, fp8, p["scale"])
    cache = IndexerPagedCache(garbage.to(device), fp8)
    return Fixture(args={"k": k.to(device), "loc": loc.to(device), "cache": cache, "scale": p["scale"]},
                   expected=expected, extract=lambda ret, args: args["cache"].data, compare=compare_bytes,
                   tolerance=TOLERANCES[OP])
