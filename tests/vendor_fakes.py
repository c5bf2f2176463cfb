"""Simulated vendor libraries for tests that run without the hardware.

Each fake installs module objects in sys.modules (through pytest's monkeypatch, so they vanish after the
test) with the vendor's documented Python signatures. Every call is recorded with the facts a kernel would
see (shape, dtype, strides, device, contiguity of each tensor; plain values as is), and the fake returns
correctly shaped, zero-filled outputs. Tests check the recorded calls against the vendor contracts; they never
check the outputs' values, which mean nothing.

- install_flash_mla: sgl-flash-mla 1.0.0 (`flash_mla`, `flash_mla.flash_mla_interface`).
- install_sgl_kernel: the HIP op `torch.ops.sgl_kernel.deepseek_v4_topk_transform_512`, defined through
  torch.library from its schema string, so torch itself checks argument types against the schema.
- install_aiter: `aiter.ops.triton.attention.pa_decode_sparse.pa_decode_sparse`.
- simulated_info: PlatformInfo for hardware that is not here (dsv4hal.hardware.simulated).
- fake_module / install_modules / define_fake_op: the pieces, for tests that fake other libraries.
"""

from __future__ import annotations

import functools
import importlib
import importlib.machinery
import sys
import types
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

from dsv4hal.hardware import PlatformInfo, simulated

# Binding-side caches that would hold on to an imported (fake) vendor module. Each fake swaps in fresh
# caches for the duration of the test, so nothing leaks into the next one.
_BINDING_CACHES = (("dsv4hal.kernels.flashmla_glue", "interface"), ("dsv4hal.kernels.flashmla_glue", "decode_op"),
                   ("dsv4hal.kernels.flashmla_glue", "native_decode"),
                   ("dsv4hal_rocm.sgl_ops", "_op"),
                   ("dsv4hal_rocm.aiter_ops", "_entry"))


def isolate_binding_caches(monkeypatch: pytest.MonkeyPatch) -> None:
    for module, attr in _BINDING_CACHES:
        mod = importlib.import_module(module)
        cached = getattr(mod, attr)
        monkeypatch.setattr(mod, attr, functools.cache(cached.__wrapped__))


def simulated_info(arch: str, **libraries: str) -> PlatformInfo:
    """A simulated machine with torch and the given libraries (name=version) installed."""
    return simulated(arch, libraries={"torch": "2.13", **libraries})


@dataclass(frozen=True)
class TensorFacts:
    shape: tuple[int, ...]
    dtype: torch.dtype
    stride: tuple[int, ...]
    device: str
    contiguous: bool
    storage_offset: int

    @classmethod
    def of(cls, t: torch.Tensor) -> TensorFacts:
        return cls(tuple(t.shape), t.dtype, tuple(t.stride()), t.device.type, t.is_contiguous(), t.storage_offset())


