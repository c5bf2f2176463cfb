"""Unchecked mode keeps compress_decode, compress, indexer_q_prep, indexer_logits and moe_route inside their buffers
for out-of-range indices, in the PyTorch reference and the portable Triton kernels (the interpreter on the CPU, the
GPU where there is one), and gives the documented in-buffer result: a slot outside the state skips its row, a
position outside the RoPE table is clamped into it, a block-table entry outside the cache is a block of -inf, a hash
id outside the experts (or a token outside the table) drops the route. Every buffer lies in guarded memory
(guard_memory.assert_confined). Checked mode still refuses these inputs."""

from __future__ import annotations

import functools

import pytest
import torch
from conftest import TRITON_DEVICE
from guard_memory import assert_confined

import dsv4hal
from dsv4hal.errors import InvalidArgumentError
from dsv4hal.formats.indexer_cache import IndexerPagedCache, quantize_rows, write_rows

DEV = TRITON_DEVICE
INT32_MAX = 2**31 - 1
IMPLS = ("reference", "triton")
KERNELS = {"compress_decode": "triton_compress_decode",
           "indexer_q_prep": "triton_indexer_q_prep", "indexer_logits": "triton_indexer_logits",
           "moe_route": "triton_moe_route"}


@functools.cache
def _platform(op: str, impl: str, checked: bool = False):  # noqa: ANN202
    """The platform whose `op` is the reference or the Triton kernel: the CPU platform where Triton runs under the
    interpreter, the machine's default platform on a GPU."""
    kernel = "torch_reference" if impl == "reference" else KERNELS[op]
    with dsv4hal.overrides(kernels={op: kernel}):
        return dsv4hal.select_platform("cpu" if DEV.type == "cpu" else None, checked=checked)


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ---------------------------------------------------------------- compress_decode

RATIO, HD = 4, 128
WIDTH = 2 * 2 * HD  # C4: [kv_ov | kv_cur | score_ov | score_cur]
SLOTS, RING, MAX_POS = 3, 8, 64


def _decode_args(slots: list[int], positions: list[int]) -> dict[str, torch.Tensor]:
    g = _gen(1)
    return {
        "kv_score": torch.randn(len(slots), WIDTH, generator=_gen(11)).to(DEV),
        "state": torch.randn(SLOTS, RING, WIDTH, generator=g).to(DEV),  # every ring row written: reads matter
        "slots": torch.tensor(slots, dtype=torch.int32, device=DEV),
        "positions": torch.tensor(positions, dtype=torch.int32, device=DEV),
        "ape": torch.randn(RATIO, 2 * HD, generator=g).to(DEV),
        "norm_weight": torch.rand(HD, generator=g).to(DEV) + 0.5,
        "cos": torch.rand(MAX_POS, 32, generator=g).to(DEV),
        "sin": torch.rand(MAX_POS, 32, generator=g).to(DEV),
    }


