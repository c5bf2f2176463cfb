"""The rocm plugin on simulated gfx942/gfx950: platform and FP8 flavour, kernel choice with reasons,
`dsv4hal info --simulate`, the arguments handed to fake sgl-kernel and aiter entry points (checked against
their documented signatures; the fakes' outputs are never checked), the split-K combine, and the cache
conversion round trip."""

from __future__ import annotations

import json
import math

import dsv4hal_rocm
import pytest
import torch
from dsv4hal_rocm import aiter_ops, sgl_ops
from vendor_fakes import TOPK_SCHEMA, install_aiter, install_sgl_kernel, simulated_info

import dsv4hal
from dsv4hal import override as ov
from dsv4hal.cli import main
from dsv4hal.errors import InvalidArgumentError
from dsv4hal.formats.v4_cache import (
    V4PagedCache,
    dequantize_records,
    page_bytes,
    quantize_tokens,
    read_records,
    write_records,
)
from dsv4hal.platform import load_registry
from dsv4hal.selection import select_kernel

TOPK, DECODE = "indexer_topk", "sparse_attention_decode"
TOPK_CASE = {"k": 512, "page_transform": True, "size": "large"}
DECODE_CASE = {"h_q": 64, "compress_ratio": 4, "fp8": "e4m3fn", "swa_page_size": 256, "extra_page_size": 64,
               "extra_width": 512}


def _decide(op: str, case: dict, arch: str = "gfx942", **libs: str):  # noqa: ANN202
    return select_kernel(load_registry(), op, case, simulated_info(arch, **libs), "rocm", ov.Overrides())


def _candidate(decision, name: str):  # noqa: ANN001, ANN202
    return next(c for c in decision.candidates if c.name == name)


@pytest.mark.parametrize(("arch", "fp8"), [("gfx942", "e4m3fnuz"), ("gfx950", "e4m3fn")])
def test_amd_archs_pick_rocm_with_their_fp8(arch: str, fp8: str) -> None:
    """gfx942 and gfx950 select rocm with their FP8 formats."""
    p = dsv4hal.select_platform(info=simulated_info(arch, triton="3.9"))
    assert p.name == "rocm" and p.info.fp8 == fp8 and p.device_type == "cuda"


def test_indexer_topk_choice_and_reasons() -> None:
    """ROCm picks the sgl_kernel HIP top-k when present, else the portable kernel, with reasons."""
    d = _decide(TOPK, TOPK_CASE, sgl_kernel="0.4.10", triton="3.9")
    assert d.chosen.name == "sgl_kernel_hip_topk" and d.chosen.tier == "vendor" and d.chosen.plugin == "rocm"
    assert _decide(TOPK, {**TOPK_CASE, "k": 1024}, sgl_kernel="0.4.10").chosen.name == "sgl_kernel_hip_topk"
    d = _decide(TOPK, TOPK_CASE, triton="3.9")  # a wide row (size=large): the portable sampled top-k
    assert d.chosen.name == "triton_sampled_topk"
    assert _candidate(d, "sgl_kernel_hip_topk").reasons == ("missing sgl_kernel",)
    d = _decide(TOPK, TOPK_CASE)
    assert d.chosen.name == "torch_reference"
    d = _decide(TOPK, {**TOPK_CASE, "page_transform": False}, sgl_kernel="0.4.10", triton="3.9")
    assert d.chosen.name == "triton_sampled_topk"
    assert any("needs a page_table" in r for r in _candidate(d, "sgl_kernel_hip_topk").reasons)
    d = _decide(TOPK, {**TOPK_CASE, "k": 2048}, sgl_kernel="0.4.10")
    assert any("k <= 1024" in r for r in _candidate(d, "sgl_kernel_hip_topk").reasons)