def _facts(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return TensorFacts.of(value)
    if isinstance(value, (list, tuple)):
        return type(value)(_facts(v) for v in value)
    return value


@dataclass(frozen=True)
class Call:
    name: str
    args: tuple[Any, ...]  # TensorFacts for tensors, the value otherwise
    kwargs: Mapping[str, Any]
    tensors: Mapping[str, torch.Tensor] = field(repr=False)  # the tensors themselves, by parameter name


@dataclass
class Recorder:
    calls: list[Call] = field(default_factory=list)

    def record(self, name: str, bound: Mapping[str, Any], positional: tuple[str, ...]) -> None:
        args = tuple(_facts(bound[p]) for p in positional)
        kwargs = {k: _facts(v) for k, v in bound.items() if k not in positional}
        tensors = {k: v for k, v in bound.items() if isinstance(v, torch.Tensor)}
        self.calls.append(Call(name, args, kwargs, tensors))

    def only(self, name: str) -> Call:
        found = [c for c in self.calls if c.name == name]
        assert len(found) == 1, f"expected one call of {name}, got {[c.name for c in self.calls]}"
        return found[0]


def fake_module(name: str, **attrs: Any) -> types.ModuleType:
    """A module object named `name` (with a spec, as find_spec expects) holding attrs."""
    mod = types.ModuleType(name)
    mod.__spec__ = importlib.machinery.ModuleSpec(name, loader=None)
    for k, v in attrs.items():
        setattr(mod, k, v)
    return mod


def install_modules(monkeypatch: pytest.MonkeyPatch, modules: Mapping[str, types.ModuleType]) -> None:
    """Put the modules in sys.modules for this test (submodules also become attributes of their parents)."""
    isolate_binding_caches(monkeypatch)
    for name, mod in modules.items():
        monkeypatch.setitem(sys.modules, name, mod)
        parent, _, child = name.rpartition(".")
        if parent in modules:
            setattr(modules[parent], child, mod)


def install_deep_gemm(monkeypatch: pytest.MonkeyPatch, version: str = "2.5.0", **entries: Any) -> types.ModuleType:
    """A fake `deep_gemm` of `version` holding `entries` (its functions), installed for this test."""
    module = fake_module("deep_gemm", __version__=version, **entries)
    install_modules(monkeypatch, {"deep_gemm": module})
    return module


# ---------------------------------------------------------------------------------------------------------
# sgl-flash-mla 1.0.0


@dataclass
class FakeSchedMeta:
    """Stands in for flash_mla.flash_mla_interface.FlashMLASchedMeta (lazily planned on first use)."""

    have_initialized: bool = False


def install_flash_mla(monkeypatch: pytest.MonkeyPatch, *, has_legacy: bool = True) -> Recorder:
    """Fake `flash_mla` with the 1.0.0 signatures of get_mla_metadata, flash_mla_with_kvcache and
    flash_mla_sparse_fwd. The decode fake returns out [b, s_q, h_q, d_v] and lse as the [b, h_q, s_q]
    transposed view FlashMLA returns; the prefill fake returns a list when use_legacy (as 1.0.0 does)."""
    rec = Recorder()

    def get_mla_metadata(*args: Any, **kwargs: Any) -> tuple[FakeSchedMeta, None]:
        rec.record("get_mla_metadata", {}, ())
        return FakeSchedMeta(), None

    def flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata,  # noqa: ANN001, ANN202
                               num_splits=None, softmax_scale=None, causal=False, is_fp8_kvcache=None,
                               indices=None, attn_sink=None, extra_k_cache=None, extra_indices_in_kvcache=None,
                               topk_length=None, extra_topk_length=None, enable_batch_invariant=False,
                               use_legacy=False, kv_format=None, descale_q=None, descale_k=None):
        bound = dict(locals())
        rec.record("flash_mla_with_kvcache", bound, ("q", "k_cache", "block_table", "cache_seqlens"))
        b, s_q, h_q, _ = q.shape
        out = torch.zeros(b, s_q, h_q, head_dim_v, dtype=torch.bfloat16, device=q.device)
        lse = torch.zeros(b, s_q, h_q, dtype=torch.float32, device=q.device).transpose(1, 2)
        return out, lse

    def flash_mla_sparse_fwd(q, kv, indices, sm_scale, d_v=512, attn_sink=None, topk_length=None,  # noqa: ANN001, ANN202
                             use_legacy=False, return_log2_lse=None):
        bound = dict(locals())
        rec.record("flash_mla_sparse_fwd", bound, ("q", "kv", "indices", "sm_scale"))
        s_q, h_q, _ = q.shape
        out = torch.zeros(s_q, h_q, d_v, dtype=torch.bfloat16, device=q.device)
        stats = [torch.zeros(s_q, h_q, dtype=torch.float32, device=q.device) for _ in range(2)]
        res = [out, *stats]
        return res if use_legacy else tuple(res)

    iface = fake_module("flash_mla.flash_mla_interface", get_mla_metadata=get_mla_metadata,
                    flash_mla_with_kvcache=flash_mla_with_kvcache, flash_mla_sparse_fwd=flash_mla_sparse_fwd,
                    FlashMLASchedMeta=FakeSchedMeta)
    pkg = fake_module("flash_mla", __version__="1.0.0", __path__=[], has_legacy=lambda: has_legacy,
                  get_mla_metadata=get_mla_metadata, flash_mla_with_kvcache=flash_mla_with_kvcache,
                  flash_mla_sparse_fwd=flash_mla_sparse_fwd)
    install_modules(monkeypatch, {"flash_mla": pkg, "flash_mla.flash_mla_interface": iface})
    return rec


