"""The tiled routed-row quantizer (moe_quant) against a one-row-a-program kernel, frozen
below: the same bytes in the codes and scales, and the same bytes left alone (padding rows without pow2 scales),
for the GATHER and SWIGLU sources, every tile shape, row counts that are no multiple of BLOCK_R and K/128 no
multiple of BLOCK_G. Also the grouped_layout the GATHER pass writes, and what a DeepGEMM MoE call launches."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch

pytest.importorskip("triton")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

import dsv4hal.kernels.grouped_fp8_moe as gm  # noqa: E402
import dsv4hal.kernels.triton.moe_align as tma  # noqa: E402
import dsv4hal.kernels.triton.moe_combine as mc  # noqa: E402
import dsv4hal.kernels.triton.moe_quant as mq  # noqa: E402
from dsv4hal.kernels.aligned_routes import route_blocks  # noqa: E402
from dsv4hal.kernels.moe_align import align_routes  # noqa: E402
from dsv4hal.kernels.triton.fp8_codec import _encode_fp8  # noqa: E402
from dsv4hal.kernels.triton.moe_activation import _swiglu_f32, _to_bf16, swiglu_limit_args  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
# slow: minutes under the Triton interpreter (the whole suite runs it)
pytestmark = [pytest.mark.filterwarnings("ignore:.*encountered in:RuntimeWarning"), pytest.mark.slow]
SENTINEL = 0xA7  # fills every fresh buffer: bytes a kernel leaves alone keep it


@triton.jit
def _one_row_kernel(src_ptr, stride_src, sorted_ptr, q_ptr, sf_ptr, stride_sf_g, num_routes, top_k, K, limit,
                    GATHER: tl.constexpr, SWIGLU: tl.constexpr, CLAMP: tl.constexpr, POW2: tl.constexpr):
    """The untiled quantizer, frozen as the oracle: one program a sorted row."""
    r = tl.program_id(0)
    route = tl.load(sorted_ptr + r)
    cols = tl.arange(0, 128)
    if route >= num_routes:
        if POW2:
            for g in range(0, K // 128):
                tl.store(q_ptr + r.to(tl.int64) * K + g * 128 + cols, tl.zeros([128], dtype=tl.uint8))
                tl.store(sf_ptr + g * stride_sf_g + r, 1.0)
        return
    src_row = (route // top_k) if GATHER else r
    base = src_ptr + src_row.to(tl.int64) * stride_src
    for g in range(0, K // 128):
        c = g * 128 + cols
        if SWIGLU:
            act = _swiglu_f32(tl.load(base + c).to(tl.float32), tl.load(base + K + c).to(tl.float32), limit, CLAMP)
            v = _to_bf16(act).to(tl.float32)
        else:
            v = tl.load(base + c).to(tl.float32)
        amax = tl.maximum(tl.max(tl.abs(v), axis=0), 1e-4)
        scale = amax / 448.0
        if POW2:
            bits = scale.to(tl.int32, bitcast=True)
            up = (bits & 0x7FFFFF) != 0
            scale = ((bits & 0x7F800000) + tl.where(up, 0x800000, 0)).to(tl.float32, bitcast=True)
        y = tl.minimum(tl.maximum(v / scale, -448.0), 448.0)
        tl.store(q_ptr + r.to(tl.int64) * K + c, _encode_fp8(y, False))
        tl.store(sf_ptr + g * stride_sf_g + r, scale)


def _one_row(src: torch.Tensor, sorted_routes: torch.Tensor, p: int, top_k: int, k: int, gather: bool,
             limit: float | None, pow2: bool) -> tuple[torch.Tensor, torch.Tensor]:
    rows = sorted_routes.numel()
    q = torch.full((rows, k), SENTINEL, dtype=torch.uint8, device=DEV)
    sf = torch.full((k // 128, rows * 4), SENTINEL, dtype=torch.uint8, device=DEV).view(torch.float32)
    lim, clamp = swiglu_limit_args(limit)
    _one_row_kernel[(rows,)](src, src.stride(0), sorted_routes, q, sf, sf.stride(0), p, top_k, k, lim, GATHER=gather,
                             SWIGLU=limit is not None, CLAMP=clamp, POW2=pow2)
    return q, sf.t()


def _sentinel_empty(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch.empty inside moe_quant returns SENTINEL bytes, so unwritten elements can be compared too."""
    real = torch.empty

    def empty(*size: Any, dtype: torch.dtype, device: Any) -> torch.Tensor:
        t = real(*size, dtype=dtype, device=device)
        t.view(torch.uint8).fill_(SENTINEL)
        return t

    monkeypatch.setattr(mq.torch, "empty", empty)


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8).cpu()


