"""indexer_store: the contract, the two scale rules, the sync-free skip of the byte model, the Triton kernel
(bit-exact with the reference under the interpreter) and its selection; the demo stores through the op."""

from __future__ import annotations

import pytest
import torch
from vendor_fakes import simulated_info

import dsv4hal
from dsv4hal.conformance import cases_indexer_store as cases
from dsv4hal.errors import InvalidArgumentError
from dsv4hal.formats.fp8 import FP8_MAX
from dsv4hal.formats.indexer_cache import IndexerPagedCache, quantize_rows, read_rows, row_scales, write_rows
from dsv4hal.ops import indexer_store as contract
from dsv4hal.reference.indexer_store import indexer_store as reference

CPU = torch.device("cpu")
DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # Triton: the interpreter on CPU machines


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_pow2_scales_are_the_exact_ceiling() -> None:
    """pow2 row scales are the smallest power of two at or above the amax scale."""
    amax = torch.rand(4096, generator=_gen()) * torch.exp2(torch.randint(-20, 20, (4096,), generator=_gen(1)).float())
    for fp8 in ("e4m3fn", "e4m3fnuz"):
        plain, pow2 = row_scales(amax, fp8, "amax"), row_scales(amax, fp8, "pow2")
        mant, _ = torch.frexp(pow2)
        assert bool((mant == 0.5).all())  # powers of two
        assert bool((pow2 >= plain).all()) and bool((pow2 < 2 * plain).all())
        # vLLM's exp2f(ceilf(log2f(s))) agrees away from powers of two
        assert torch.equal(pow2, torch.exp2(torch.ceil(torch.log2(plain))))
    s = torch.tensor([2.0**-10, 2.0**-10 * (1 + 2**-23)])  # a power of two, and one ulp above it
    got = row_scales(s * FP8_MAX["e4m3fn"], "e4m3fn", "pow2")
    assert got.tolist() == [2.0**-10, 2.0**-9]
    with pytest.raises(ValueError, match="scale mode"):
        row_scales(amax, "e4m3fn", "ue8m0")


def test_pow2_quantization_never_saturates() -> None:
    """pow2-scaled indexer rows never exceed the FP8 range and round within tolerance."""
    k = torch.randn(256, 128, generator=_gen()) * 7
    raw, s = quantize_rows(k, "e4m3fn", "pow2")
    back = raw.view(torch.float8_e4m3fn).float() * s[:, None]
    assert bool((raw.view(torch.float8_e4m3fn).float().abs().amax(1) <= 448).all())
    assert bool(((back - k).abs() <= 2.0**-4 * k.abs() + 2.0**-10 * s[:, None]).all())


def test_write_rows_skips_without_touching_other_bytes() -> None:
    """write_rows skips -1, negative and out-of-range locations and writes no other bytes."""
    cache = IndexerPagedCache(torch.randint(0, 256, (3, 8448), generator=_gen(), dtype=torch.uint8))
    before = cache.data.clone()
    raw, s = quantize_rows(torch.randn(4, 128, generator=_gen(2)))
    write_rows(cache, torch.tensor([-1, -5, 3 * 64, 10**6]), raw, s)  # nothing addressable: nothing changes
    assert torch.equal(cache.data, before)
    write_rows(cache, torch.tensor([-1, 70, -1, 3]), raw, s)
    values, scales = read_rows(cache, torch.tensor([70, 3]))
    assert torch.equal(scales, s[[1, 3]])
    allowed = torch.zeros_like(before, dtype=torch.bool)
    for page, off in ((1, 6), (0, 3)):  # slots 70 and 3: their values and their scale, nothing else
        allowed[page, off * 128:(off + 1) * 128] = True
        allowed[page, 8192 + off * 4:8192 + off * 4 + 4] = True
    assert not bool(((cache.data != before) & ~allowed).any())


def _args(fp8: str = "e4m3fn") -> dict:
    return {"k": torch.zeros(3, 128), "loc": torch.tensor([0, -1, 5]), "cache": IndexerPagedCache.empty(1, fp8)}


