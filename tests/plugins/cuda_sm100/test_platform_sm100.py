"""The cuda_sm100 plugin on simulated Blackwell: platform claims, kernel choice with reasons, and the
arguments handed to a fake sgl-flash-mla, checked against FlashMLA's documented contract (no GPU; the
fake's outputs are never checked)."""

from __future__ import annotations

import pytest
import torch
from dsv4hal_cuda_sm100 import flashmla as sm100
from vendor_fakes import FakeSchedMeta, install_flash_mla, simulated_info

import dsv4hal
from dsv4hal import override as ov
from dsv4hal.errors import InvalidArgumentError, PlatformNotFoundError
from dsv4hal.formats.v4_cache import TOKEN_BYTES, V4PagedCache, page_bytes
from dsv4hal.platform import load_registry
from dsv4hal.selection import select_kernel, select_platform_spec

DECODE, PREFILL = "sparse_attention_decode", "sparse_attention_prefill"
LIBS = {"flash_mla": "1.0.0", "triton": "3.9"}
DECODE_CASE = {"h_q": 64, "compress_ratio": 4, "fp8": "e4m3fn", "swa_page_size": 256, "extra_page_size": 64,
               "extra_width": 512}


def _decide(op: str, case: dict, arch: str = "sm100", platform: str = "cuda_sm100", **libs: str):  # noqa: ANN202
    return select_kernel(load_registry(), op, case, simulated_info(arch, **libs), platform, ov.Overrides())


def _candidate(decision, name: str):  # noqa: ANN001, ANN202
    return next(c for c in decision.candidates if c.name == name)


@pytest.mark.parametrize("arch", ["sm100", "sm103"])
def test_sm100_family_binds_flashmla(arch: str) -> None:
    """SM100 and SM103 select cuda_sm100 and bind FlashMLA for decode and prefill."""
    p = dsv4hal.select_platform(info=simulated_info(arch, **LIBS))
    assert p.name == "cuda_sm100" and p.info.fp8 == "e4m3fn"
    for op in (DECODE, PREFILL):
        d = p.explain(op)
        assert d.chosen.name == "flashmla_sm100_sgl" and d.chosen.tier == "vendor"
        assert d.chosen.plugin == "cuda_sm100" and d.chosen.requires == ("flash_mla",)
        assert d.chosen.priority_on("cuda_sm100") > _candidate(d, "torch_reference").priority
    assert p.explain(DECODE).chosen.layout == "v4-584-e4m3fn"
    assert p.info.libraries["flash_mla"] == "1.0.0"  # what `dsv4hal info` lists as the library version


@pytest.mark.parametrize("arch", ["sm100", "sm103"])
def test_without_flash_mla_falls_back_with_reason(arch: str) -> None:
    """Without flash_mla, SM100 attention falls back, saying flash_mla is missing."""
    d = _decide(DECODE, DECODE_CASE, arch, triton="3.9")
    assert d.chosen.name != "flashmla_sm100_sgl"
    c = _candidate(d, "flashmla_sm100_sgl")
    assert c.status == "rejected" and c.reasons == ("missing flash_mla",)


def test_supports_reasons() -> None:
    """SM100 FlashMLA rejects e4m3fnuz caches, other head counts and old versions, with reasons."""
    d = _decide(DECODE, {**DECODE_CASE, "fp8": "e4m3fnuz"}, **LIBS)
    assert d.chosen.name != "flashmla_sm100_sgl"
    assert any("e4m3fn caches only" in r for r in _candidate(d, "flashmla_sm100_sgl").reasons)
    d = _decide(DECODE, {**DECODE_CASE, "h_q": 32}, **LIBS)
    assert any("h_q 64 or 128" in r for r in _candidate(d, "flashmla_sm100_sgl").reasons)
    d = _decide(DECODE, DECODE_CASE, flash_mla="0.9.2", triton="3.9")
    assert any("predates 1.0.0" in r for r in _candidate(d, "flashmla_sm100_sgl").reasons)
    for case in ({**DECODE_CASE, "h_q": 128}, {**DECODE_CASE, "compress_ratio": 0, "extra_page_size": None,
                                                "extra_width": None}):
        assert _decide(DECODE, case, **LIBS).chosen.name == "flashmla_sm100_sgl"


@pytest.mark.parametrize(("h_q", "width", "ok"), [
    (64, 576, True), (64, 640, True), (128, 1280, True), (128, 1216, True),  # B_TOPK 64 kernels
    (128, 1344, False), (128, 1408, True),  # h128 above 1280: the regular kernel, B_TOPK 128
])
def test_prefill_topk_alignment_differs_from_sm90(h_q: int, width: int, ok: bool) -> None:
    """SM100 sparse prefill accepts widths SM90 refuses, per its top-k block rule."""
    d = _decide(PREFILL, {"h_q": h_q, "width": width}, **LIBS)
    assert (d.chosen.name == "flashmla_sm100_sgl") is ok
    if not ok:
        assert any("multiple of 128" in r for r in _candidate(d, "flashmla_sm100_sgl").reasons)
    # Hopper's sparse prefill needs width % 128 for both head counts.
    sm90 = _decide(PREFILL, {"h_q": h_q, "width": width}, "sm90", "cuda_sm90", **LIBS)
    assert (sm90.chosen.name == "flashmla_sm90_sgl") is (width % 128 == 0)


