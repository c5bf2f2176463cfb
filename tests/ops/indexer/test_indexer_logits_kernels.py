"""indexer_logits fast paths on the CPU: the portable Triton kernel under the interpreter against the reference,
and the DeepGEMM paged-MQA-logits binding (dsv4hal.kernels.deepgemm_indexer, shared by SM90 and SM100) against a fake
`deep_gemm` whose two functions check the host contract of DeepGEMM 891d57b (csrc/apis/attention.hpp: 2-D int32
contiguous lengths, block_kv 64, fused uint8 cache [blocks, 64, 1, 132] with stride(1) == 132 and stride(0) % 4,
e4m3fn q [B, next_n, 64, 128] contiguous, fp32 weights [B*next_n, 64], int32 block table with stride(1) == 1,
schedule [num_sms+1, 2]) and then compute the documented math from the SoA page view DeepGEMM builds, leaving
NaN past each context as the real kernel leaves garbage."""

from __future__ import annotations

import pytest
import torch
from dsv4hal_cuda_sm90 import kernels as sm90_kernels
from dsv4hal_cuda_sm100 import kernels as sm100_kernels
from vendor_fakes import fake_module, install_modules, simulated_info

import dsv4hal
from dsv4hal.conformance import cases_indexer_logits as cases
from dsv4hal.conformance.types import CaseSpec, compare_close
from dsv4hal.errors import InvalidArgumentError
from dsv4hal.formats.indexer_cache import IndexerPagedCache
from dsv4hal.kernels import deepgemm_indexer
from dsv4hal.kernels.triton.indexer_logits import indexer_logits as triton_logits
from dsv4hal.kernels.triton.indexer_logits import mask_tail_
from dsv4hal.reference.indexer_logits import indexer_logits as reference

# the interpreter on CPU machines, natively on a GPU (where the FP8 tensor-core dot needs the catalog's tolerance)
DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")
RTOL = 1e-5 if DEV.type == "cpu" else 1e-3
NUM_SMS = 7
SMALL = [c for c in cases.CASES if not c.gpu_only]


def _fixture(contexts: tuple[int, ...], fp8: str = "e4m3fn", seed: int = 3):  # noqa: ANN202
    spec = CaseSpec(op="indexer_logits", name="x", params={"contexts": contexts, "fp8": fp8})
    return cases.build(spec, DEV, torch.Generator().manual_seed(seed))


