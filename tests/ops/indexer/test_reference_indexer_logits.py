"""FP8 indexer cache format, the indexer-logits reference, its contract and its conformance catalog."""

from __future__ import annotations

import struct

import pytest
import torch

from dsv4hal.conformance import cases_indexer_logits as cases
from dsv4hal.conformance.types import compare_close
from dsv4hal.errors import InvalidArgumentError
from dsv4hal.formats.fp8 import FP8_MAX, float_to_fp8_bytes, fp8_dtype
from dsv4hal.formats.indexer_cache import (
    PAGE_BYTES,
    PAGE_SIZE,
    TOKEN_BYTES,
    IndexerPagedCache,
    exact_dequant,
    quantize_rows,
    read_rows,
    write_rows,
)
from dsv4hal.ops import indexer_logits as contract
from dsv4hal.reference.indexer_logits import indexer_logits

CPU = torch.device("cpu")


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ---------------------------------------------------------------- format

def test_constants() -> None:
    """The indexer cache constants and an empty cache's shape match the spec."""
    assert TOKEN_BYTES == 132 and PAGE_SIZE == 64 and PAGE_BYTES == 8448 == 64 * 132
    cache = IndexerPagedCache.empty(3)
    assert cache.data.shape == (3, 8448) and cache.data.dtype == torch.uint8 and cache.num_slots == 192


@pytest.mark.parametrize("fp8", ["e4m3fn", "e4m3fnuz"])
def test_quantize_rows_bound(fp8: str) -> None:
    """Indexer quantize_rows scales are amax / FP8 max rounded once to fp32."""
    k = torch.randn(64, 128, generator=_gen()) * torch.exp(2 * torch.randn(64, 1, generator=_gen(1)))
    k[0] = 0.0
    raw, scale = quantize_rows(k, fp8)
    assert raw.dtype == torch.uint8 and scale.dtype == torch.float32
    # plain fp32 (not a power of two), correctly rounded: the fp64 quotient rounded once to fp32
    assert torch.equal(scale, (k.abs().amax(1).clamp_min(1e-4).double() / FP8_MAX[fp8]).float())
    deq = exact_dequant(k, fp8)
    # 3 mantissa bits: normals within 2^-4 relative; subnormals within half a step (<= 2^-10 of the scale)
    bound = 2.0**-4 * k.abs().double() + 2.0**-10 * scale.double()[:, None]
    assert bool(((deq - k.double()).abs() <= bound).all())
    assert bool(torch.isfinite(deq).all())
    amax_code = raw.view(fp8_dtype(fp8)).float().abs().amax(1)
    assert torch.equal(amax_code[1:], torch.full((63,), FP8_MAX[fp8]))  # the row maximum lands on FP8_MAX
    assert bool((deq[0] == 0).all())


def test_write_rows_byte_layout_and_skip() -> None:
    """write_rows puts codes and scale at the spec's byte offsets and skips -1."""
    cache = IndexerPagedCache.empty(2)
    k = torch.randn(2, 128, generator=_gen())
    raw, scale = quantize_rows(k)
    write_rows(cache, torch.tensor([65, -1]), raw, scale)
    page = cache.data[1]
    assert torch.equal(page[128:256], raw[0])  # offset 1 of page 1
    assert bytes(page[8192 + 4 : 8192 + 8].tolist()) == struct.pack("<f", scale[0].item())
    page[128:256] = 0
    page[8192 + 4 : 8192 + 8] = 0
    assert int(cache.data.count_nonzero()) == 0  # nothing else was touched, the loc -1 row was skipped
    write_rows(cache, torch.tensor([65, 3]), raw, scale)
    values, s = read_rows(cache, torch.tensor([3, 65, -1]))
    assert torch.equal(s, torch.stack((scale[1], scale[0], torch.tensor(0.0))))
    assert torch.equal((values.double() * s.double()[:, None])[:2], exact_dequant(k)[[1, 0]])
    assert bool((values[2] == 0).all())


# ---------------------------------------------------------------- reference semantics