def test_sm120_is_not_an_sm100_platform() -> None:
    """SM120 does not fit cuda_sm100 and forcing it says why."""
    info = simulated_info("sm120", **LIBS)
    d = select_platform_spec(load_registry(), info, ov.Overrides())
    assert d.chosen.name == "cpu"
    assert any("SM120 is not SM100" in r for r in d.reasons["cuda_sm100"])
    with pytest.raises(PlatformNotFoundError, match="SM120 is not SM100"):
        dsv4hal.select_platform("cuda_sm100", info=info)


# ---------------------------------------------------------------------------------------------------------
# Argument marshalling into the fake sgl-flash-mla


def _decode_args(t: int = 3, h: int = 64, extra: bool = True, width: int = 128, extra_width: int = 512):  # noqa: ANN202
    g = torch.Generator().manual_seed(0)
    swa = V4PagedCache.empty(3, 256)
    q = torch.randn(t, h, 512, generator=g).to(torch.bfloat16)
    idx = torch.randint(0, swa.num_slots, (t, width), generator=g, dtype=torch.int32)
    lengths = torch.full((t,), width, dtype=torch.int32)
    sink = torch.zeros(h, dtype=torch.float32)
    kw = {}
    if extra:
        c4 = V4PagedCache.empty(10, 64)
        kw = dict(extra_cache=c4,
                  extra_indices=torch.randint(0, c4.num_slots, (t, extra_width), generator=g, dtype=torch.int32),
                  extra_lengths=torch.full((t,), 300, dtype=torch.int32))
    return (q, swa, idx, lengths, sink, 512 ** -0.5), kw


def _assert_v4_cache_view(f, cache: V4PagedCache) -> None:  # noqa: ANN001
    assert f.shape == (cache.num_pages, cache.page_size, 1, TOKEN_BYTES) and f.dtype == torch.uint8
    assert f.stride[1] == TOKEN_BYTES and f.stride[0] % 576 == 0 and f.stride[0] == page_bytes(cache.page_size)


@pytest.mark.parametrize("h", [64, 128])
def test_decode_marshalling_with_extra_cache(monkeypatch: pytest.MonkeyPatch, h: int) -> None:
    """SM100 decode passes FlashMLA the expected views with an extra cache."""
    rec = install_flash_mla(monkeypatch)
    args, kw = _decode_args(h=h)
    q, swa, idx, lengths, sink, scale = args
    out, lse = sm100.sparse_attention_decode(*args, **kw)
    call = rec.only("flash_mla_with_kvcache")
    fq, fk, block_table, seqlens = call.args
    assert fq.shape == (3, 1, h, 512) and fq.dtype == torch.bfloat16 and fq.stride[-1] == 1
    assert fq.stride[0] % fq.stride[1] == 0  # SM100 V4 decode asserts it
    _assert_v4_cache_view(fk, swa)
    assert call.tensors["k_cache"].data_ptr() == swa.data.data_ptr()  # a view of the pool, no copy
    assert block_table is None and seqlens is None
    k = call.kwargs
    assert k["head_dim_v"] == 512 and k["num_splits"] is None and k["causal"] is False
    assert k["is_fp8_kvcache"] is True and k["softmax_scale"] == scale
    assert isinstance(k["tile_scheduler_metadata"], FakeSchedMeta)
    assert k["indices"].shape == (3, 1, 128) and k["indices"].dtype == torch.int32 and k["indices"].stride[-1] == 1
    assert k["topk_length"].shape == (3,) and k["topk_length"].dtype == torch.int32 and k["topk_length"].contiguous
    assert k["attn_sink"].shape == (h,) and k["attn_sink"].dtype == torch.float32 and k["attn_sink"].contiguous
    _assert_v4_cache_view(k["extra_k_cache"], kw["extra_cache"])
    assert k["extra_indices_in_kvcache"].shape == (3, 1, 512) and k["extra_indices_in_kvcache"].dtype == torch.int32
    assert k["extra_topk_length"].shape == (3,) and k["extra_topk_length"].dtype == torch.int32
    # V4 lives in sgl-flash-mla's legacy library on SM100 too; batch invariance exists only off it.
    assert k["use_legacy"] is sm100.USE_LEGACY is True
    assert k["enable_batch_invariant"] is False and k["kv_format"] is None
    assert out.shape == (3, h, 512) and out.dtype == torch.bfloat16
    assert lse.shape == (3, h) and lse.dtype == torch.float32


def test_decode_marshalling_swa_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """SM100 SWA-only decode passes no extra cache and uses the legacy entry."""
    rec = install_flash_mla(monkeypatch)
    args, _ = _decode_args(extra=False)
    sm100.sparse_attention_decode(*args)
    k = rec.only("flash_mla_with_kvcache").kwargs
    assert k["extra_k_cache"] is None and k["extra_indices_in_kvcache"] is None and k["extra_topk_length"] is None
    assert k["use_legacy"] is True