def _case(rows: int, k: int, p: int, top_k: int, swiglu: bool, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """src and sorted_routes with padding (value p) between, after and inside runs of routes, in random order."""
    gen = torch.Generator().manual_seed(seed)
    t = -(-p // top_k)
    cols = 2 * k if swiglu else k
    src = torch.randn(rows if swiglu else t, cols, generator=gen) * 8
    src[0, :128] = 0  # an all-zero group: amax floored at 1e-4
    src[-1, 128:256] *= 1e-6  # tiny values: subnormal codes
    routes = torch.randperm(rows, generator=gen)[:rows]
    sorted_routes = torch.where(routes < p, routes, p).to(torch.int32)
    return src.bfloat16().to(DEV), sorted_routes.to(DEV)


SOURCES = [("gather", None), ("swiglu", 10.0), ("swiglu", math.inf)]
TILES = [(1, 16), (2, 8), (4, 4), (8, 2), (16, 1), None]  # None: row_tile's choice


@pytest.mark.parametrize("tile", TILES)
@pytest.mark.parametrize("pow2", [False, True])
@pytest.mark.parametrize(("source", "limit"), SOURCES)
def test_bytes_match_the_one_row_kernel(monkeypatch: pytest.MonkeyPatch, source: str, limit: float | None,
                                        pow2: bool, tile: tuple[int, int] | None) -> None:
    """The tiled routed-row quantizer writes the same bytes as the one-row kernel."""
    # 37 rows (no multiple of any BLOCK_R > 1), K = 384 (3 groups: BLOCK_G 2, 4, 8, 16 leave lanes empty)
    rows, k, p, top_k = 37, 384, 23, 3
    src, sorted_routes = _case(rows, k, p, top_k, source == "swiglu", seed=len(source) + int(pow2))
    want_q, want_sf = _one_row(src, sorted_routes, p, top_k, k, source == "gather", limit, pow2)
    _sentinel_empty(monkeypatch)
    q, sf = mq.quantize_routed_rows(src, sorted_routes, p, top_k, k, gather=source == "gather", swiglu_limit=limit,
                                    pow2_scales=pow2, tile=tile, fast=False)
    assert sf.shape == (rows, 3) and sf.stride() == (1, rows)
    assert torch.equal(_bytes(q), _bytes(want_q))
    assert torch.equal(_bytes(sf.t()), _bytes(want_sf.t()))
    padding = (sorted_routes >= p).cpu()
    assert bool((_bytes(q)[padding] == (0 if pow2 else SENTINEL)).all())


def test_strided_gemm1_rows_and_wide_k(monkeypatch: pytest.MonkeyPatch) -> None:
    """SWIGLU rows read from a wider buffer (row stride > 2K) and K = 2048 (16 groups, several BLOCK_G steps)."""
    rows, k, p = 12, 2048, 9
    gen = torch.Generator().manual_seed(5)
    big = (torch.randn(rows, 2 * k + 256, generator=gen) * 30).bfloat16().to(DEV)
    src = big[:, : 2 * k]
    sorted_routes = torch.tensor([3, 9, 0, 9, 8, 1, 2, 9, 4, 5, 6, 7], dtype=torch.int32, device=DEV)
    want_q, want_sf = _one_row(src, sorted_routes, p, 1, k, False, 10.0, False)
    _sentinel_empty(monkeypatch)
    for tile in ((1, 16), (2, 4), (4, 4)):
        q, sf = mq.quantize_routed_rows(src, sorted_routes, p, 1, k, gather=False, swiglu_limit=10.0, tile=tile,
                                        fast=False)
        assert torch.equal(_bytes(q), _bytes(want_q)) and torch.equal(_bytes(sf.t()), _bytes(want_sf.t()))


@pytest.mark.parametrize("limit", [10.0, math.inf])
def test_fast_swiglu_within_one_fp8_step_of_the_exact_form(limit: float) -> None:
    """The SwiGLU pass's default (FAST_SWIGLU: approximate exp and division) against torch's roundings (fast=False):
    scales within one bf16 ulp (amax is a bf16 value), dequantized values within one FP8 step of the exact form's,
    differing codes rare, and a NaN in GEMM1's output FP8's NaN in both (not quantized to a finite code). On the
    CPU interpreter both forms use numpy's exp and division, so the bounds bite on a GPU."""
    rows, k, p = 96, 1024, 80
    gen = torch.Generator().manual_seed(11)
    src = torch.randn(rows, 2 * k, generator=gen) * torch.logspace(-3, 1.5, 2 * k)[torch.randperm(2 * k, generator=gen)]
    src[5, 300] = float("nan")  # gate of row 5, group 2
    src = src.bfloat16().to(DEV)
    sorted_routes = torch.cat([torch.randperm(p, generator=gen), torch.full((rows - p,), p)]).to(torch.int32).to(DEV)
    assert mq.FAST_SWIGLU
    fast = mq.quantize_routed_rows(src, sorted_routes, p, 1, k, gather=False, swiglu_limit=limit)
    exact = mq.quantize_routed_rows(src, sorted_routes, p, 1, k, gather=False, swiglu_limit=limit, fast=False)
    valid = (sorted_routes < p).cpu()
    (qf, sf), (qe, se) = ((q.cpu()[valid], s.cpu()[valid]) for q, s in (fast, exact))
    assert not bool(se.isnan().any()) and not bool(sf.isnan().any())  # amax skips the NaN: scales stay finite
    assert bool(((sf - se).abs() <= se * 2.0 ** -7).all())
    scale_e, scale_f = se.repeat_interleave(128, dim=1), sf.repeat_interleave(128, dim=1)
    deq_f = qf.view(torch.float8_e4m3fn).float() * scale_f
    deq_e = qe.view(torch.float8_e4m3fn).float() * scale_e
    nan = torch.zeros_like(deq_e, dtype=torch.bool)
    nan[5, 300] = True  # rows 0..p-1 hold routes, so sorted row 5 is valid row 5; gate column 300 -> output 300
    for deq in (deq_e, deq_f):  # the NaN is carried as FP8's NaN, nothing else is NaN
        assert torch.equal(deq.isnan(), nan)
    ok = ~nan
    # one e4m3 step at the exact code's binade (subnormals: 2^-9 of the scale)
    step = scale_e * 2.0 ** (deq_e.abs() / scale_e).clamp(min=2.0 ** -6).log2().floor() * 2.0 ** -3
    assert bool(((deq_f - deq_e).abs()[ok] <= step[ok] * 1.01 + scale_e[ok] * 2.0 ** -6).all())
    assert float((qf != qe)[ok].float().mean()) < 1e-3


@pytest.mark.parametrize(("t", "k", "e"), [(1, 6, 16), (5, 3, 8), (40, 4, 4)])
def test_layout_written_by_the_gather_pass(t: int, k: int, e: int) -> None:
    """The grouped_layout from the GATHER launch is the tensor the torch ops built before (where +
    repeat_interleave), tail blocks included."""
    gen = torch.Generator().manual_seed(t)
    ids = torch.randint(0, e, (t, k), generator=gen, dtype=torch.int32)
    ids[0, 0] = -1  # dropped
    routes = align_routes(ids.to(DEV), e, 8)
    rows, p = routes.sorted_routes.numel(), t * k
    x = torch.randn(t, 128, generator=gen).bfloat16().to(DEV)
    layout = torch.full((rows,), 77, dtype=torch.int32, device=DEV)
    q, sf = mq.quantize_routed_rows(x, routes.sorted_routes, p, k, 128, gather=True, layout=layout,
                                    block_expert=routes.block_expert)
    want = torch.where(routes.sorted_routes < p, routes.block_expert.repeat_interleave(8), -1)
    assert torch.equal(layout.cpu(), want.cpu())
    with pytest.raises(ValueError, match="together"):
        mq.quantize_routed_rows(x, routes.sorted_routes, p, k, 128, gather=True, layout=layout)
    with pytest.raises(ValueError, match="int32"):
        mq.quantize_routed_rows(x, routes.sorted_routes, p, k, 128, gather=True, layout=layout[1:],
                                block_expert=routes.block_expert)
    # block_expert alone (the psum layout's gather pass): the same rows and the same tile, no layout store
    launched: list[dict[str, Any]] = []
    kernel = mq._quant_rows_kernel

    class Spy:
        def __getitem__(self, grid: Any) -> Callable[..., None]:
            def launch(*args: Any, **kwargs: Any) -> None:
                launched.append({"grid": grid, "layout_arg": args[6], **kwargs})
                kernel[grid](*args, **kwargs)
            return launch

    mq._quant_rows_kernel = Spy()
    try:  # the one-launch pass (per_token=False): the per-token pass writes the layout in its copy launch
        q2, sf2 = mq.quantize_routed_rows(x, routes.sorted_routes, p, k, 128, gather=True,
                                          block_expert=routes.block_expert, per_token=False)
        mq.quantize_routed_rows(x, routes.sorted_routes, p, k, 128, gather=True, layout=layout,
                                block_expert=routes.block_expert, per_token=False)
    finally:
        mq._quant_rows_kernel = kernel
    valid = (routes.sorted_routes < p).cpu()
    assert torch.equal(q2.cpu()[valid], q.cpu()[valid]) and torch.equal(sf2.cpu()[valid], sf.cpu()[valid])
    assert launched[0]["LAYOUT"] is False and launched[1]["LAYOUT"] is True
    assert launched[0]["layout_arg"] is routes.sorted_routes  # a stand-in pointer, never stored to
    assert {n: launched[0][n] for n in ("grid", "BLOCK_R", "BLOCK_G")} == \
        {n: launched[1][n] for n in ("grid", "BLOCK_R", "BLOCK_G")}


@pytest.mark.parametrize("layout", [False, True])
@pytest.mark.parametrize("pow2", [False, True])
@pytest.mark.parametrize(("t", "top_k", "k"), [(1, 6, 128), (9, 2, 384), (37, 3, 4352)])
def test_per_token_gather_gives_the_same_bytes(monkeypatch: pytest.MonkeyPatch, t: int, top_k: int, k: int,
                                               pow2: bool, layout: bool) -> None:
    """The gather pass in two launches (each token quantized once, its codes and scales copied to its routes' rows)
    writes the bytes of the one-launch pass: codes, scales, padding rows (left alone, or zero with scale 1 under
    pow2), dropped routes and the per-row layout. K = 4352 takes the copy past one COPY_WORDS step with a ragged
    tail; rows of no multiple of COPY_ROWS."""
    gen = torch.Generator().manual_seed(t * k + int(pow2))
    x = (torch.randn(t, k, generator=gen) * 8)
    x[0, :128] = 0  # an all-zero group: amax floored
    x[-1, -128:] *= 1e-6
    x = x.bfloat16().to(DEV)
    ids = torch.randint(0, 5, (t, top_k), generator=gen, dtype=torch.int32)
    ids[0, 0] = -1  # dropped
    routes = align_routes(ids.to(DEV), 5, 8)
    rows, p = routes.sorted_routes.numel(), t * top_k
    outs = []
    launched: list[str] = []
    for per_token, row_of_route in ((False, None), (True, None), (True, routes.row_of_route)):
        _sentinel_empty(monkeypatch)
        for name in ("_quant_rows_kernel", "_gather_codes_kernel", "_quant_scatter_kernel"):
            monkeypatch.setattr(mq, name, _Spy(getattr(mq, name), launched, name))
        lay = torch.full((rows,), 77, dtype=torch.int32, device=DEV) if layout else None
        q, sf = mq.quantize_routed_rows(x, routes.sorted_routes, p, top_k, k, gather=True, pow2_scales=pow2,
                                        layout=lay, block_expert=routes.block_expert, per_token=per_token,
                                        row_of_route=row_of_route)
        outs.append((_bytes(q), _bytes(sf.t()), None if lay is None else lay.cpu()))
        monkeypatch.undo()
    # the scatter launch serves the last call unless padding rows must be written (pow2 zeros, the per-row layout)
    scatter = not pow2 and not layout
    assert launched.count("_quant_scatter_kernel") == int(scatter)
    assert launched.count("_gather_codes_kernel") == 2 - int(scatter)
    for q2, s2, l2 in outs[1:]:
        q1, s1, l1 = outs[0]
        assert torch.equal(q1, q2) and torch.equal(s1, s2)
        if layout:
            assert torch.equal(l1, l2)
        padding = (routes.sorted_routes >= p).cpu()
        assert bool(padding.any()) and bool((q2[padding] == (0 if pow2 else SENTINEL)).all())
        assert not bool((q2[~padding] == SENTINEL).all(dim=1).any())  # every route's row written
    with pytest.raises(ValueError, match="gather pass only"):
        mq.quantize_routed_rows(x, routes.sorted_routes, p, top_k, k, gather=False, swiglu_limit=10.0,
                                per_token=True)


class _Spy:
    """A Triton kernel's stand-in that records its launches by name and launches the kernel."""

    def __init__(self, kernel: Any, log: list[str], name: str) -> None:
        self.kernel, self.log, self.name = kernel, log, name

    def __getitem__(self, grid: Any) -> Callable[..., Any]:
        self.log.append(self.name)
        return self.kernel[grid]


def test_row_tile() -> None:
    """Decode rows are sparse (a route or two at a block's start): one row, many groups; prefill: MAX_BLOCK_R rows."""
    assert mq.row_tile(768, 6, 4096) == (1, 16)  # T=1, top-6 of 256 experts, H=4096
    assert mq.row_tile(57088, 24576, 4096) == (4, 4)  # T=4096: at most MAX_BLOCK_R rows (H200 sweep)
    assert mq.row_tile(35584, 3072, 2048) == (4, 4)  # T=512: ~11 routes a block
    assert mq.row_tile(8, 6, 128) == (16, 1)  # one group only: the tile is all rows
    assert mq.row_tile(0, 0, 256) == (1, 2)


@pytest.mark.parametrize(("t", "k", "programs"), [(3, 1280, 256), (9, 2048, 256), (5, 1536, 4), (1, 128, 256)])
def test_direct_pass_split_over_groups_gives_the_exact_codes(monkeypatch: pytest.MonkeyPatch, t: int, k: int,
                                                              programs: int) -> None:
    """quantize_tokens splits a row's 128-groups over programs (grid axis 1, runs that end inside a BLOCK_G step
    included) and still writes act_quant_1x128's codes and scales, every group once."""
    from dsv4hal.formats.fp8_block import act_quant_1x128

    monkeypatch.setattr(mq, "DIRECT_PROGRAMS", programs)
    x = (torch.randn(t, k, generator=torch.Generator().manual_seed(t * k)).bfloat16() * 3).to(DEV)
    codes, scales = mq.quantize_tokens(x)
    want_q, want_s = act_quant_1x128(x.cpu())
    assert torch.equal(codes.cpu(), want_q.view(torch.uint8))
    assert torch.equal(scales.cpu(), want_s)


@pytest.mark.parametrize(("t", "g", "k"), [(1, 8, 512), (5, 8, 256), (9, 2, 1280)])
def test_grouped_tokens_keep_the_exact_codes_in_the_per_group_layout(t: int, g: int, k: int) -> None:
    """quantize_grouped_tokens gives each (token, group) row act_quant_1x128's codes and scales, the scales in
    [G, T, K/128] MN-major blocks of pitch align(T, 4)."""
    from dsv4hal.formats.fp8_block import act_quant_1x128

    x = (torch.randn(t, g, k, generator=torch.Generator().manual_seed(t * g + k)).bfloat16() * 3).to(DEV)
    codes, scales = mq.quantize_grouped_tokens(x)
    want_q, want_s = act_quant_1x128(x.cpu().reshape(t * g, k))
    assert torch.equal(codes.cpu(), want_q.view(torch.uint8).view(t, g, k))
    assert torch.equal(scales.cpu(), want_s.view(t, g, k // 128))
    pitch = -(-t // 4) * 4
    assert scales.permute(1, 0, 2).stride() == (k // 128 * pitch, 1, pitch)


# ---------------------------------------------------------------- launches of one DeepGEMM MoE call

class _Launches:
    """Wraps a Triton kernel: counts launches and marks them, so that the interpreter's own torch ops are not
    taken for the glue's."""

    inside = 0

    def __init__(self, kernel: Any, counts: dict[str, int], name: str) -> None:
        self.kernel, self.counts, self.name = kernel, counts, name

    def __getitem__(self, grid: Any) -> Callable[..., None]:
        def launch(*args: Any, **kwargs: Any) -> None:
            self.counts[self.name] = self.counts.get(self.name, 0) + 1
            _Launches.inside += 1
            try:
                self.kernel[grid](*args, **kwargs)
            finally:
                _Launches.inside -= 1
        return launch


class _Ops(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        if not _Launches.inside:
            self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


@dataclass(frozen=True)
class _Weights:
    num_experts: int = 8
    hidden: int = 256
    intermediate: int = 128
    alignment: int = 128
    w13: Any = None
    w13_scale: Any = None
    w2: Any = None
    w2_scale: Any = None


# allocations and views: no kernel, what is left of the torch ops around the GPU work
NO_KERNEL = {"aten.empty.memory_format", "aten.view.default", "aten.view.dtype", "aten.t.default",
             "aten.detach.default"}


@pytest.mark.parametrize("per_token", [False, True])
@pytest.mark.parametrize("psum", [False, True])
@pytest.mark.parametrize("t", [1, 30])
def test_one_call_launches(monkeypatch: pytest.MonkeyPatch, t: int, psum: bool, per_token: bool) -> None:
    """align (one launch up to 512 routes), two quantize passes (the first writes grouped_layout), two GEMMs and
    the combine: no torch kernel between them (the layout took three: lt, clone of the repeat, where). With the
    psum layout the GEMMs get align's expert_end and an expected M computed from the shapes. From
    PER_TOKEN_MIN_TOKENS tokens (here lowered to t) the gather pass quantizes each token once: straight into its
    routes' rows (psum) or as a token pass and a copy (per-row layout), still no torch kernel."""
    counts: dict[str, int] = {}
    monkeypatch.setattr(mq, "PER_TOKEN_MIN_TOKENS", t if per_token else t + 1)
    for mod, name in ((tma, "_align_kernel"), (mq, "_quant_rows_kernel"), (mq, "_gather_codes_kernel"),
                      (mq, "_quant_scatter_kernel"), (mc, "_combine_kernel")):
        monkeypatch.setattr(mod, name, _Launches(getattr(mod, name), counts, name))
    monkeypatch.setattr(gm, "align_routes", functools.partial(align_routes, impl="triton"))  # the GPU's path
    layouts: list[torch.Tensor] = []
    keywords: list[dict[str, Any]] = []

    def gemm(a: Any, b: Any, d: torch.Tensor, grouped_layout: torch.Tensor, **kw: Any) -> None:
        counts["gemm"] = counts.get("gemm", 0) + 1
        layouts.append(grouped_layout)  # d left as it is: the values do not matter here
        keywords.append(kw)

    gen = torch.Generator().manual_seed(t)
    x = torch.randn(t, 256, generator=gen).bfloat16().to(DEV)
    ids = torch.randint(0, 8, (t, 4), generator=gen, dtype=torch.int32).to(DEV)
    tw = torch.rand(t, 4, generator=gen).to(DEV)
    gm.grouped_fp8_moe(gemm, x, ids, tw, _Weights(), 10.0, psum=psum)  # warm-up: compiles
    counts.clear()
    with _Ops() as mode:
        y = gm.grouped_fp8_moe(gemm, x, ids, tw, _Weights(), 10.0, psum=psum)
    assert y.shape == (t, 256)
    # per token: with the psum layout the tokens' codes go straight to their rows (no padding row is written),
    # with the per-row layout a token pass and a copy that writes the layout
    gather = ({"_quant_scatter_kernel": 1, "_quant_rows_kernel": 1} if psum else
              {"_quant_rows_kernel": 2, "_gather_codes_kernel": 1}) if per_token else {"_quant_rows_kernel": 2}
    assert counts == {"_align_kernel": 1, "_combine_kernel": 1, "gemm": 2, **gather}
    assert set(mode.ops) <= NO_KERNEL, sorted(set(mode.ops) - NO_KERNEL)
    assert layouts[-1] is layouts[-2] and layouts[-1].dtype == torch.int32
    if psum:
        want = align_routes(ids, 8, 128, impl="torch").expert_end
        assert layouts[-1].shape == (8,) and torch.equal(layouts[-1].cpu(), want.cpu())
        assert keywords[-1] == keywords[-2] == {"use_psum_layout": True, "expected_m_for_psum_layout": -(-t * 4 // 8)}
    else:
        assert layouts[-1].shape == (route_blocks(t * 4, 8, 128) * 128,) and keywords[-1] == {}