def _fp8(values: list[float], fp8: str = "e4m3fn") -> torch.Tensor:
    row = torch.zeros(128)
    row[: len(values)] = torch.tensor(values)
    return float_to_fp8_bytes(row, fp8)


def test_hand_example_relu_weights_and_context() -> None:
    """Two heads, three keys on page 1: relu clips per head before weighting; entries past ctx are -inf."""
    cache = IndexerPagedCache.empty(2)
    raw = torch.stack([_fp8([2.0]), _fp8([-1.5]), _fp8([0.5]), _fp8([8.0])])
    write_rows(cache, torch.tensor([64, 65, 66, 67]), raw, torch.tensor([0.25, 1.0, 2.0, 1.0]))
    q = torch.zeros(2, 64, 128)
    q[0, 0, 0], q[0, 1, 0] = 3.0, -1.0
    weights = torch.zeros(2, 64)
    weights[0, 0], weights[0, 1] = 0.5, -1.0
    out = indexer_logits(
        q.to(torch.float8_e4m3fn), weights, cache,
        torch.tensor([3, 0], dtype=torch.int32), torch.tensor([[1, -1], [0, 1]], dtype=torch.int32),
    )
    assert out.shape == (2, 128) and out.dtype == torch.float32
    # head 0: 0.5*relu(3*2*0.25)=0.75, 0.5*relu(3*-1.5*1)=0, 0.5*relu(3*0.5*2)=1.5
    # head 1: -1*relu(-1*2*0.25)=0, -1*relu(-1*-1.5*1)=-1.5, -1*relu(-1*0.5*2)=0
    assert out[0, :3].tolist() == [0.75, -1.5, 1.5]
    assert bool(torch.isneginf(out[0, 3:]).all())  # slot 67 holds data but is past the context
    assert bool(torch.isneginf(out[1]).all())


def test_block_table_selects_pages() -> None:
    """indexer_logits reads keys through the block table's pages."""
    cache = IndexerPagedCache.empty(3)
    raw = torch.stack([_fp8([1.0]), _fp8([2.0]), _fp8([4.0])])
    write_rows(cache, torch.tensor([0, 64, 128 + 63]), raw, torch.ones(3))
    q = torch.zeros(1, 64, 128)
    q[0, 0, 0] = 1.0
    weights = torch.zeros(1, 64)
    weights[0, 0] = 1.0
    out = indexer_logits(q.to(torch.float8_e4m3fn), weights, cache, torch.tensor([128], dtype=torch.int32),
                         torch.tensor([[2, 1]], dtype=torch.int32))
    assert out[0, 63].item() == 4.0 and out[0, 64].item() == 2.0
    assert out[0, 0].item() == 0.0 and out[0, 65].item() == 0.0


# ---------------------------------------------------------------- contract

def _args(fp8: str = "e4m3fn") -> dict:
    return {
        "q": torch.zeros(2, 64, 128, dtype=fp8_dtype(fp8)), "weights": torch.zeros(2, 64),
        "cache": IndexerPagedCache.empty(4, fp8), "context_lens": torch.tensor([65, 0], dtype=torch.int32),
        "block_table": torch.tensor([[3, 1, -1], [-1, -1, -1]], dtype=torch.int32),
    }


def test_validate_accepts_good_arguments() -> None:
    """indexer_logits validation accepts good arguments and reports the case."""
    contract.validate(**_args(), checked=True)
    contract.validate(**_args("e4m3fnuz"), checked=True)
    assert contract.case(**_args("e4m3fnuz")) == {"fp8": "e4m3fnuz"}


@pytest.mark.parametrize(
    "change",
    [
        {"q": torch.zeros(2, 64, 128, dtype=torch.bfloat16)},
        {"q": torch.zeros(2, 64, 128, dtype=torch.float8_e4m3fnuz)},  # cache is e4m3fn
        {"q": torch.zeros(2, 32, 128, dtype=torch.float8_e4m3fn)},
        {"weights": torch.zeros(2, 64, dtype=torch.bfloat16)},
        {"weights": torch.zeros(3, 64)},
        {"context_lens": torch.tensor([65, 0])},
        {"block_table": torch.tensor([3, 1], dtype=torch.int32)},
        {"block_table": torch.zeros(1, 3, dtype=torch.int32)},
        {"cache": torch.zeros(4, 8448, dtype=torch.uint8)},
        {"cache": IndexerPagedCache(torch.zeros(4, 8192, dtype=torch.uint8))},
        {"cache": IndexerPagedCache(torch.zeros(4, 8448, dtype=torch.uint8), "e5m2")},
    ],
)
def test_validate_rejects(change: dict) -> None:
    """indexer_logits validation refuses each bad q, weights, lengths, block table or cache."""
    with pytest.raises(InvalidArgumentError):
        contract.validate(**{**_args(), **change})


