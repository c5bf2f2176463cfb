"""The Triton mHC kernels (pre, post, post_pre, head) against the references and the conformance catalog, forced
through the platform (under the interpreter on CPU machines, natively on a GPU)."""

from __future__ import annotations

import math

import pytest
import torch

import dsv4hal
from dsv4hal.conformance.runner import load_catalog, run_cell
from dsv4hal.reference import mhc as ref

pytest.importorskip("triton")

FORCED = {"mhc_pre": "triton_mhc_pre", "mhc_post": "triton_mhc_post", "mhc_post_pre": "triton_mhc_post_pre",
          "mhc_head": "triton_mhc_head"}
DEV = "cuda" if torch.cuda.is_available() else "cpu"
BF16_ULP = 2.0**-7  # one bf16 rounding step, relative


@pytest.fixture(scope="module")
def ops():  # noqa: ANN201
    with dsv4hal.overrides(kernels=FORCED):
        p = dsv4hal.select_platform()
    assert {op: p.explain(op).chosen.name for op in FORCED} == FORCED
    return p.ops


THEN = {"mhc_post_pre": "triton_mhc_post_then_pre"}  # the unfused composition, ranked above the fused kernel
CATALOG = [(forced, s, b) for forced in (FORCED, THEN) for s, b in load_catalog(forced) if not s.gpu_only]


@pytest.mark.parametrize(("forced", "spec", "build"), CATALOG,
                         ids=[f"{s.op}:{f[s.op]}:{s.name}" for f, s, _ in CATALOG])
def test_catalog_cells(forced, spec, build) -> None:  # noqa: ANN001
    """Each Triton mHC kernel passes every mHC catalog case."""
    with dsv4hal.overrides(kernels=forced):
        p = dsv4hal.select_platform()
    cell = run_cell(p, spec, build, "eager")
    assert cell.implementation == forced[spec.op]
    assert cell.status == "pass", cell.detail


def test_post_then_pre_is_post_followed_by_pre(ops) -> None:  # noqa: ANN001
    """The composition returns exactly what the two Triton kernels give when called one after the other."""
    from dsv4hal.kernels.triton.mhc import mhc_post_then_pre

    t, d = 5, 64
    x, f = _stream(t, d, 3), _stream(t, d, 4)[:, 0]
    g = torch.Generator().manual_seed(5)
    post, comb = torch.rand(t, 4, generator=g).to(DEV), torch.rand(t, 4, 4, generator=g).to(DEV)
    fn, base, scale = _gates(24, 3, d, 6)
    got = mhc_post_then_pre(f, x, post, comb, fn, base, scale)
    stream = ops.mhc_post(f, x, post, comb)
    want = (stream, *ops.mhc_pre(stream, fn, base, scale))
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a, b)


def _gates(rows: int, scales: int, d: int, seed: int, spread: float = 1.0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    fn = torch.randn(rows, 4 * d, generator=g) * spread / math.sqrt(4 * d)
    return tuple(v.to(DEV) for v in (fn, 0.5 * torch.randn(rows, generator=g), 0.5 + torch.rand(scales, generator=g)))


def _stream(t: int, d: int, seed: int, wide: bool = False) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, 4, d, generator=g)
    if wide:  # per-token and per-stream scales 2^-20 .. 2^20
        x = x * torch.exp2(torch.randint(-20, 21, (t, 4, 1), generator=g).float())
    return x.bfloat16().to(DEV)


def _close_bf16(got: torch.Tensor, want: torch.Tensor) -> None:
    """Within one bf16 step of the reference: both sum the same fp32 terms, in a different order."""
    assert got.dtype == want.dtype == torch.bfloat16 and got.shape == want.shape
    g, w = got.double(), want.double()
    assert bool(torch.isfinite(g).all())
    scale = w.abs().flatten(1).amax(1).clamp_min(1e-30).reshape(-1, *([1] * (w.dim() - 1)))
    assert bool(((g - w).abs() <= BF16_ULP * w.abs() + 1e-6 * scale).all())