def test_attention_decode_choice_and_reasons() -> None:
    """ROCm picks aiter sparse decode on gfx950 with e4m3fn only, giving reasons otherwise."""
    d = _decide(DECODE, DECODE_CASE, "gfx950", aiter="0.1", triton="3.9")
    assert d.chosen.name == "aiter_pa_decode_sparse" and d.chosen.requires == ("aiter", "triton")
    d = _decide(DECODE, {**DECODE_CASE, "fp8": "e4m3fnuz"}, "gfx942", aiter="0.1", triton="3.9")
    reasons = _candidate(d, "aiter_pa_decode_sparse").reasons
    assert d.chosen.name != "aiter_pa_decode_sparse"
    assert any("gfx950" in r for r in reasons) and any("e4m3fn" in r for r in reasons)
    d = _decide(DECODE, DECODE_CASE, "gfx950", triton="3.9")
    assert _candidate(d, "aiter_pa_decode_sparse").reasons == ("missing aiter",)
    # The rocm plugin registers no prefill: the generic implementations serve it (README: extend on ROCm).
    prefill = _decide("sparse_attention_prefill", {"h_q": 64, "width": 640}, "gfx950", aiter="0.1")
    assert all(c.plugin != "rocm" for c in prefill.candidates)


def _info_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    assert main(["info", "--json", *args]) == 0
    return json.loads(capsys.readouterr().out)


def test_cli_info_simulated_gfx942(capsys: pytest.CaptureFixture[str]) -> None:
    """info --simulate gfx942 reports rocm, e4m3fnuz, the given libraries and choices."""
    data = _info_json(capsys, "--simulate", "gfx942", "--library", "sgl_kernel=0.4.10", "--library", "aiter=0.1")
    assert data["platform"] == "rocm" and data["info"]["fp8"] == "e4m3fnuz"
    assert data["info"]["libraries"]["sgl_kernel"] == "0.4.10"
    ops = data["ops"]
    assert ops[TOPK]["chosen"] == "sgl_kernel_hip_topk"
    attn = {c["name"]: c for c in ops[DECODE]["candidates"]}
    assert ops[DECODE]["chosen"] != "aiter_pa_decode_sparse"
    assert attn["aiter_pa_decode_sparse"]["status"] == "rejected"
    assert any("gfx950" in r for r in attn["aiter_pa_decode_sparse"]["reasons"])
    data = _info_json(capsys, "--simulate", "gfx942")
    topk = {c["name"]: c for c in data["ops"][TOPK]["candidates"]}
    assert data["ops"][TOPK]["chosen"] in ("triton_sampled_topk", "torch_reference")
    assert topk["sgl_kernel_hip_topk"]["reasons"] == ["missing sgl_kernel"]


def test_cli_info_simulated_gfx950_binds_aiter(capsys: pytest.CaptureFixture[str]) -> None:
    """info --simulate gfx950 with aiter chooses aiter's sparse decode."""
    data = _info_json(capsys, "--simulate", "gfx950", "--library", "aiter=0.1", "--library", "triton=3.9")
    assert data["platform"] == "rocm" and data["info"]["fp8"] == "e4m3fn"
    assert data["ops"][DECODE]["chosen"] == "aiter_pa_decode_sparse"


# ---------------------------------------------------------------------------------------------------------
# indexer_topk -> torch.ops.sgl_kernel.deepseek_v4_topk_transform_512


def _topk_args(b: int = 4, s: int = 3000, k: int = 512, pages: int = 50):  # noqa: ANN202
    g = torch.Generator().manual_seed(2)
    scores = torch.randn(b, s + 40, generator=g)[:, :s]  # a row stride larger than the row
    lengths = torch.tensor([5, 512, 2999, 3000][:b], dtype=torch.int32)
    page_table = torch.randint(0, 1000, (b, pages), generator=g, dtype=torch.int32)
    return scores, lengths, k, page_table, 64


@pytest.mark.parametrize("k", [512, 1024])
def test_topk_marshalling(monkeypatch: pytest.MonkeyPatch, k: int) -> None:
    """The ROCm top-k binding passes sgl_kernel the expected shapes, dtypes and strides."""
    rec = install_sgl_kernel(monkeypatch)
    scores, lengths, _, page_table, page_size = _topk_args(k=k)
    raw, pages = sgl_ops.indexer_topk(scores, lengths, k, page_table, page_size)
    call = rec.only("deepseek_v4_topk_transform_512")
    f_scores, f_lens, f_pt, f_pages, f_page_size, f_raw = call.args
    assert f_scores.shape == (4, 3000) and f_scores.dtype == torch.float32 and f_scores.stride == (3040, 1)
    assert call.tensors["scores"].data_ptr() == scores.data_ptr()  # no copy of the score rows
    assert f_lens.shape == (4,) and f_lens.dtype == torch.int32 and f_lens.contiguous
    assert f_pt.shape == (4, 50) and f_pt.dtype == torch.int32 and f_pt.stride[1] == 1
    for out in (f_pages, f_raw):  # k is page_indices.size(1); raw_indices must match it
        assert out.shape == (4, k) and out.dtype == torch.int32 and out.contiguous
    assert f_page_size == 64 and type(f_page_size) is int
    assert call.tensors["page_indices"] is pages and call.tensors["raw_indices"] is raw