# ---------------------------------------------------------------------------------------------------------
# sgl-kernel (HIP build): torch.ops.sgl_kernel.deepseek_v4_topk_transform_512

TOPK_SCHEMA = ("deepseek_v4_topk_transform_512(Tensor scores, Tensor seq_lens, Tensor page_table, "
               "Tensor! page_indices, int page_size, Tensor!? raw_indices) -> ()")
TOPK_PARAMS = ("scores", "seq_lens", "page_table", "page_indices", "page_size", "raw_indices")
_topk_state: dict[str, Any] = {"recorder": None}
_LIBRARIES: dict[tuple[str, str], torch.library.Library] = {}


def define_fake_op(namespace: str, schema: str, impl: Any) -> None:
    """Define torch.ops.<namespace>.<op> from its schema string with a CPU implementation, once per process
    (torch then checks every call's argument types against the schema)."""
    name = schema.split("(", 1)[0]
    if (namespace, name) not in _LIBRARIES:
        lib = torch.library.Library(namespace, "FRAGMENT")
        lib.define(schema)
        lib.impl(name, impl, "CPU")
        _LIBRARIES[(namespace, name)] = lib  # kept alive: a collected Library removes its registrations


def _topk_impl(scores, seq_lens, page_table, page_indices, page_size, raw_indices) -> None:  # noqa: ANN001
    rec = _topk_state["recorder"]
    if rec is None:
        raise RuntimeError("fake sgl_kernel is not installed in this test")
    rec.record("deepseek_v4_topk_transform_512", dict(zip(TOPK_PARAMS, (scores, seq_lens, page_table,
                                                                          page_indices, page_size, raw_indices))),
               TOPK_PARAMS)


def install_sgl_kernel(monkeypatch: pytest.MonkeyPatch) -> Recorder:
    """Fake `sgl_kernel` package plus the op, defined once per process in the `sgl_kernel` torch-op namespace
    (CPU dispatch) from the schema string; calls are routed to this test's recorder."""
    define_fake_op("sgl_kernel", TOPK_SCHEMA, _topk_impl)
    rec = Recorder()
    monkeypatch.setitem(_topk_state, "recorder", rec)
    install_modules(monkeypatch, {"sgl_kernel": fake_module("sgl_kernel", __version__="0.4.10", __path__=[])})
    return rec


# ---------------------------------------------------------------------------------------------------------
# aiter: pa_decode_sparse


def install_aiter(monkeypatch: pytest.MonkeyPatch) -> Recorder:
    """Fake aiter with aiter.ops.triton.attention.pa_decode_sparse.pa_decode_sparse. With skip_reduce and
    kv_splits > 1 it returns the partials (acc [N,S,H,D], m [N,S,H], l [N,S,H], fp32); else out [N,H,D]."""
    rec = Recorder()

    def pa_decode_sparse(q, unified_kv, kv_indices, kv_indptr, attn_sink, softmax_scale, kv_scales=None,  # noqa: ANN001, ANN202
                         block_h=None, kv_splits=None, has_invalid=True, skip_reduce=False, USE_EXP2=None, *,  # noqa: N803
                         extra_cache=None, extra_indices=None, extra_indptr=None):
        bound = dict(locals())
        rec.record("pa_decode_sparse", bound, ("q", "unified_kv", "kv_indices", "kv_indptr", "attn_sink",
                                               "softmax_scale"))
        n, h, d = q.shape
        if skip_reduce and kv_splits is not None and kv_splits > 1:
            z = dict(dtype=torch.float32, device=q.device)
            return (torch.zeros(n, kv_splits, h, d, **z), torch.zeros(n, kv_splits, h, **z),
                    torch.zeros(n, kv_splits, h, **z))
        return torch.zeros(n, h, d, dtype=torch.bfloat16, device=q.device)

    names = ("aiter", "aiter.ops", "aiter.ops.triton", "aiter.ops.triton.attention")
    mods = {n: fake_module(n, __path__=[]) for n in names}
    mods["aiter"].__version__ = "0.1.13.dev0+ge4048607"
    mods["aiter.ops.triton.attention.pa_decode_sparse"] = fake_module(
        "aiter.ops.triton.attention.pa_decode_sparse", pa_decode_sparse=pa_decode_sparse)
    install_modules(monkeypatch, mods)
    return rec
