"""Torch ops dispatched per steady-state FlashMLA decode call: dsv4hal's glue (and the bound op around it) against
the direct vendor call as `dsv4hal bench attention` makes it. A deterministic count, not a timing: on the GPU host
every aten op costs microseconds (dispatch, a new TensorImpl), so an op that creeps into the per-call path shows
here before it shows in `bench attention`'s host_us.

The fake FlashMLA returns outputs allocated before counting, so only the ops of the code around the vendor call are
counted: what the glue adds is then exactly the difference from the direct call.

What the glue may add, and why (ALLOWED below):
- one unsqueeze per per-token input FlashMLA takes as [T, s_q=1, ...]: q, swa_indices and (with a compressed cache)
  extra_indices. The benchmark's direct call builds these views once, outside the timed call, which only an engine
  whose buffers never change can do; with fresh tensors a direct call makes them too (DIRECT_PER_CALL below).
- one squeeze each for out [T, 1, h_q, 512] and lse [T, h_q, 1]: the contract returns [T, h_q, 512] and [T, h_q].
- outside a declared decode step, one clamp per lengths tensor (swa_lengths, extra_lengths): FlashMLA's scheduler
  asserts and its kernel reads past the index rows on lengths outside [0, width] (flashmla_glue.within_widths);
  inside a step the plan's kernel clamps them once for the step.
Nothing else: no copy, cast, allocation or host-built tensor; the caches' FlashMLA views are built once per cache.
The bound op (validation memoised on metadata, selection cached per case) adds no torch op at all."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from vendor_fakes import FakeSchedMeta, fake_module, install_modules, simulated_info

import dsv4hal
from dsv4hal.bench.attention import SCALE, _direct_flashmla
from dsv4hal.formats.v4_cache import V4PagedCache

OUTPUT_VIEWS = 2  # out.squeeze(1), lse.squeeze(2): FlashMLA's [T, 1, ...] outputs to the contract's shapes
VIEW_OPS = {"aten.unsqueeze.default", "aten.squeeze.dim"}
CLAMP = "aten.clamp.default"  # the lengths' clamp into the index widths
IMPLS = {("sm90", "flash_mla"): "flashmla_sm90_sgl", ("sm90", "vllm"): "flashmla_sm90_vllm",
         ("sm100", "flash_mla"): "flashmla_sm100_sgl"}


class _Ops(TorchDispatchMode):
    """Every aten op dispatched inside, by name."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def ops_of(fn: Any) -> list[str]:
    """The ops of one steady-state call (after two warm-up calls: the first validates, selects and builds views)."""
    fn()
    fn()
    with _Ops() as mode:
        fn()
    return mode.ops


def _install(monkeypatch: pytest.MonkeyPatch, library: str, outs: dict[tuple, tuple]) -> None:
    """A FlashMLA with the 1.0.0 decode signature, as sgl-flash-mla (`flash_mla`) or vLLM's bundled copy, whose
    outputs come from `outs` by q's shape: allocated before counting, so the vendor's own ops are not counted."""
    def get_mla_metadata(*args: Any, **kwargs: Any) -> tuple[FakeSchedMeta, None]:
        return FakeSchedMeta(), None

    def flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata,  # noqa: ANN001, ANN202
                               num_splits=None, softmax_scale=None, causal=False, is_fp8_kvcache=None,
                               indices=None, attn_sink=None, extra_k_cache=None, extra_indices_in_kvcache=None,
                               topk_length=None, extra_topk_length=None, **kwargs):
        assert q.dim() == 4 and indices.dim() == 3 and k_cache.dim() == 4
        assert (extra_indices_in_kvcache is None) == (extra_k_cache is None)
        assert extra_indices_in_kvcache is None or extra_indices_in_kvcache.dim() == 3
        return outs[tuple(q.shape)]

    attrs = dict(get_mla_metadata=get_mla_metadata, flash_mla_with_kvcache=flash_mla_with_kvcache,
                 FlashMLASchedMeta=FakeSchedMeta)
    # `flash_mla` always (the direct calls import it); the platform is told only of `library`
    mods = {"flash_mla": fake_module("flash_mla", __version__="1.0.0", __path__=[], has_legacy=lambda: True),
            "flash_mla.flash_mla_interface": fake_module("flash_mla.flash_mla_interface", **attrs)}
    if library == "vllm":
        mods.update({n: fake_module(n, __path__=[]) for n in ("vllm", "vllm.third_party", "vllm.third_party.flashmla")})
        mods["vllm.third_party.flashmla.flash_mla_interface"] = fake_module(
            "vllm.third_party.flashmla.flash_mla_interface", **attrs)
    install_modules(monkeypatch, mods)