def test_topk_fake_op_enforces_the_schema(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fake sgl_kernel top-k op enforces the real op's schema."""
    rec = install_sgl_kernel(monkeypatch)
    op = torch.ops.sgl_kernel.deepseek_v4_topk_transform_512
    schema = str(op.default._schema)
    assert TOPK_SCHEMA.split("(")[0] in schema and "int page_size" in schema and "raw_indices" in schema
    scores, lengths, k, page_table, _ = _topk_args()
    out = torch.empty(4, k, dtype=torch.int32)
    with pytest.raises(RuntimeError):  # a float page size is refused by the dispatcher, as on the real op
        op(scores, lengths, page_table, out, 64.0, None)
    assert rec.calls == []


def test_topk_marshalling_edges(monkeypatch: pytest.MonkeyPatch) -> None:
    """The ROCm top-k binding handles strided page tables and empty batches."""
    rec = install_sgl_kernel(monkeypatch)
    scores, lengths, k, page_table, page_size = _topk_args()
    strided_pt = torch.zeros(50, 4, dtype=torch.int32).t()  # unit stride along rows, not pages
    sgl_ops.indexer_topk(scores, lengths, k, strided_pt, page_size)
    assert rec.calls[-1].args[2].stride[1] == 1
    raw, pages = sgl_ops.indexer_topk(scores[:0], lengths[:0], k, page_table[:0], page_size)
    assert len(rec.calls) == 1 and raw.shape == (0, k) and pages.shape == (0, k)  # no zero-block launch
    with pytest.raises(InvalidArgumentError, match="page_table"):
        sgl_ops.indexer_topk(scores, lengths, k, None, page_size)


def test_topk_through_the_bound_op(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bound ROCm indexer_topk op calls sgl_kernel once and returns its shapes."""
    rec = install_sgl_kernel(monkeypatch)
    p = dsv4hal.select_platform(info=simulated_info("gfx942", sgl_kernel="0.4.10", triton="3.9"))
    scores, lengths, k, page_table, page_size = _topk_args()
    raw, pages = p.ops.indexer_topk(scores, lengths, k, page_table, page_size)
    assert p.explain(TOPK).chosen.name == "sgl_kernel_hip_topk"
    assert len(rec.calls) == 1 and raw.shape == (4, 512) and pages.shape == (4, 512)


# ---------------------------------------------------------------------------------------------------------
# sparse_attention_decode -> aiter pa_decode_sparse (gfx950)


def _decode_args(t: int = 3, h: int = 64, extra: bool = True):  # noqa: ANN202
    g = torch.Generator().manual_seed(3)
    swa = V4PagedCache.empty(3, 256)
    q = torch.randn(t, h, 512, generator=g).to(torch.bfloat16)
    idx = torch.randint(0, swa.num_slots, (t, 128), generator=g, dtype=torch.int32)
    lengths = torch.tensor([128, 7, 0, 64, 100][:t], dtype=torch.int32)
    sink = torch.randn(h, generator=g)
    kw = {}
    if extra:
        c4 = V4PagedCache.empty(10, 64)
        kw = dict(extra_cache=c4,
                  extra_indices=torch.randint(0, c4.num_slots, (t, 512), generator=g, dtype=torch.int32),
                  extra_lengths=torch.tensor([512, 300, 1, 0, 20][:t], dtype=torch.int32))
    return (q, swa, idx, lengths, sink, 512 ** -0.5), kw


def _assert_csr(call, flat: str, indptr: str, indices: torch.Tensor, lengths: torch.Tensor) -> None:  # noqa: ANN001
    """CSR slot lists as pa_decode_sparse takes them: entries past a row's length are -1 (skipped)."""
    t, w = indices.shape
    f, p = call.tensors[flat], call.tensors[indptr]
    assert f.shape == (t * w,) and f.dtype == torch.int32 and f.is_contiguous()
    assert p.shape == (t + 1,) and p.dtype == torch.int32
    live = torch.arange(w)[None, :] < lengths[:, None]
    assert torch.equal(f, torch.where(live, indices, -1).reshape(-1)) and p.tolist() == list(range(0, t * w + 1, w))


def test_aiter_decode_marshalling(monkeypatch: pytest.MonkeyPatch) -> None:
    """The aiter decode binding passes pa_decode_sparse the expected arguments."""
    rec = install_aiter(monkeypatch)
    args, kw = _decode_args()
    q, swa, idx, lengths, sink, scale = args
    out, lse = aiter_ops.sparse_attention_decode(*args, **kw)
    call = rec.only("pa_decode_sparse")
    fq, fkv, f_idx, f_ptr, f_sink, f_scale = call.args
    assert fq.shape == (3, 64, 512) and fq.dtype == torch.bfloat16 and fq.stride[-1] == 1
    # the packed V4 cache as a 3-D uint8 view of the pool: [pages, 256, 584], page stride free
    assert fkv.shape == (3, 256, 584) and fkv.dtype == torch.uint8 and fkv.stride == (page_bytes(256), 584, 1)
    assert call.tensors["unified_kv"].data_ptr() == swa.data.data_ptr()
    _assert_csr(call, "kv_indices", "kv_indptr", idx, lengths)
    assert f_sink.shape == (64,) and f_sink.dtype == torch.float32 and f_sink.contiguous and f_scale == scale
    k = call.kwargs
    assert k["kv_scales"] is None and k["block_h"] is None and k["has_invalid"] is True
    assert k["skip_reduce"] is True and 2 <= k["kv_splits"] <= 16  # partials, so that lse can be returned
    x = kw["extra_cache"]
    assert k["extra_cache"].shape == (10, 64, 584) and k["extra_cache"].stride == (page_bytes(64), 584, 1)
    assert k["extra_indices"].dtype == torch.int32 and k["extra_indptr"].dtype == torch.int32
    _assert_csr(call, "extra_indices", "extra_indptr", kw["extra_indices"], kw["extra_lengths"])
    assert call.tensors["extra_cache"].data_ptr() == x.data.data_ptr()
    assert out.shape == (3, 64, 512) and out.dtype == torch.bfloat16
    assert lse.shape == (3, 64) and lse.dtype == torch.float32


def test_aiter_csr_indices_values() -> None:
    """Entries past a row's length, -1, other negatives and slots past the cache all reach aiter as -1."""
    idx = torch.arange(12, dtype=torch.int32).reshape(3, 4) + 100
    idx[1, 0] = -1
    idx[0, 2], idx[0, 3] = -7, 112  # invalid (unchecked mode lets them through): pa_decode_sparse skips only -1
    flat, indptr = aiter_ops.csr_indices(idx, torch.tensor([4, 2, 0], dtype=torch.int32), 112)
    assert indptr.tolist() == [0, 4, 8, 12]
    assert flat.tolist() == [100, 101, -1, -1, -1, 105, -1, -1, -1, -1, -1, -1]


def test_aiter_decode_swa_only_and_chunked(monkeypatch: pytest.MonkeyPatch) -> None:
    """The aiter decode binding runs SWA-only and splits rows into chunks of the split buffer."""
    rec = install_aiter(monkeypatch)
    args, _ = _decode_args(t=5, extra=False)
    monkeypatch.setattr(aiter_ops, "SPLIT_BUFFER_BYTES", 2 * 64 * 512 * 4 * 2)  # two rows per chunk at 2 splits
    monkeypatch.setattr(aiter_ops, "DEFAULT_CUS", 1)
    out, lse = aiter_ops.sparse_attention_decode(*args)
    assert [c.args[0].shape[0] for c in rec.calls] == [2, 2, 1]
    assert all(c.kwargs["extra_cache"] is None and c.kwargs["kv_splits"] == 2 for c in rec.calls)
    assert [c.args[3].shape for c in rec.calls] == [(3,), (3,), (2,)]
    assert out.shape == (5, 64, 512) and lse.shape == (5, 64)


def test_num_splits() -> None:
    """aiter num_splits caps splits by key tiles and uses the minimum when the GPU is full."""
    assert aiter_ops.num_splits(1, 64, 640, 256) == 10  # one 64-key tile per split at most
    assert aiter_ops.num_splits(1, 64, 4096, 256) == 16
    assert aiter_ops.num_splits(512, 128, 640, 256) == 2  # the GPU is full: the minimum that yields partials


def _partials(scores: torch.Tensor, values: torch.Tensor, valid: torch.Tensor, scale: float, splits: int):  # noqa: ANN202
    """Partials as aiter documents them, from plain scores: m = raw row max * scale * log2e (0 when a
    split has no valid key), l = sum 2**(score*scale*log2e - m), acc = sum of those weights times V."""
    t, h, n = scores.shape
    log2e = 1 / math.log(2)
    acc = torch.zeros(t, splits, h, values.shape[-1], dtype=torch.float64)
    m = torch.zeros(t, splits, h, dtype=torch.float64)
    l = torch.zeros_like(m)
    for s, cols in enumerate(torch.arange(n).chunk(splits)):
        sc = scores[:, :, cols].masked_fill(~valid[:, None, cols], -math.inf)
        raw_max = sc.amax(-1)
        raw_max = torch.where(torch.isfinite(raw_max), raw_max, torch.zeros_like(raw_max))
        m[:, s] = raw_max * scale * log2e
        p = torch.exp2(sc * scale * log2e - m[:, s, :, None])
        l[:, s] = p.sum(-1)
        acc[:, s] = torch.einsum("thn,tnd->thd", p, values[:, cols])
    return acc.float(), m.float(), l.float()


def test_combine_partials_matches_the_decode_math() -> None:
    """Combining split partials matches the single-pass decode math, empty splits included."""
    g = torch.Generator().manual_seed(4)
    t, h, n, d, scale = 4, 16, 96, 8, 0.3
    scores = torch.randn(t, h, n, generator=g, dtype=torch.float64) * 4
    values = torch.randn(t, n, d, generator=g, dtype=torch.float64)
    valid = torch.rand(t, n, generator=g) < 0.7
    valid[1, :48] = False  # one split with no key
    valid[2] = False  # a row with no key at all
    sink = torch.randn(h, generator=g, dtype=torch.float64)
    sink[0] = -math.inf
    out, lse = aiter_ops.combine_partials(*_partials(scores, values, valid, scale, 2), sink.float())
    s = (scores * scale).masked_fill(~valid[:, None], -math.inf)
    ref_lse = torch.logsumexp(s, -1)
    ref = torch.einsum("thn,tnd->thd", torch.softmax(s, -1).nan_to_num(0.0), values)
    ref = ref / (1 + torch.exp(sink - ref_lse))[..., None]
    ref[2] = 0.0  # no key: out 0 (the formula above is 0/0 there when the sink is -inf)
    ref_lse = torch.where(valid.any(-1)[:, None], ref_lse, torch.full_like(ref_lse, math.inf))
    assert torch.equal(torch.isinf(lse), torch.isinf(ref_lse)) and (lse[2] == math.inf).all()
    fin = torch.isfinite(ref_lse)
    torch.testing.assert_close(lse[fin].double(), ref_lse[fin], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.double(), ref, rtol=1e-2, atol=1e-2)  # bf16 output
    assert (out[2] == 0).all()


# ---------------------------------------------------------------------------------------------------------
# cache conversion


def test_convert_cache_round_trip_preserves_dequantized_values() -> None:
    """The ROCm cache conversion round-trips dequantized values."""
    assert "vendor" in (dsv4hal_rocm.convert_cache.__doc__ or "")
    g = torch.Generator().manual_seed(5)
    cache = V4PagedCache.empty(2, 64, "e4m3fn")
    k = (torch.randn(100, 512, generator=g) * torch.logspace(-3, 2, 100)[:, None]).to(torch.bfloat16)
    slots = torch.randperm(cache.num_slots, generator=g)[:100]
    write_records(cache, slots, quantize_tokens(k, "e4m3fn"))

    def values(c: V4PagedCache) -> torch.Tensor:
        return dequantize_records(read_records(c, slots), c.fp8)

    fnuz = dsv4hal_rocm.convert_cache(cache, "e4m3fnuz")
    back = dsv4hal_rocm.convert_cache(fnuz, "e4m3fn")
    assert (fnuz.fp8, back.fp8) == ("e4m3fnuz", "e4m3fn")
    assert torch.equal(values(fnuz), values(cache)) and torch.equal(values(back), values(cache))
    assert not torch.equal(fnuz.data, cache.data)  # the bytes did change
