"""FlashMLA's sparse kernels for the V4 cache format, marshalled for dsv4hal's attention contracts: the
argument mapping shared by the cuda_sm90 and cuda_sm100 plugins (for the V4 584-byte format both reach the
same `flash_mla_interface` entry points with the same arguments; each plugin adds its own arch checks).

Accepts sgl-flash-mla (`flash_mla`, its legacy library: use_legacy=True, which holds the V4-format kernels for
SM90 and SM100) or vLLM's bundled copy (`vllm.third_party.flashmla.flash_mla_interface`, which has no
use_legacy argument). sgl-flash-mla's decode is called through its torch op when the op's schema is the one read
(decode_op: the Python entry's per-call work skipped, the same kernel). Scheduler metadata is planned per call
unless the engine declares a decode step (dsv4hal.step), inside which one plan per (compress ratio, shapes) is
shared, as vLLM and SGLang share one per layer type, with the lengths clamped for it. Inside a step on SM90 that
plan is made by dsv4hal.kernels.flashmla_sched (the same bytes as the op's own, from one parallel program instead of
one warp's walk) and handed to the torch op. Outside a step the op plans per call, as a direct call does: there a
call is host-bound, and the Triton launch of the parallel plan costs more host time than it saves GPU time (on the
H100 at one row, flash-c4, the kernel called without dispatch: 93.7 against 55.7 us of host time, for 15.4 against
33.5 us on the GPU, h100/bench-attention.json, "parallel plan a call"). A call captured into a CUDA graph outside a
step is planned by the parallel program each replay (capturing): there the host time is paid once, at capture.

Indices follow dsv4hal's one rule: FlashMLA skips -1 and reads any other negative as a slot (-2 reads slot
0), so other negatives are invalid and checked mode refuses them in the contract, before this binding runs;
FlashMLA's decode does no bounds checks on indices, so unchecked mode must not be handed invalid ones. Lengths are
different: FlashMLA's scheduler asserts (ending the CUDA context) and its kernels read past the index rows on a
length outside [0, width], so the binding always hands it lengths clamped into that range (within_widths)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from types import ModuleType
from typing import Any, Literal

import torch

from dsv4hal.formats.v4_cache import HEAD_DIM, V4PagedCache
from dsv4hal.step import step_plans

Flavour = Literal["sgl", "vllm"]
HEAD_DIM_V = HEAD_DIM  # 512: values are the whole latent (nope and rope)


@functools.cache
def interface(flavour: Flavour) -> tuple[ModuleType, dict[str, Any]]:
    """FlashMLA's interface module and the extra keyword arguments its V4 entry points need."""
    if flavour == "sgl":
        import flash_mla
        import flash_mla.flash_mla_interface as iface

        if hasattr(flash_mla, "has_legacy") and not flash_mla.has_legacy():
            raise RuntimeError("sgl-flash-mla was loaded without its legacy library (_C_legacy), which holds the "
                               "V4-format kernels for SM90 and SM100")
        return iface, {"use_legacy": True}
    from vllm.third_party.flashmla import flash_mla_interface as iface  # type: ignore[import-not-found]

    return iface, {}


# The op under FlashMLA's Python decode entry in sgl-flash-mla 1.0.0 (flash_mla_legacy::sparse_decode_fwd), with
# the argument names of the schema this module was written against. Calling it directly skips what
# flash_mla_with_kvcache does in Python per call (a FlashMLASchedMeta dataclass, a dozen assertions, the op-namespace
# lookup, keyword-argument binding); the kernel, its arguments and its plans are the same.
DECODE_OP_ARGS = ("q", "kv", "indices", "topk_length", "attn_sink", "tile_scheduler_metadata", "num_splits",
                  "extra_kv", "extra_indices", "extra_topk_length", "d_v", "sm_scale", "kv_format")