def _args(t: int, h: int, ratio: int, outs: dict[tuple, tuple]) -> dict[str, Any]:
    """The benchmark's argument dict (dsv4hal.bench.attention._inputs), on the CPU."""
    g = torch.Generator().manual_seed(0)
    swa = V4PagedCache.empty(4, 256)
    i32 = dict(dtype=torch.int32)
    args: dict[str, Any] = dict(
        q=torch.randn(t, h, 512, generator=g).bfloat16(), swa_cache=swa, sink=torch.randn(h),
        swa_indices=torch.randint(0, swa.num_slots, (t, 128), generator=g, **i32),
        swa_lengths=torch.full((t,), 128, **i32), softmax_scale=SCALE)
    if ratio:
        x = V4PagedCache.empty(8, 64 if ratio == 4 else 2)
        args.update(extra_cache=x, extra_indices=torch.randint(0, x.num_slots, (t, 512), generator=g, **i32),
                    extra_lengths=torch.full((t,), 512, **i32))
    outs[(t, 1, h, 512)] = (torch.zeros(t, 1, h, 512, dtype=torch.bfloat16), torch.zeros(t, 1, h).transpose(1, 2))
    return args


def _direct_per_call(args: dict[str, Any], use_legacy: bool) -> Any:
    """The direct call with its [T, 1, ...] views made in the call, as an engine with fresh tensors makes them."""
    import flash_mla.flash_mla_interface as fm

    extra: dict[str, Any] = {"use_legacy": True} if use_legacy else {}

    def run():  # noqa: ANN202
        if args.get("extra_cache") is not None:
            extra.update(extra_k_cache=args["extra_cache"].flashmla_view(),
                         extra_indices_in_kvcache=args["extra_indices"].unsqueeze(1),
                         extra_topk_length=args["extra_lengths"])
        return fm.flash_mla_with_kvcache(args["q"].unsqueeze(1), args["swa_cache"].flashmla_view(), None, None, 512,
                                         fm.get_mla_metadata()[0], softmax_scale=SCALE, is_fp8_kvcache=True,
                                         indices=args["swa_indices"].unsqueeze(1), attn_sink=args["sink"],
                                         topk_length=args["swa_lengths"], **extra)
    return run


def _paths(arch: str, library: str, args: dict[str, Any]) -> dict[str, Any]:
    """The ways an engine reaches the kernel: the bound op (validated, or on a validate=False platform) and the
    selected kernel function called directly (the benchmark's 'hoisted dispatch')."""
    info = simulated_info(arch, **{library: "1.0.0"})
    bound = dsv4hal.select_platform(info=info).ops.sparse_attention_decode
    fast = dsv4hal.select_platform(info=info, validate=False).ops.sparse_attention_decode
    case = bound.case_of(**args)
    assert bound.decide(case).chosen.name == IMPLS[(arch, library)]
    kernel = fast.kernel(case)
    positional = tuple(args[k] for k in ("q", "swa_cache", "swa_indices", "swa_lengths", "sink", "softmax_scale"))
    extra = {k: args[k] for k in ("extra_cache", "extra_indices", "extra_lengths") if k in args}
    return {"kernel": lambda: kernel(**args), "bound": lambda: bound(**args),
            "bound, no validation": lambda: fast(**args), "bound, positional": lambda: bound(*positional, **extra)}


