"""The MoE glue kernels around vendor GEMMs: the clamped SwiGLU (moe_activation, shared by the Marlin path, the
FP8 row quantizer and the fused Triton MoE) against torch's fp32 expression, and combine_routes with rows implicit
in the routing against the explicit-rows path (under the interpreter on CPU machines, natively on a GPU)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

pytest.importorskip("triton")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from dsv4hal.kernels.triton.moe_activation import _swiglu_f32, swiglu  # noqa: E402
from dsv4hal.kernels.triton.moe_combine import combine_routes  # noqa: E402
from dsv4hal.kernels.triton.moe_quant import quantize_routed_rows  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
# numpy under the interpreter warns on the inf/NaN/overflowing inputs these tests feed on purpose
pytestmark = pytest.mark.filterwarnings("ignore:.*encountered in:RuntimeWarning")


def _torch_swiglu(h13: torch.Tensor, limit: float | None) -> torch.Tensor:
    """The expression the Marlin path used in torch (six kernels and fp32 temporaries)."""
    g, u = h13.float().chunk(2, dim=-1)
    if limit is None or math.isinf(limit):
        return (torch.nn.functional.silu(g) * u).to(torch.bfloat16)
    return (torch.nn.functional.silu(g.clamp(max=limit)) * u.clamp(-limit, limit)).to(torch.bfloat16)


def _numpy_exp_swiglu_f32(g: torch.Tensor, u: torch.Tensor, limit: float | None) -> torch.Tensor:
    """The same formula in fp32 with numpy's exp, the interpreter's: min(g, l) / (1 + exp(-min(g, l))) * clamp(u)."""
    g, u = g.float().contiguous().numpy(), u.float().contiguous().numpy()
    if limit is not None and not math.isinf(limit):
        lim = np.float32(limit)
        g, u = np.minimum(g, lim), np.minimum(np.maximum(u, -lim), lim)
    with np.errstate(over="ignore", invalid="ignore"):
        return torch.from_numpy(g / (np.float32(1) + np.exp(-g)) * u)


def _numpy_exp_swiglu(h13: torch.Tensor, limit: float | None) -> torch.Tensor:
    return _numpy_exp_swiglu_f32(*h13.chunk(2, dim=-1), limit).to(torch.bfloat16)


def _ordered(x: torch.Tensor) -> torch.Tensor:
    """bf16 -> integers in value order (adjacent bf16 values differ by 1; -0 and +0 both 0)."""
    b = x.view(torch.int16).int()
    return torch.where(b < 0, -(b & 0x7FFF), b)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool((torch.isnan(a) == torch.isnan(b)).all()) and torch.equal(a.nan_to_num(0.0), b.nan_to_num(0.0))


def _h13(r: int, i: int, scale: float, limit: float | None, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    h = torch.randn(r, 2 * i, generator=gen) * scale
    lim = 10.0 if limit is None or math.isinf(limit) else limit
    special = torch.tensor([lim, -lim, lim * 1.5, -lim * 1.5, 100.0, -100.0, 3e38, -3e38, math.inf, -math.inf,
                            math.nan, 0.0, -0.0])  # beyond the clamp, exp overflowing, the bf16 edge
    n = min(special.numel(), i)
    h[0, :n] = special[:n]  # as gates, against random ups
    h[-1, i:i + n] = special[:n]  # as ups, against random gates
    return h.bfloat16()


SWIGLU_CASES = {
    "decode-T64-k6": (384, 2048, 20.0, 10.0),
    "odd-R5-I13": (5, 13, 20.0, 10.0),
    "masked-tail-I1100-limit7.3": (3, 1100, 10.0, 7.3),  # two column blocks; a limit fp32 rounds
    "no-clamp-None": (6, 96, 20.0, None),
    "no-clamp-inf": (6, 96, 20.0, math.inf),
}


@pytest.mark.parametrize(("r", "i", "scale", "limit"), SWIGLU_CASES.values(), ids=list(SWIGLU_CASES))
def test_swiglu_matches_the_torch_expression(r: int, i: int, scale: float, limit: float | None) -> None:
    """The Triton SwiGLU matches the torch expression, clamp included."""
    h13 = _h13(r, i, scale, limit, seed=r + i)
    got = swiglu(h13.to(DEV), limit).cpu()
    assert got.dtype == torch.bfloat16 and got.shape == (r, i)
    want = _torch_swiglu(h13.to(DEV), limit).cpu()
    if DEV == "cuda":
        # libdevice's expf is CUDA's expf, which torch's silu calls, and the division is IEEE: torch's bits
        assert _same(got, want)
        return
    # the interpreter's exp is numpy's: exactly the formula with it, and within one bf16 step of torch (whose CPU
    # exp differs from numpy's in the last fp32 bit now and then: a few elements in a million)
    assert _same(got, _numpy_exp_swiglu(h13, limit))
    fin = torch.isfinite(want)
    assert torch.equal(torch.isnan(got), torch.isnan(want)) and torch.equal(got[~fin & ~torch.isnan(want)],
                                                                             want[~fin & ~torch.isnan(want)])
    ulps = (_ordered(got[fin]) - _ordered(want[fin])).abs()
    assert int(ulps.max()) <= 1 and int((ulps > 0).sum()) <= 1 + fin.sum().item() // 10_000


@triton.jit
def _swiglu_f32_kernel(g_ptr, u_ptr, out_ptr, n, limit, CLAMP: tl.constexpr, BLOCK: tl.constexpr):
    c = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = c < n
    act = _swiglu_f32(tl.load(g_ptr + c, mask=m), tl.load(u_ptr + c, mask=m), limit, CLAMP)
    tl.store(out_ptr + c, act, mask=m)


@pytest.mark.parametrize("limit", [10.0, None])
def test_swiglu_fp32_math_before_rounding(limit: float | None) -> None:
    """The shared helper's fp32 result, before bf16 hides most of it: silu as one division (g * sigmoid(g) rounds
    twice), on fp32 inputs that are not bf16 values."""
    gen = torch.Generator().manual_seed(11)
    n = 50_000
    g, u = torch.randn(n, generator=gen) * 20, torch.randn(n, generator=gen) * 20
    got = torch.empty(n, device=DEV)
    _swiglu_f32_kernel[(triton.cdiv(n, 1024),)](g.to(DEV), u.to(DEV), got, n, limit or 0.0, CLAMP=limit is not None,
                                                 BLOCK=1024)
    if DEV == "cuda":  # torch's fp32 expression, bit for bit (CUDA expf, IEEE division)
        gc, uc = (g, u) if limit is None else (g.clamp(max=limit), u.clamp(-limit, limit))
        want = torch.nn.functional.silu(gc.to(DEV)) * uc.to(DEV)
    else:
        want = _numpy_exp_swiglu_f32(g, u, limit)
    assert torch.equal(got.cpu(), want.cpu())


def test_swiglu_takes_strided_rows_and_edge_shapes() -> None:
    """The Triton SwiGLU takes strided rows and empty input and refuses odd widths."""
    big = _h13(4, 80, 20.0, 10.0, seed=5)
    h13 = big.to(DEV)[:, :96]  # row stride 160, not 2I
    assert _same(swiglu(h13, 10.0).cpu(), swiglu(h13.contiguous(), 10.0).cpu())
    assert swiglu(torch.zeros(0, 8, dtype=torch.bfloat16, device=DEV), 10.0).shape == (0, 4)
    with pytest.raises(ValueError, match="even"):
        swiglu(torch.zeros(2, 7, dtype=torch.bfloat16, device=DEV), 10.0)


def test_row_quantizer_uses_the_same_swiglu() -> None:
    """quantize_routed_rows' SWIGLU source gives the codes and scales of quantizing swiglu's output: one helper."""
    gen = torch.Generator().manual_seed(7)
    rows, i, p = 8, 256, 6
    d1 = ((torch.randn(rows, 2 * i, generator=gen) * 20).bfloat16()).to(DEV)
    sorted_routes = torch.tensor([4, 0, 6, 6, 2, 5, 1, 3], dtype=torch.int32, device=DEV)  # 6 = padding
    real = (sorted_routes < p).cpu()
    for limit in (10.0, math.inf):
        q, sf = quantize_routed_rows(d1, sorted_routes, p, 2, i, gather=False, swiglu_limit=limit)
        q0, sf0 = quantize_routed_rows(swiglu(d1, limit), sorted_routes, p, 2, i, gather=False)
        assert torch.equal(q.cpu()[real], q0.cpu()[real]) and torch.equal(sf.cpu()[real], sf0.cpu()[real])


# ---------------------------------------------------------------- combine

def _routes(t: int, k: int, e: int, h: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, e, (t, k), generator=gen, dtype=torch.int32)
    drop = torch.rand(t, k, generator=gen)
    ids[drop < 0.15] = -1  # experts of another rank
    ids[(drop >= 0.15) & (drop < 0.3)] = e + 3  # out of range
    ids[1] = -1  # a token with every route dropped
    y = torch.randn(t * k + 5, h, generator=gen).bfloat16()  # R > T*k: padding rows past the routes
    dropped = ((ids < 0) | (ids >= e)).flatten()
    y[:t * k][dropped] = float("nan")  # rows the GEMM never wrote must not leak through
    return ids, y, torch.rand(t, k, generator=gen)


@pytest.mark.parametrize("weighted", [False, True])
def test_combine_implicit_rows_match_explicit_rows(weighted: bool) -> None:
    """combine_routes from topk_ids gives the same result as with explicit rows."""
    t, k, e, h = 7, 6, 8, 1500  # H over one 1024 block: two column blocks, masked tail
    ids, y, w = _routes(t, k, e, h, seed=3)
    weights = w.to(DEV) if weighted else None
    valid = (ids >= 0) & (ids < e)
    rows = torch.where(valid, torch.arange(t * k, dtype=torch.int32).view(t, k), t * k)  # the former torch glue
    explicit = combine_routes(y.to(DEV), rows.to(DEV), weights, t * k).cpu()
    implicit = combine_routes(y.to(DEV), None, weights, topk_ids=ids.to(DEV), num_experts=e).cpu()
    assert implicit.dtype == torch.bfloat16 and implicit.shape == (t, h)
    assert bool(torch.isfinite(implicit).all()) and torch.equal(implicit, explicit)
    assert not bool(implicit[1].any())
    contrib = y[:t * k].float().nan_to_num(0.0).view(t, k, h) * valid[..., None]
    if weighted:
        contrib = contrib * w[..., None]
    want = contrib.sum(1).bfloat16()
    assert int((_ordered(implicit) - _ordered(want)).abs().max()) <= 1  # fp32 sums; FMA on the GPU: one step
    # int64 ids (torch's own top-k) name the same routes
    assert torch.equal(combine_routes(y.to(DEV), None, weights, topk_ids=ids.long().to(DEV), num_experts=e).cpu(),
                       implicit)


def test_combine_explicit_rows_drop_negative_and_past_limit_rows() -> None:
    """Explicit rows as triton_kernels' routing gives them (scatter.src_indx: a route's row in expert order, -1 for a
    dropped route): a negative row is dropped as a row at or past the limit is, and never read (the rows here around
    the valid ones hold NaN)."""
    t, k, h = 5, 4, 1100
    gen = torch.Generator().manual_seed(9)
    y = torch.full((2 + t * k, h), float("nan"), dtype=torch.bfloat16)
    y[1:1 + t * k] = torch.randn(t * k, h, generator=gen).bfloat16()
    rows = (torch.randperm(t * k, generator=gen) + 1).int().view(t, k)
    drop = torch.rand(t, k, generator=gen) < 0.4
    drop[2] = True  # a token with every route dropped: zeros
    rows = torch.where(drop, torch.where(torch.rand(t, k, generator=gen) < 0.5, -1, 1 + t * k), rows)
    got = combine_routes(y.to(DEV), rows.to(DEV), None, 1 + t * k).cpu()
    assert bool(torch.isfinite(got).all()) and not bool(got[2].any())
    want = (y.float()[rows.clamp(0, t * k).long()] * (~drop)[..., None]).nan_to_num(0.0).sum(1).bfloat16()
    assert int((_ordered(got) - _ordered(want)).abs().max()) <= 1


def test_combine_implicit_rows_edges() -> None:
    """combine_routes handles no tokens and refuses mismatched or missing arguments."""
    y = torch.zeros(6, 16, dtype=torch.bfloat16, device=DEV)
    ids = torch.zeros(0, 2, dtype=torch.int32, device=DEV)
    assert combine_routes(y, None, None, topk_ids=ids, num_experts=4).shape == (0, 16)
    with pytest.raises(ValueError, match="T\\*k"):
        combine_routes(y, None, None, topk_ids=torch.zeros(4, 2, dtype=torch.int32, device=DEV), num_experts=4)
    with pytest.raises(ValueError, match="topk_ids and num_experts"):
        combine_routes(y, None, None, topk_ids=ids)
    with pytest.raises(ValueError, match="limit"):
        combine_routes(y, torch.zeros(3, 2, dtype=torch.int32, device=DEV), None)