@pytest.mark.parametrize("iters", [1, 20])
@pytest.mark.parametrize("t", [1, 7])
@pytest.mark.parametrize("wide", [False, True])
def test_pre_post_pre_and_head_match_reference(ops, t: int, iters: int, wide: bool) -> None:  # noqa: ANN001
    """d = 96 is no power of two (masked tails) and splits K into several programs; sharp gate logits (spread 4)
    drive the Sinkhorn hard. post/comb to 2e-5: the kernel's GEMM is fp32-accurate like the reference's,
    only the summation order differs (~1e-6 on logits of order 10)."""
    d = 96
    x = _stream(t, d, 1, wide)
    fn, base, scale = _gates(24, 3, d, 2, spread=4.0)
    got = ops.mhc_pre(x, fn, base, scale, sinkhorn_iters=iters)
    want = ref.mhc_pre(x, fn, base, scale, sinkhorn_iters=iters)
    _close_bf16(got[0], want[0])
    for g, w in zip(got[1:], want[1:], strict=True):
        torch.testing.assert_close(g, w, rtol=2e-5, atol=2e-5)
    f = (torch.randn(t, d, generator=torch.Generator().manual_seed(3)) * (1e4 if wide else 1.0)).bfloat16().to(DEV)
    post, comb = want[1], want[2]
    _close_bf16(ops.mhc_post(f, x, post, comb), ref.mhc_post(f, x, post, comb))
    got = ops.mhc_post_pre(f, x, post, comb, fn, base, scale, sinkhorn_iters=iters)
    want = ref.mhc_post_pre(f, x, post, comb, fn, base, scale, sinkhorn_iters=iters)
    _close_bf16(got[0], want[0])
    _close_bf16(got[1], want[1])
    for g, w in zip(got[2:], want[2:], strict=True):
        torch.testing.assert_close(g, w, rtol=2e-5, atol=2e-5)
    hfn, hbase, hscale = _gates(4, 1, d, 4)
    _close_bf16(ops.mhc_head(x, hfn, hbase, hscale), ref.mhc_head(x, hfn, hbase, hscale))


@pytest.mark.parametrize("t", [1, 5])
def test_comb_in_a_program_of_its_own_gives_the_same_outputs(t: int) -> None:
    """The apply launch with post and the Sinkhorn in a program of their own after the d blocks (comb_apart) writes
    what the launch with them in d block 0 writes, bit for bit, for several d blocks and a masked tail."""
    from dsv4hal.kernels.triton import mhc as tmhc

    d = 96
    x = _stream(t, d, 8, wide=True)
    fn, base, scale = _gates(24, 3, d, 9, spread=4.0)
    mix, sq = tmhc.prenorm_partials(x, fn)
    outs = [tmhc.mhc_pre_from_partials(x, mix, sq, base, scale, config={"block_d": 32, "comb_apart": apart})
            for apart in (False, True)]
    for a, b in zip(*outs, strict=True):
        assert bool(torch.isfinite(a.float()).all()) and torch.equal(a, b)
    want = ref.mhc_pre(x, fn, base, scale)
    _close_bf16(outs[1][0], want[0])


def test_zero_token_strided_input_and_empty_batch(ops) -> None:  # noqa: ANN001
    """An all-zero token at the default eps gives y = 0 and base-only gates (no NaN); a strided stream view is
    read by its strides; T = 0 returns empty outputs without a launch."""
    d = 64
    wide = _stream(3, 2 * d, 5)
    x = wide[:, :, :d]  # not contiguous
    assert not x.is_contiguous()
    x[1] = 0
    fn, base, scale = _gates(24, 3, d, 6)
    y, post, comb = ops.mhc_pre(x, fn, base, scale)
    want = ref.mhc_pre(x.contiguous(), fn, base, scale)
    assert all(bool(torch.isfinite(v).all()) for v in (y, post, comb)) and bool((y[1] == 0).all())
    torch.testing.assert_close(post[1], 2 * torch.sigmoid(base[4:8]))
    _close_bf16(y, want[0])
    torch.testing.assert_close(comb, want[2], rtol=2e-5, atol=2e-5)
    empty = x[:0]
    y, post, comb = ops.mhc_pre(empty, fn, base, scale)
    assert y.shape == (0, d) and post.shape == (0, 4) and comb.shape == (0, 4, 4)
    stream, y, post, comb = ops.mhc_post_pre(torch.zeros(0, d).bfloat16().to(DEV), empty, post, comb, fn, base, scale)
    assert stream.shape == (0, 4, d) and y.shape == (0, d)
    assert ops.mhc_post(torch.zeros(0, d).bfloat16().to(DEV), empty, post, comb).shape == (0, 4, d)


def test_kernels_refuse_what_the_contract_refuses(ops) -> None:  # noqa: ANN001
    """The Triton mHC kernels refuse what the mHC contract refuses."""
    from dsv4hal.errors import InvalidArgumentError

    fn, base, scale = _gates(24, 3, 16, 7)
    with pytest.raises(InvalidArgumentError, match="rms_eps"):
        ops.mhc_pre(_stream(2, 16, 8), fn, base, scale, rms_eps=0.0)
    with pytest.raises(InvalidArgumentError, match="hidden size"):
        ops.mhc_head(torch.zeros(2, 4, 0).bfloat16().to(DEV), fn[:4, :0], base[:4], scale[:1])