@functools.cache
def decode_op(flavour: Flavour) -> Callable[..., Any] | None:
    """The torch op under the flavour's decode entry, or None where there is none with exactly the expected schema
    (vLLM's bundled copy, another version): then the Python entry is called, the same kernel either way."""
    if flavour != "sgl":
        return None
    iface, _ = interface(flavour)
    get_ops = getattr(iface, "get_ops", None)  # sgl-flash-mla's op-namespace chooser (legacy or current kernels)
    overload = getattr(getattr(get_ops(True), "sparse_decode_fwd", None), "default", None) if get_ops else None
    schema = getattr(overload, "_schema", None)
    if schema is None or tuple(a.name for a in schema.arguments) != DECODE_OP_ARGS:
        return None
    return overload


# The argument types the C++ glue (csrc/flashmla_decode.cpp) pushes, as the schema prints them; where the op's
# differ the Python glue calls the op (torch checks its argument types there).
NATIVE_ARG_TYPES = ("Tensor", "Tensor", "Tensor", "Optional[Tensor]", "Optional[Tensor]", "Optional[Tensor]",
                    "Optional[Tensor]", "Optional[Tensor]", "Optional[Tensor]", "Optional[Tensor]", "int", "float",
                    "Optional[str]")
NATIVE_RETURN_TYPES = ("Tensor", "Tensor", "Optional[Tensor]", "Optional[Tensor]")


@functools.cache
def native_decode(flavour: Flavour) -> Callable[..., Any] | None:
    """decode_op called from C++ (dsv4hal.kernels.native_glue: the views made there, ~3 us of host time less a
    call; the same op and arguments), or None: no decode_op, other argument types, or the glue not in use
    (native_glue.status() says why)."""
    op = decode_op(flavour)
    if op is None:
        return None
    schema = op._schema
    if (tuple(str(a.type) for a in schema.arguments) != NATIVE_ARG_TYPES
            or tuple(str(r.type) for r in schema.returns) != NATIVE_RETURN_TYPES):
        return None
    from dsv4hal.kernels import native_glue

    return native_glue.flashmla_decode_call(op)


def parallel_planner() -> Callable[..., Any] | None:
    """dsv4hal.kernels.flashmla_sched.plan, or None where Triton is not installed (FlashMLA needs no Triton: then the
    op makes its own plan, the same bytes). Looked up per call (cheap once imported): tests replace it."""
    try:
        from dsv4hal.kernels import flashmla_sched
    except ImportError:
        return None
    return flashmla_sched.plan


def _plan_key(entry: str, q: torch.Tensor, swa_cache: V4PagedCache, swa_indices: torch.Tensor,
              extra_cache: V4PagedCache | None, extra_indices: torch.Tensor | None) -> tuple:
    """What a shared plan depends on (FlashMLA's scheduler config: batch, heads, page sizes, top-k widths); the
    entry too, since the Python entry keeps its plan in a FlashMLASchedMeta and the op in a tensor pair."""
    return (entry, q.shape, swa_indices.shape, swa_cache.page_size,
            None if extra_cache is None else (extra_cache.page_size, extra_indices.shape))  # type: ignore[union-attr]


def within_widths(lengths: torch.Tensor | None, width: int) -> torch.Tensor | None:
    """FlashMLA's precondition on topk_length / extra_topk_length: 0 <= length <= the index rows' width. Its
    scheduler asserts on anything else (a device assertion ends the CUDA context) and its decode reads past the
    index rows, so the binding never hands it lengths it has not clamped on the device (no sync, one small kernel;
    inside a step the plan's kernel writes them)."""
    return None if lengths is None else lengths.clamp(0, width)


def capturing(q: torch.Tensor) -> bool:
    """Whether q's stream is being captured into a CUDA graph. Then the call's host time is paid once, at capture,
    and each replay costs the plan's GPU time: the parallel program's, where it plans the line, is the faster."""
    return q.is_cuda and torch.cuda.is_current_stream_capturing()