def _decode_confined(impl: str, args: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """(output, state after the call), the call run with every buffer in guarded memory."""
    op = _platform("compress_decode", impl).ops.compress_decode

    def build(guard):  # noqa: ANN001, ANN202
        a = {k: guard(v) for k, v in args.items()}
        return (lambda: (op(**a, ratio=RATIO, hadamard=True), a["state"].clone())), [a["state"]]

    return assert_confined(build)


def _decode_plain(impl: str, args: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    a = {k: v.clone() for k, v in args.items()}
    out = _platform("compress_decode", impl).ops.compress_decode(**a, ratio=RATIO, hadamard=True)
    return out, a["state"]


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("slot", [-1, -7, SLOTS, INT32_MAX], ids=["minus1", "minus7", "end", "int32max"])
def test_compress_decode_slot_outside_state_skips_the_row(impl: str, slot: int) -> None:
    """A slot outside [0, S) reads and writes no ring (its own, another request's, or memory past the state) and
    gives a zero row; the other rows are as without it."""
    args = _decode_args([0, slot, 2], [7, 11, 3])  # rows 0 and 1 close a group (they would read their ring)
    out, state = _decode_confined(impl, args)
    assert torch.equal(out[1].cpu(), torch.zeros(HD))
    alone = _decode_args([0, 2], [7, 3])
    alone["kv_score"] = args["kv_score"][[0, 2]]
    out_alone, state_alone = _decode_plain(impl, alone)
    assert torch.equal(state.cpu(), state_alone.cpu())  # only rings 0 and 2 written, as without the skipped row
    # a batch of another size: the same bits on the CPU, a GPU's batched reductions may round otherwise
    tol = 0 if DEV.type == "cpu" else 1e-5
    torch.testing.assert_close(out[[0, 2]].cpu(), out_alone.cpu(), rtol=tol, atol=tol)
    assert bool(out[0].abs().gt(0).any())  # the valid closing row is a real compressed row


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(("position", "clamped"), [(-1, 0), (-7, 0), (MAX_POS, MAX_POS - 1),
                                                   (INT32_MAX, MAX_POS - 1)],
                         ids=["minus1", "minus7", "end", "int32max"])
def test_compress_decode_position_outside_table_is_clamped(impl: str, position: int, clamped: int) -> None:
    """A position outside [0, max_pos) acts as the nearest table position: same ring row written, same closing
    decision, RoPE from a row inside the table; an int32-max position does not crash."""
    args = _decode_args([1, 0], [position, 7])
    out, state = _decode_confined(impl, args)
    want_out, want_state = _decode_plain(impl, {**args, "positions": torch.tensor([clamped, 7], dtype=torch.int32,
                                                                                   device=DEV)})
    assert torch.equal(out.cpu(), want_out.cpu()) and torch.equal(state.cpu(), want_state.cpu())
    assert bool(torch.isfinite(out).all())


def test_compress_decode_reference_and_triton_agree_on_bad_indices() -> None:
    """The reference and the Triton kernel give the same output and rings for a batch mixing skipped slots and
    clamped positions."""
    args = _decode_args([0, -1, SLOTS, 1, -7, 2], [7, 11, 3, INT32_MAX, -1, -5])
    ref_out, ref_state = _decode_plain("reference", args)
    tri_out, tri_state = _decode_plain("triton", args)
    torch.testing.assert_close(tri_out.cpu(), ref_out.cpu(), rtol=1e-4, atol=1e-4)
    assert torch.equal(tri_state.cpu(), ref_state.cpu())
    assert torch.equal(ref_out[[1, 2, 4]].cpu(), torch.zeros(3, HD))


# ---------------------------------------------------------------- compress (prefill), group past the table

@pytest.mark.parametrize("impl", IMPLS)
def test_compress_group_past_the_table_reads_its_last_row(impl: str) -> None:
    """Prefill groups whose position lies past the RoPE table (cu_seqlens unchecked on a GPU) rotate by the
    table's last row instead of reading past it."""
    from dsv4hal.kernels.triton.compress import compress as triton_compress
    from dsv4hal.reference.compress import compress as reference_compress

    fn = reference_compress if impl == "reference" else triton_compress  # the contract reads cu_seqlens on the CPU
    g = _gen(2)
    n, short = 24, 3  # groups at positions 0, 4, ..., 20; a table of 3 rows covers only the first
    cos, sin = torch.rand(n, 32, generator=g).to(DEV), torch.rand(n, 32, generator=g).to(DEV)
    args = {"kv_score": torch.randn(n, WIDTH, generator=g).to(DEV),
            "cu_seqlens": torch.tensor([0, n], dtype=torch.int32, device=DEV),
            "ape": torch.randn(RATIO, 2 * HD, generator=g).to(DEV), "norm_weight": torch.ones(HD, device=DEV)}

    def build(guard):  # noqa: ANN001, ANN202
        a = {k: guard(v) for k, v in args.items()}
        c, s = guard(cos[:short]), guard(sin[:short])
        return (lambda: fn(**a, cos=c, sin=s, ratio=RATIO, hadamard=True)), []

    got = assert_confined(build)
    last = torch.arange(n, device=DEV).clamp(max=short - 1)
    want = fn(**args, cos=cos[last], sin=sin[last], ratio=RATIO, hadamard=True)
    assert torch.equal(got.cpu(), want.cpu()) and got.shape == (n // RATIO, HD)


# ---------------------------------------------------------------- indexer_q_prep

def _q_prep_args(position: int, q_scale: float = 1.0) -> dict[str, torch.Tensor]:
    g = _gen(3)
    return {"q": (torch.randn(2, 64, 128, generator=g) * q_scale).to(DEV),
            "weights": torch.randn(2, 64, generator=g).to(DEV),
            "cos": torch.rand(MAX_POS, 32, generator=g).to(DEV), "sin": torch.rand(MAX_POS, 32, generator=g).to(DEV),
            "positions": torch.tensor([position, 5], dtype=torch.int32, device=DEV)}


def _bytes(q8: torch.Tensor) -> torch.Tensor:
    return q8.cpu().view(torch.uint8)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize(("position", "clamped"), [(-1, 0), (-7, 0), (MAX_POS, MAX_POS - 1),
                                                   (INT32_MAX, MAX_POS - 1)],
                         ids=["minus1", "minus7", "end", "int32max"])
def test_indexer_q_prep_position_outside_table_is_clamped(impl: str, position: int, clamped: int) -> None:
    """A position outside [0, max_pos) rotates by the nearest table row (no read outside cos/sin, no
    IndexError, no crash at int32 max)."""
    op = _platform("indexer_q_prep", impl).ops.indexer_q_prep
    args = _q_prep_args(position)

    def build(guard):  # noqa: ANN001, ANN202
        a = {k: guard(v) for k, v in args.items()}
        return (lambda: op(**a)), []

    q8, w = assert_confined(build)
    want_q8, want_w = op(**{**args, "positions": torch.tensor([clamped, 5], dtype=torch.int32, device=DEV)})
    assert torch.equal(_bytes(q8), _bytes(want_q8)) and torch.equal(w.cpu(), want_w.cpu())


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("fp8", ["e4m3fn", "e4m3fnuz"])
def test_indexer_q_prep_finite_inputs_near_float_max_saturate(impl: str, fp8: str) -> None:
    """Finite q and weights near the fp32 max give finite, saturated outputs (codes at +-FP8_MAX, weights at most
    the fp32 max), not NaN or inf, as checked mode accepts them."""
    from dsv4hal.formats.fp8 import FP8_MAX, fp8_to_float

    op = _platform("indexer_q_prep", impl, checked=True).ops.indexer_q_prep
    args = _q_prep_args(3)
    big = torch.finfo(torch.float32).max
    args["q"] = torch.where(args["q"] > 0, big, -big)
    args["q"][1] = 3e38
    args["weights"] = torch.full((2, 64), 3e38, device=DEV)
    q8, w = op(**args, fp8=fp8)
    codes = fp8_to_float(_bytes(q8), fp8)
    assert bool(torch.isfinite(codes).all()) and bool(torch.isfinite(w).all())
    assert float(codes.abs().amax()) == FP8_MAX[fp8]
    assert float(w.amax()) == big  # the folded weight overflowed and saturated


def test_indexer_q_prep_saturation_keeps_kernel_equal_to_reference() -> None:
    """The saturating clamps round nothing: the kernel's codes and weights equal the reference's bit for bit on
    inputs near the float max and on ordinary ones."""
    for scale in (1.0, 1e37):
        args = _q_prep_args(9, scale)
        args["weights"] = args["weights"] * 1e36
        ref_q8, ref_w = _platform("indexer_q_prep", "reference").ops.indexer_q_prep(**args)
        tri_q8, tri_w = _platform("indexer_q_prep", "triton").ops.indexer_q_prep(**args)
        assert torch.equal(_bytes(tri_q8), _bytes(ref_q8)) and torch.equal(tri_w.cpu(), ref_w.cpu())


# ---------------------------------------------------------------- indexer_logits

PAGES = 3


def _cache() -> IndexerPagedCache:
    g = _gen(4)
    cache = IndexerPagedCache.empty(PAGES, device="cpu")
    raw, sc = quantize_rows(torch.randn(PAGES * 64, 128, generator=g), "e4m3fn")
    write_rows(cache, torch.arange(PAGES * 64), raw, sc)
    return IndexerPagedCache(cache.data.to(DEV), "e4m3fn")


def _logits_args(table: list[list[int]]) -> dict[str, torch.Tensor]:
    g = _gen(5)
    q = torch.randn(2, 64, 128, generator=g).to(torch.float8_e4m3fn)
    return {"q": q.to(DEV), "weights": torch.rand(2, 64, generator=g).to(DEV),
            "context_lens": torch.tensor([100, 128], dtype=torch.int32, device=DEV),
            "block_table": torch.tensor(table, dtype=torch.int32, device=DEV)}


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("page", [-1, -7, PAGES, INT32_MAX], ids=["minus1", "minus7", "end", "int32max"])
def test_indexer_logits_block_outside_cache_is_skipped(impl: str, page: int) -> None:
    """A used block-table entry outside [0, num_pages) reads no page: its 64 logits are -inf (as positions not
    present); the other blocks are as with a valid table."""
    op = _platform("indexer_logits", impl).ops.indexer_logits
    cache, args = _cache(), _logits_args([[1, page], [2, 0]])

    def build(guard):  # noqa: ANN001, ANN202
        a = {k: guard(v) for k, v in args.items()}
        c = IndexerPagedCache(guard(cache.data), cache.fp8)
        return (lambda: op(**a, cache=c)), []

    got = assert_confined(build).cpu()
    want = op(**{**args, "block_table": torch.tensor([[1, 0], [2, 0]], dtype=torch.int32, device=DEV)},
              cache=cache).cpu()
    assert bool(torch.isneginf(got[0, 64:]).all())
    assert torch.equal(got[0, :64], want[0, :64]) and torch.equal(got[1], want[1])
    assert bool(torch.isfinite(got[0, :64]).all())


def test_indexer_logits_reference_and_triton_agree_on_bad_blocks() -> None:
    """Both implementations give the same logits (and -inf in the same places) for a table mixing bad entries,
    with context lengths past the table and negative ones."""
    args = _logits_args([[1, -1], [INT32_MAX, 0]])
    args["context_lens"] = torch.tensor([INT32_MAX, -3], dtype=torch.int32, device=DEV)
    ref = _platform("indexer_logits", "reference").ops.indexer_logits(**args, cache=_cache()).cpu()
    tri = _platform("indexer_logits", "triton").ops.indexer_logits(**args, cache=_cache()).cpu()
    assert torch.equal(torch.isneginf(ref), torch.isneginf(tri)) and not bool(tri.isnan().any())
    fin = torch.isfinite(ref)
    assert bool(fin[0, :64].all()) and not bool(fin[0, 64:].any()) and not bool(fin[1].any())
    rtol = 1e-5 if DEV.type == "cpu" else 1e-3  # the GPU's dot sums in another order
    assert torch.allclose(tri[fin], ref[fin], rtol=rtol, atol=rtol / 10)


# ---------------------------------------------------------------- moe_route (hash layers)

EXPERTS, VOCAB, TOP_K = 16, 10, 3


def _route_confined(impl: str, table: torch.Tensor, tokens: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    op = _platform("moe_route", impl).ops.moe_route
    logits = torch.randn(len(tokens), EXPERTS, generator=_gen(6)).to(DEV)
    ids = torch.tensor(tokens, dtype=torch.int32, device=DEV)

    def build(guard):  # noqa: ANN001, ANN202
        lg, tb, tk = guard(logits), guard(table), guard(ids)
        return (lambda: op(lg, None, TOP_K, 1.5, tb, tk)), []

    return assert_confined(build)


def _table() -> torch.Tensor:
    return torch.randint(0, EXPERTS, (VOCAB, TOP_K), generator=_gen(7), dtype=torch.int32).to(DEV)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("expert", [-1, -7, EXPERTS, INT32_MAX], ids=["minus1", "minus7", "end", "int32max"])
def test_moe_route_hash_id_outside_experts_drops_the_route(impl: str, expert: int) -> None:
    """A hash-table id outside [0, E) is a dropped route (id -1, weight 0, as moe_experts skips negative ids);
    the token's other routes share the scaled weight."""
    table = _table()
    table[4, 1] = expert
    ids, w = _route_confined(impl, table, [4, 2])
    assert ids[0, 1].item() == -1 and w[0, 1].item() == 0.0
    assert torch.equal(ids[0, [0, 2]].cpu(), table[4, [0, 2]].cpu()) and torch.equal(ids[1].cpu(), table[2].cpu())
    assert torch.allclose(w.sum(1).cpu(), torch.full((2,), 1.5)) and bool((w[0, [0, 2]] > 0).all())


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("token", [-1, -7, VOCAB, INT32_MAX], ids=["minus1", "minus7", "end", "int32max"])
def test_moe_route_input_id_outside_table_drops_the_token(impl: str, token: int) -> None:
    """An input id outside [0, vocab) reads no table row: all its routes are dropped (ids -1, weights 0, not
    NaN); the other tokens route as usual."""
    table = _table()
    ids, w = _route_confined(impl, table, [3, token])
    assert torch.equal(ids[1].cpu(), torch.full((TOP_K,), -1, dtype=torch.int32))
    assert torch.equal(w[1].cpu(), torch.zeros(TOP_K))
    assert torch.equal(ids[0].cpu(), table[3].cpu()) and abs(w[0].sum().item() - 1.5) < 1e-5


# ---------------------------------------------------------------- checked mode

def _checked_calls() -> dict[str, tuple[str, object]]:
    d = _decode_args([0, 0], [7, 3])
    q = _q_prep_args(3)
    lg = _logits_args([[1, 0], [2, 0]])
    logits = torch.randn(2, EXPERTS, device=DEV)
    return {
        "compress_decode slot -1": ("compress_decode",
                                    lambda ops: ops.compress_decode(**{**d, "slots": d["slots"] * 0 - 1}, ratio=RATIO)),
        "compress_decode position == max_pos": ("compress_decode", lambda ops: ops.compress_decode(
            **{**d, "positions": d["positions"] * 0 + MAX_POS}, ratio=RATIO)),
        "indexer_q_prep position -7": ("indexer_q_prep", lambda ops: ops.indexer_q_prep(
            **{**q, "positions": q["positions"] * 0 - 7})),
        "indexer_logits page == num_pages": ("indexer_logits", lambda ops: ops.indexer_logits(
            **{**lg, "block_table": lg["block_table"] * 0 + PAGES}, cache=_cache())),
        "moe_route hash id == E": ("moe_route", lambda ops: ops.moe_route(
            logits, None, TOP_K, 1.5, torch.full((VOCAB, TOP_K), EXPERTS, dtype=torch.int32, device=DEV),
            torch.tensor([1, 2], device=DEV))),
        "moe_route input id -1": ("moe_route", lambda ops: ops.moe_route(
            logits, None, TOP_K, 1.5, _table(), torch.tensor([1, -1], device=DEV))),
    }


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("case", list(_checked_calls()))
def test_checked_mode_refuses_the_bad_index(impl: str, case: str) -> None:
    """Checked mode refuses each out-of-range index with InvalidArgumentError, whichever implementation runs."""
    op, call = _checked_calls()[case]
    with pytest.raises(InvalidArgumentError):
        call(_platform(op, impl, checked=True).ops)