def test_decode_q_strides_made_sm100_compatible(monkeypatch: pytest.MonkeyPatch) -> None:
    """SM100 decode copies q whose strides FlashMLA cannot take."""
    rec = install_flash_mla(monkeypatch)
    args, kw = _decode_args()
    q = args[0]
    padded = torch.zeros(3, 65, 512, dtype=torch.bfloat16)
    padded[:, 1:] = q
    odd = padded[:, 1:]  # row stride 65*512 is not a multiple of 64*512
    sm100.sparse_attention_decode(odd, *args[1:], **kw)
    fq = rec.calls[-1].args[0]
    assert fq.stride[0] % fq.stride[1] == 0 and torch.equal(rec.calls[-1].tensors["q"][:, 0], q)
    wide = torch.zeros(3, 128, 512, dtype=torch.bfloat16)[:, :64]  # head slice of a wider q: kept as is
    sm100.sparse_attention_decode(wide, *args[1:], **kw)
    assert rec.calls[-1].tensors["q"].data_ptr() == wide.data_ptr()


def test_decode_refuses_misaligned_cache_base(monkeypatch: pytest.MonkeyPatch) -> None:
    """SM100 decode refuses a cache whose base is not 16-byte aligned."""
    rec = install_flash_mla(monkeypatch)
    args, kw = _decode_args(extra=False)
    pb = page_bytes(256)
    raw = torch.zeros(3 * pb + 8, dtype=torch.uint8)
    shifted = raw[8:].view(3, pb)
    if shifted.data_ptr() % 16 == 0:  # the allocator's base was not 16-aligned + 8; shift again
        shifted = torch.zeros(3 * pb + 16, dtype=torch.uint8)[4:4 + 3 * pb].view(3, pb)
    bad = V4PagedCache(shifted, 256)
    with pytest.raises(InvalidArgumentError, match="16-byte aligned"):
        sm100.sparse_attention_decode(args[0], bad, *args[2:], **kw)
    assert rec.calls == []


def test_decode_shares_one_plan_per_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """SM100 decode plans once per decode step for layers of one ratio."""
    rec = install_flash_mla(monkeypatch)
    args, kw = _decode_args()
    p = dsv4hal.select_platform(info=simulated_info("sm100", **LIBS))
    with p.decode_step():
        for _ in range(3):  # three layers of one ratio: one FlashMLASchedMeta
            out, lse = p.ops.sparse_attention_decode(*args, **kw)
    metas = {id(c.kwargs["tile_scheduler_metadata"]) for c in rec.calls if c.name == "flash_mla_with_kvcache"}
    assert len(metas) == 1 and len([c for c in rec.calls if c.name == "get_mla_metadata"]) == 1
    assert out.shape == (3, 64, 512) and lse.shape == (3, 64)


def test_decode_without_legacy_library_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """SM100 decode without FlashMLA's legacy entry raises an error naming it."""
    install_flash_mla(monkeypatch, has_legacy=False)
    args, kw = _decode_args()
    with pytest.raises(RuntimeError, match="legacy"):
        sm100.sparse_attention_decode(*args, **kw)


@pytest.mark.parametrize(("h", "width"), [(64, 576), (128, 1408)])
def test_prefill_marshalling(monkeypatch: pytest.MonkeyPatch, h: int, width: int) -> None:
    """SM100 prefill passes FlashMLA the expected shapes and dtypes."""
    rec = install_flash_mla(monkeypatch)
    g = torch.Generator().manual_seed(1)
    t, s = 5, 700
    q = torch.randn(t, h, 512, generator=g).to(torch.bfloat16)
    kv = torch.randn(s, 512, generator=g).to(torch.bfloat16)
    idx = torch.randint(0, s, (t, width), generator=g, dtype=torch.int32)
    lengths = torch.full((t,), width - 10, dtype=torch.int32)
    sink = torch.zeros(h, dtype=torch.float32)
    out, lse = sm100.sparse_attention_prefill(q, kv, idx, lengths, sink, 0.04)
    call = rec.only("flash_mla_sparse_fwd")
    fq, fkv, fidx, scale = call.args
    assert fq.shape == (t, h, 512) and fq.dtype == torch.bfloat16 and fq.stride[-1] == 1
    assert fkv.shape == (s, 1, 512) and fkv.dtype == torch.bfloat16 and fkv.stride[-1] == 1
    assert fidx.shape == (t, 1, width) and fidx.dtype == torch.int32 and fidx.stride[-1] == 1
    assert scale == 0.04
    k = call.kwargs
    assert k["d_v"] == 512 and k["use_legacy"] is True and k["return_log2_lse"] is None
    assert k["attn_sink"].shape == (h,) and k["attn_sink"].dtype == torch.float32
    assert k["topk_length"].shape == (t,) and k["topk_length"].dtype == torch.int32
    assert out.shape == (t, h, 512) and lse.shape == (t, h) and lse.dtype == torch.float32