def _same(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.shape == want.shape and got.dtype == torch.float32
    assert not bool(torch.isnan(got).any())
    inf = torch.isinf(want)
    assert torch.equal(got[inf], want[inf])
    assert torch.allclose(got[~inf], want[~inf], rtol=RTOL, atol=RTOL / 10)


# ---------------------------------------------------------------- Triton

@pytest.mark.parametrize("spec", SMALL, ids=lambda c: c.name)
def test_triton_matches_reference_and_oracle(spec: CaseSpec) -> None:
    """The Triton indexer_logits kernel matches the reference and the oracle on small cases."""
    fx = cases.build(spec, DEV, torch.Generator().manual_seed(5))
    got = triton_logits(**fx.args)
    _same(got, reference(**fx.args))
    assert compare_close(got, fx.expected, fx.tolerance)[1]


def test_triton_several_blocks_per_program_and_garbage_tail() -> None:
    """Long contexts (several pages a program), ragged ends, and a block table whose unused tail is garbage."""
    fx = _fixture((0, 300, 1, 640, 129))
    table = fx.args["block_table"].clone()
    table[0] = 10**6  # ctx 0: no entry is read
    table[2, 1:] = -7
    args = {**fx.args, "block_table": table}
    from dsv4hal.kernels.triton import indexer_logits as mod

    assert mod.blocks_per_program(5, table.shape[1]) == 1
    old = mod.TARGET_PROGRAMS
    try:
        mod.TARGET_PROGRAMS = 4  # force several pages per program
        assert mod.blocks_per_program(5, table.shape[1]) > 1
        got = triton_logits(**args)
    finally:
        mod.TARGET_PROGRAMS = old
    _same(got, reference(**fx.args))


def test_mask_tail_writes_only_past_the_context() -> None:
    """mask_tail_ writes -inf only past each row's context, leaving the rest intact."""
    x = torch.arange(2 * 300, dtype=torch.float32, device=DEV).view(2, 300)
    buf = torch.full((2, 512), 7.0, device=DEV)
    buf[:, :300] = x
    out = mask_tail_(buf[:, :300], torch.tensor([0, 257], dtype=torch.int32, device=DEV))
    assert bool(torch.isneginf(out[0]).all())
    assert torch.equal(out[1, :257], x[1, :257]) and bool(torch.isneginf(out[1, 257:]).all())
    assert bool((buf[:, 300:] == 7.0).all())  # the padding of the buffer is untouched


# ---------------------------------------------------------------- DeepGEMM binding against a fake

class FakeDeepGemm:
    def __init__(self) -> None:
        self.meta_calls: list[tuple[int, ...]] = []
        self.logit_calls: list[dict] = []
        self.metas: list[torch.Tensor] = []

    def get_num_sms(self) -> int:
        return NUM_SMS

    def get_paged_mqa_logits_metadata(self, context_lens, block_kv, num_sms, indices=None):  # noqa: ANN001, ANN201
        assert context_lens.dim() == 2 and context_lens.dtype == torch.int32 and context_lens.is_contiguous()
        assert block_kv == 64 and num_sms == NUM_SMS and indices is None
        self.meta_calls.append(tuple(context_lens.shape))
        meta = torch.zeros(num_sms + 1, 2, dtype=torch.int32, device=context_lens.device)
        self.metas.append(meta)
        return meta

    def fp8_paged_mqa_logits(self, q, kv_cache, weights, context_lens, block_table, schedule_meta,  # noqa: ANN001
                             max_context_len, clean_logits=False, indices=None):  # noqa: ANN001, ANN201
        b, next_n, h, d = q.shape
        assert next_n >= 1 and h in (32, 64) and d in (32, 64, 128)
        assert q.dtype == torch.float8_e4m3fn and q.is_contiguous() and q.data_ptr() % 16 == 0
        nb, bk, one, row = kv_cache.shape
        assert kv_cache.dtype == torch.uint8 and one == 1 and row == d + 4 and bk in (32, 64)
        assert kv_cache.stride(1) == row and kv_cache.stride(3) == 1 and kv_cache.stride(0) % 4 == 0
        assert kv_cache.data_ptr() % 16 == 0
        assert weights.dtype == torch.float32 and weights.shape == (b * next_n, h) and weights.is_contiguous()
        assert context_lens.shape == (b, next_n) and context_lens.dtype == torch.int32
        assert context_lens.is_contiguous()
        assert block_table.dtype == torch.int32 and block_table.shape[0] == b and block_table.stride(1) == 1
        assert schedule_meta.shape == (NUM_SMS + 1, 2) and schedule_meta.dtype == torch.int32
        assert any(schedule_meta is m for m in self.metas), "the schedule must come from the metadata call"
        assert not clean_logits, "clean_logits=True asserts with 2-D context lengths"
        assert indices is None
        self.logit_calls.append({"b": b, "next_n": next_n, "width": max_context_len, "meta": id(schedule_meta)})
        # DeepGEMM's SoA page views, built from stride(0) as attention.hpp does
        s0 = kv_cache.stride(0)
        values = torch.as_strided(kv_cache, (nb, bk, d), (s0, d, 1)).view(torch.float8_e4m3fn).float()
        scales = torch.as_strided(kv_cache, (nb, bk * 4), (s0, 1), kv_cache.storage_offset() + bk * d)
        scales = scales.contiguous().view(torch.float32)
        aligned = -(-max_context_len // 256) * 256
        out = torch.full((b * next_n, aligned), float("nan"), device=q.device)
        qf = q.float().view(b * next_n, h, d)
        for r in range(b * next_n):
            ctx = int(context_lens.view(-1)[r])
            for j in range(ctx):
                page = int(block_table[r // next_n, j // bk])
                s = torch.relu(qf[r] @ values[page, j % bk] * scales[page, j % bk])
                out[r, j] = (weights[r] * s).sum()
        return out[:, :max_context_len]


@pytest.fixture
def fake_dg(monkeypatch: pytest.MonkeyPatch) -> FakeDeepGemm:
    fake = FakeDeepGemm()
    install_modules(monkeypatch, {"deep_gemm": fake_module(
        "deep_gemm", get_num_sms=fake.get_num_sms, get_paged_mqa_logits_metadata=fake.get_paged_mqa_logits_metadata,
        fp8_paged_mqa_logits=fake.fp8_paged_mqa_logits)})
    return fake


LIBS = {"deep_gemm": "2.5.0", "triton": "3.6", "flash_mla": "1.0.0"}


@pytest.mark.parametrize("contexts", [(200,), (0, 1, 63, 64, 65, 129, 0)])
def test_binding_marshals_and_matches_reference(fake_dg: FakeDeepGemm, contexts: tuple[int, ...]) -> None:
    """The DeepGEMM indexer binding passes the expected shapes and matches the reference."""
    fx = _fixture(contexts)
    got = deepgemm_indexer.indexer_logits(**fx.args)
    _same(got, reference(**fx.args))
    call = fake_dg.logit_calls[0]
    t, p = fx.args["block_table"].shape
    assert (call["b"], call["next_n"], call["width"]) == (len(contexts), 1, p * 64)
    assert fake_dg.meta_calls == [(len(contexts), 1)]


def test_cache_view_is_zero_copy() -> None:
    """fused_cache_view is a zero-copy view of the indexer cache in DeepGEMM's layout."""
    cache = IndexerPagedCache.empty(3, device=DEV)
    view = deepgemm_indexer.fused_cache_view(cache)
    assert view.shape == (3, 64, 1, 132) and view.stride() == (8448, 132, 132, 1)
    assert view.data_ptr() == cache.data.data_ptr()


def test_schedule_per_call_and_per_step(fake_dg: FakeDeepGemm) -> None:
    """The DeepGEMM indexer builds its schedule per call, or once per decode step."""
    fx = _fixture((70, 5))
    p = dsv4hal.select_platform(info=simulated_info("sm90", **LIBS))
    chosen = p.ops.indexer_logits.decide(p.ops.indexer_logits.case_of(**fx.args)).chosen
    assert chosen.name == sm90_kernels.DEEPGEMM_INDEXER
    p.ops.indexer_logits(**fx.args)
    p.ops.indexer_logits(**fx.args)
    assert len(fake_dg.meta_calls) == 2  # outside a declared step: one plan per call
    with p.decode_step():
        for _ in range(3):  # three C4 layers of one step: one plan
            p.ops.indexer_logits(**fx.args)
    assert len(fake_dg.meta_calls) == 3
    assert len({c["meta"] for c in fake_dg.logit_calls[2:]}) == 1


def test_large_batches_run_in_schedule_chunks(fake_dg: FakeDeepGemm, monkeypatch: pytest.MonkeyPatch) -> None:
    """Batches beyond MAX_TOKENS run in schedule chunks and still match the reference."""
    monkeypatch.setattr(deepgemm_indexer, "MAX_TOKENS", 2)
    fx = _fixture((3, 70, 0, 64, 1))
    got = deepgemm_indexer.indexer_logits(**fx.args)
    _same(got, reference(**fx.args))
    assert fake_dg.meta_calls == [(2, 1), (2, 1), (1, 1)]


def test_misaligned_cache_is_a_typed_error(fake_dg: FakeDeepGemm) -> None:
    """A misaligned indexer cache is refused with a typed error naming the alignment."""
    fx = _fixture((10,))
    cache = fx.args["cache"]
    pool = torch.zeros(cache.data.numel() + 8, dtype=torch.uint8, device=DEV)
    shifted = IndexerPagedCache(pool[8:].view(cache.num_pages, -1), cache.fp8)
    with pytest.raises(InvalidArgumentError, match="aligned"):
        deepgemm_indexer.indexer_logits(**{**fx.args, "cache": shifted})
    assert fake_dg.logit_calls == []


def test_empty_shapes_need_no_library() -> None:
    """Empty block tables give an empty result without calling the library."""
    fx = _fixture((0,))
    out = deepgemm_indexer.indexer_logits(**{**fx.args, "block_table": fx.args["block_table"][:, :0]})
    assert out.shape == (1, 0)


def test_supports_reasons() -> None:
    """The DeepGEMM indexer's supports() names the fp8 format it lacks, selection the version."""
    info = simulated_info("sm90", **LIBS)
    supports = sm90_kernels.deepgemm_indexer_supports
    assert supports({"fp8": "e4m3fn"}, info) == []
    assert "e4m3fn" in supports({"fp8": "e4m3fnuz"}, info)[0]
    old = dsv4hal.select_platform(info=simulated_info("sm90", **{**LIBS, "deep_gemm": "2.1.0"}))
    decision = old.ops.indexer_logits.decide({"fp8": "e4m3fn"})
    why = next(c for c in decision.candidates if c.name == sm90_kernels.DEEPGEMM_INDEXER).reasons
    assert any("2.1.0 predates 2.2.0" in r for r in why), why
    assert sm100_kernels.deepgemm_indexer_supports({"fp8": "e4m3fn"}, simulated_info("sm100", **LIBS)) == []
    for arch, name in (("sm90", sm90_kernels.DEEPGEMM_INDEXER), ("sm100", sm100_kernels.DEEPGEMM_INDEXER)):
        p = dsv4hal.select_platform(info=simulated_info(arch, **LIBS))
        assert p.ops.indexer_logits.decide({"fp8": "e4m3fn"}).chosen.name == name
        assert p.ops.indexer_logits.decide({"fp8": "e4m3fnuz"}).chosen.name == "triton_indexer_logits"
    assert deepgemm_indexer.MAX_TOKENS == 19360