def test_validate_accepts_and_cases() -> None:
    """indexer_store validation accepts valid calls and reports their case."""
    contract.validate(**_args(), checked=True)
    contract.validate(**{**_args(), "k": torch.zeros(3, 128, dtype=torch.bfloat16)}, scale="pow2", checked=True)
    assert contract.case(**_args("e4m3fnuz"), scale="pow2") == {"fp8": "e4m3fnuz", "scale": "pow2"}


@pytest.mark.parametrize("change", [
    {"k": torch.zeros(3, 128, dtype=torch.float16)}, {"k": torch.zeros(3, 64)}, {"loc": torch.tensor([0, 1])},
    {"loc": torch.tensor([0.0, 1.0, 2.0])}, {"cache": torch.zeros(1, 8448, dtype=torch.uint8)},
    {"scale": "ue8m0"}, {"scale": None},
])
def test_validate_rejects(change: dict) -> None:
    """indexer_store refuses a wrong k dtype or width, loc shape or dtype, cache or scale rule."""
    with pytest.raises(InvalidArgumentError):
        contract.validate(**{**_args(), **change})


@pytest.mark.parametrize("change, match", [
    ({"loc": torch.tensor([0, -2, 5])}, "loc"), ({"loc": torch.tensor([0, 64, 5])}, "loc"),
    ({"k": torch.full((3, 128), float("nan"))}, "finite"),
])
def test_checked_mode(change: dict, match: str) -> None:
    """Checked indexer_store refuses bad locations and non-finite k; unchecked mode does not look."""
    contract.validate(**{**_args(), **change})
    with pytest.raises(InvalidArgumentError, match=match):
        contract.validate(**{**_args(), **change}, checked=True)


@pytest.mark.parametrize("name", ["n1", "n64_int32_bf16", "decode_b64_pow2", "e4m3fnuz_amax_tiny_n64",
                                  "e4m3fnuz_pow2_pow2_n64", "e4m3fn_amax_huge_n64"])
def test_triton_is_bit_exact(name: str) -> None:
    """The Triton indexer_store writes the same bytes as the reference."""
    from dsv4hal.kernels.triton.indexer_store import indexer_store as triton_store

    spec = next(c for c in cases.CASES if c.name == name)
    for fn in (reference, triton_store):
        fx = cases.build(spec, DEV, _gen(4))
        fn(**fx.args)
        err, ok, detail = fx.compare(fx.extract(None, fx.args), fx.expected)
        assert ok and err == 0.0, (fn.__module__, detail)


def test_oracle_catches_a_wrong_scale_rule() -> None:
    """The indexer_store oracle fails a store made with the wrong scale rule."""
    spec = next(c for c in cases.CASES if c.name == "n64_int32_bf16")
    fx = cases.build(spec, CPU, _gen(4))
    reference(**{**fx.args, "scale": "pow2"})
    err, ok, _ = fx.compare(fx.extract(None, fx.args), fx.expected)
    assert not ok and err > 0


def test_selection() -> None:
    """GPU platforms choose the Triton indexer_store and the cpu platform the reference."""
    p = dsv4hal.select_platform(info=simulated_info("sm90", triton="3.6"))
    assert p.ops.indexer_store.decide({"fp8": "e4m3fn", "scale": "pow2"}).chosen.name == "triton_indexer_store"
    assert dsv4hal.select_platform("cpu").ops.indexer_store.decide().chosen.name == "torch_reference"


def test_demo_stores_through_the_op() -> None:
    """The demo's indexer stores go through the indexer_store op."""
    from dsv4hal.demo import Tape, run_demo

    platform = dsv4hal.select_platform("cpu")
    tape = Tape(platform.ops)
    res = run_demo(platform, batch=2, context=20, steps=1, tape=tape)
    stores = [c for c in tape.calls if c[0] == "indexer_store"]
    assert stores and res["decode_calls"]["indexer_store"] >= 1
    decode_loc = stores[-1][1][1]
    assert bool((decode_loc == -1).any())  # rows that close no group pass -1, no scratch slot