@pytest.mark.parametrize(("arch", "library"), sorted(IMPLS))
@pytest.mark.parametrize("ratio", [0, 4, 128])
@pytest.mark.parametrize(("t", "h"), [(1, 64), (5, 128)])
def test_decode_adds_only_the_layout_views(monkeypatch: pytest.MonkeyPatch, arch: str, library: str, ratio: int,
                                           t: int, h: int) -> None:
    """The FlashMLA decode glue adds only layout views over a direct library call."""
    outs: dict[tuple, tuple] = {}
    _install(monkeypatch, library, outs)
    args = _args(t, h, ratio, outs)
    direct = ops_of(_direct_flashmla(args))  # the benchmark's direct call (views built once, outside)
    per_call = ops_of(_direct_per_call(args, library == "flash_mla"))
    input_views = 3 if ratio else 2  # q, swa_indices and extra_indices as [T, 1, ...]
    assert direct == [] and len(per_call) == input_views  # the fake's outputs were allocated beforehand
    for path, fn in _paths(arch, library, args).items():
        clamps = [o for o in ops_of(fn) if o == CLAMP]
        glue = [o for o in ops_of(fn) if o != CLAMP]
        assert len(clamps) == (2 if ratio else 1), f"{path}: the lengths are clamped once each: {clamps}"
        assert set(glue) <= VIEW_OPS, f"{path}: an op that is not a view in the per-call path: {glue}"
        assert len(glue) <= len(direct) + input_views + OUTPUT_VIEWS, f"{path}: {glue}"
        assert len(glue) <= len(per_call) + OUTPUT_VIEWS, f"{path}: {glue}"


@pytest.mark.parametrize(("arch", "library"), sorted(IMPLS))
def test_the_bound_op_adds_no_op_to_the_kernel(monkeypatch: pytest.MonkeyPatch, arch: str, library: str) -> None:
    """Validation (memoised on metadata) and dispatch read host attributes only, and so does planning inside a
    declared decode step."""
    outs: dict[tuple, tuple] = {}
    _install(monkeypatch, library, outs)
    args = _args(3, 64, 4, outs)
    paths = _paths(arch, library, args)
    kernel = ops_of(paths.pop("kernel"))
    for path, fn in paths.items():
        assert ops_of(fn) == kernel, path
    platform = dsv4hal.select_platform(info=simulated_info(arch, **{library: "1.0.0"}))
    with platform.decode_step():  # the step's later calls reuse its clamped lengths
        assert ops_of(lambda: platform.ops.sparse_attention_decode(**args)) == [o for o in kernel if o != CLAMP]


@pytest.mark.parametrize(("arch", "library"), sorted(IMPLS))
@pytest.mark.parametrize("ratio", [0, 4])
def test_inside_a_step_later_calls_clamp_nothing(monkeypatch: pytest.MonkeyPatch, arch: str, library: str,
                                                 ratio: int) -> None:
    """Inside a declared decode step the calls after the first reuse its plan and its clamped lengths: they add
    only the layout views, as `bench attention`'s in-step row calls them (bench.attention._in_decode_step); outside
    the step the same call still clamps each lengths tensor."""
    from dsv4hal.bench.attention import _in_decode_step

    outs: dict[tuple, tuple] = {}
    _install(monkeypatch, library, outs)
    args = _args(3, 64, ratio, outs)
    op = dsv4hal.select_platform(info=simulated_info(arch, **{library: "1.0.0"})).ops.sparse_attention_decode
    step = _in_decode_step()
    later = ops_of(lambda: step.run(op, **args))
    assert CLAMP not in later and set(later) <= VIEW_OPS, later
    assert ops_of(lambda: op(**args)).count(CLAMP) == (2 if ratio else 1)
    assert ops_of(_direct_flashmla(args, shared_plan=True)) == []  # the benchmark's direct twin of the in-step row