def _new_plan(q: torch.Tensor, swa_indices: torch.Tensor, swa_lengths: torch.Tensor,
              extra_indices: torch.Tensor | None, extra_lengths: torch.Tensor | None
              ) -> tuple[Any, Any, torch.Tensor, torch.Tensor | None]:
    """(metadata, splits, lengths, extra lengths) for the torch op: the plan of one parallel program (SM90) with the
    lengths it clamped, else no plan (the op plans; inside a step the caller keeps what it returns) and the lengths
    clamped here. The plan and the lengths the decode reads are always the same ones."""
    width, extra_width = swa_indices.shape[-1], 0 if extra_indices is None else extra_indices.shape[-1]
    planner = parallel_planner()
    made = planner(q, swa_lengths, width, extra_lengths, extra_width) if planner is not None else None
    if made is not None:
        md, splits, lengths, xlengths = made
        return md, splits, lengths, xlengths if xlengths is not None else within_widths(extra_lengths, extra_width)
    return None, None, within_widths(swa_lengths, width), within_widths(extra_lengths, extra_width)


def _decoder(flavour: Flavour, use_native: bool = True,
             plan_each_call: bool = False) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """sparse_attention_decode for one flavour (the plugins bind it as their target; use_native=False: never the C++
    glue, for benchmarks that time both glues in one run; plan_each_call: outside a declared step too the plan is
    the parallel program's, made each call, with the lengths it clamps, for benchmarks).

    Host cost per call, in torch ops: FlashMLA takes q and the indices as [T, s_q=1, ...] and returns out
    [T, 1, h_q, 512] and lse [T, h_q, 1], so the call costs five view ops (three unsqueezes in, two squeezes out)
    and nothing else: the caches' FlashMLA views are built once (V4PagedCache.flashmla_view), nothing is copied or
    cast, and outside a declared decode step the plan is made per call, as a direct call makes it. Where the
    flavour's torch op is known (decode_op), it is called directly, skipping the Python entry's per-call work, and
    where the C++ glue is in use (native_decode) the five views are made there, one Python-to-C++ call in all.
    (Remembering the input views per tensor would save ~0.25 us a tensor when an engine passes the same buffers
    again, but cost ~1.3 us for each fresh tensor, such as q or a layer's top-k indices: not done.)"""

    def decode(q: torch.Tensor, swa_cache: V4PagedCache, swa_indices: torch.Tensor, swa_lengths: torch.Tensor,
               sink: torch.Tensor, softmax_scale: float, extra_cache: V4PagedCache | None = None,
               extra_indices: torch.Tensor | None = None,
               extra_lengths: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        # both looked up per call: tests swap the vendor module between calls
        native = native_decode(flavour) if use_native else None
        op = decode_op(flavour) if native is None else native
        if op is not None:  # the torch op, inline (a frame less a call): outside a step it plans per call
            plans = step_plans()
            md = splits = key = kept = None
            if plans is not None:  # a step shares its lengths (the engine declares them fixed) and one plan a shape
                key = _plan_key("op", q, swa_cache, swa_indices, extra_cache, extra_indices)
                kept = plans.get(key)
            if kept is not None:
                md, splits, swa_lengths, extra_lengths = kept
            elif plans is not None or plan_each_call or capturing(q):  # lengths clamped with the plan
                md, splits, swa_lengths, extra_lengths = _new_plan(q, swa_indices, swa_lengths, extra_indices,
                                                                   extra_lengths)
            elif native is None:  # the op plans; the C++ glue clamps the lengths of a call without a plan itself
                swa_lengths = within_widths(swa_lengths, swa_indices.shape[-1])
                if extra_indices is not None:
                    extra_lengths = within_widths(extra_lengths, extra_indices.shape[-1])
            if native is not None:  # the [T, 1, ...] views made in C++ (native_glue), the lengths clamped there
                out, lse, md, splits = native(
                    q, swa_cache.flashmla_view(), swa_indices, swa_lengths, sink, md, splits,
                    None if extra_cache is None else extra_cache.flashmla_view(), extra_indices, extra_lengths,
                    HEAD_DIM_V, softmax_scale)
            else:
                out, lse, md, splits = op(
                    q.unsqueeze(1), swa_cache.flashmla_view(), swa_indices.unsqueeze(1), swa_lengths, sink, md,
                    splits, None if extra_cache is None else extra_cache.flashmla_view(),
                    None if extra_indices is None else extra_indices.unsqueeze(1), extra_lengths, HEAD_DIM_V,
                    softmax_scale, None)
                out, lse = out.squeeze(1), lse.squeeze(2)
            if plans is not None and kept is None:  # the step's first call of this shape: its plan for the others
                plans[key] = (md, splits, swa_lengths, extra_lengths)
            return out, lse
        iface, extra_kw = interface(flavour)
        plans = step_plans()
        key = kept = None
        if plans is not None:  # the key is built only inside a step, where it names what layers of one shape share
            key = _plan_key("entry", q, swa_cache, swa_indices, extra_cache, extra_indices)
            kept = plans.get(key)
        if kept is None:  # a plan (filled by the call) and the lengths clamped, once a step or once a call
            kept = (iface.get_mla_metadata()[0], within_widths(swa_lengths, swa_indices.shape[-1]),
                    extra_lengths if extra_indices is None else within_widths(extra_lengths, extra_indices.shape[-1]))
            if plans is not None:
                plans[key] = kept
        meta, swa_lengths, extra_lengths = kept
        if extra_cache is None:
            out, lse = iface.flash_mla_with_kvcache(
                q.unsqueeze(1), swa_cache.flashmla_view(), None, None, head_dim_v=HEAD_DIM_V,
                tile_scheduler_metadata=meta, num_splits=None, softmax_scale=softmax_scale, causal=False,
                is_fp8_kvcache=True, indices=swa_indices.unsqueeze(1), attn_sink=sink, topk_length=swa_lengths,
                **extra_kw)
        else:
            out, lse = iface.flash_mla_with_kvcache(
                q.unsqueeze(1), swa_cache.flashmla_view(), None, None, head_dim_v=HEAD_DIM_V,
                tile_scheduler_metadata=meta, num_splits=None, softmax_scale=softmax_scale, causal=False,
                is_fp8_kvcache=True, indices=swa_indices.unsqueeze(1), attn_sink=sink, topk_length=swa_lengths,
                extra_k_cache=extra_cache.flashmla_view(),
                extra_indices_in_kvcache=extra_indices.unsqueeze(1),  # type: ignore[union-attr]
                extra_topk_length=extra_lengths, **extra_kw)
        return out.squeeze(1), lse.squeeze(2)

    decode.__name__ = decode.__qualname__ = f"decode_{flavour}"
    return decode


decode_sgl = _decoder("sgl")
decode_vllm = _decoder("vllm")
_DECODERS: dict[str, Callable[..., tuple[torch.Tensor, torch.Tensor]]] = {"sgl": decode_sgl, "vllm": decode_vllm}


def decode(flavour: Flavour, q: torch.Tensor, swa_cache: V4PagedCache, swa_indices: torch.Tensor,
           swa_lengths: torch.Tensor, sink: torch.Tensor, softmax_scale: float,
           extra_cache: V4PagedCache | None = None, extra_indices: torch.Tensor | None = None,
           extra_lengths: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """sparse_attention_decode through flash_mla_with_kvcache: (out bf16 [T, h_q, 512], lse fp32 [T, h_q]).
    Kernel targets bind decode_sgl / decode_vllm directly (one frame less per call)."""
    return _DECODERS[flavour](q, swa_cache, swa_indices, swa_lengths, sink, softmax_scale, extra_cache,
                              extra_indices, extra_lengths)


def prefill(flavour: Flavour, q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor, lengths: torch.Tensor,
            sink: torch.Tensor, softmax_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """sparse_attention_prefill through flash_mla_sparse_fwd: (out bf16 [T, h_q, 512], lse fp32 [T, h_q])."""
    iface, extra_kw = interface(flavour)
    res = iface.flash_mla_sparse_fwd(q, kv.unsqueeze(1), indices.unsqueeze(1), softmax_scale, d_v=HEAD_DIM_V,
                                     attn_sink=sink, topk_length=within_widths(lengths, indices.shape[-1]),
                                     **extra_kw)
    return res[0], res[2]