@pytest.mark.parametrize(
    "change, match",
    [
        ({"block_table": torch.tensor([[3, 4, -1], [-1, -1, -1]], dtype=torch.int32)}, "block_table"),
        ({"block_table": torch.tensor([[3, -1, 0], [-1, -1, -1]], dtype=torch.int32)}, "block_table"),
        ({"context_lens": torch.tensor([193, 0], dtype=torch.int32)}, "context_lens"),
        ({"context_lens": torch.tensor([-1, 0], dtype=torch.int32)}, "context_lens"),
        ({"weights": torch.full((2, 64), float("nan"))}, "finite"),
        ({"q": torch.full((2, 64, 128), float("nan")).to(torch.float8_e4m3fn)}, "finite"),
    ],
)
def test_checked_mode_catches_values(change: dict, match: str) -> None:
    """Checked indexer_logits refuses bad block tables, lengths and non-finite values."""
    args = {**_args(), **change}
    contract.validate(**args)  # unchecked mode reads no values
    with pytest.raises(InvalidArgumentError, match=match):
        contract.validate(**args, checked=True)


# ---------------------------------------------------------------- catalog

def test_catalog_shape() -> None:
    """The indexer_logits catalog covers batch sizes 1, 4, 16 and contexts at page edges."""
    assert {c.op for c in cases.CASES} == {"indexer_logits"}
    cpu = [c for c in cases.CASES if not c.gpu_only]
    assert {len(c.params["contexts"]) for c in cpu} == {1, 4, 16}
    contexts = {n for c in cpu for n in c.params["contexts"]}
    assert {0, 1, 63, 64, 65, 200} <= contexts
    assert cases.TOLERANCES["indexer_logits"].reason


@pytest.mark.parametrize("spec", [c for c in cases.CASES if not c.gpu_only], ids=lambda c: c.name)
def test_catalog_fixture_passes_on_reference(spec) -> None:
    """Every CPU indexer_logits catalog fixture validates and passes on the reference."""
    fx = cases.build(spec, CPU, _gen(3))
    contract.validate(**fx.args, checked=True)
    err, ok, detail = compare_close(indexer_logits(**fx.args), fx.expected, fx.tolerance)
    assert ok, detail


def test_catalog_tolerance_catches_a_wrong_page() -> None:
    """The indexer_logits tolerance fails a result read from other tokens' pages."""
    spec = next(c for c in cases.CASES if c.name == "t16_mixed")
    fx = cases.build(spec, CPU, _gen(3))
    args = dict(fx.args)
    args["block_table"] = fx.args["block_table"].flip(0)  # every token reads another token's pages
    args["context_lens"] = fx.args["context_lens"].flip(0)
    wrong = indexer_logits(**args).flip(0)
    assert not compare_close(wrong, fx.expected, fx.tolerance)[1]


def test_write_rows_scratch_slot_takes_skipped_rows() -> None:
    """With a scratch slot, write_rows sends skipped rows there and nowhere else."""
    cache = IndexerPagedCache.empty(2)
    raw, scale = quantize_rows(torch.randn(2, 128, generator=_gen()))
    write_rows(cache, torch.tensor([-1, 70]), raw, scale, scratch=0)
    values, s = read_rows(cache, torch.tensor([0, 70]))
    assert torch.equal(s, scale) and int(cache.data[1, :128].count_nonzero()) == 0  # row 0 went to slot 0 only
    assert torch.equal(cache.values()[0, 0], raw[0]) and torch.equal(cache.values()[1, 6], raw[1])
