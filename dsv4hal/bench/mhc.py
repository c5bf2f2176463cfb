"""mHC benchmark: mhc_pre, mhc_post, mhc_post_pre and mhc_head at V4-Flash (d 4096) for T = 1, 8, 64, 4096, every
eligible kernel and the PyTorch reference, in CUDA graphs, against the bandwidth floor (the bytes of every input
and output once, at the copy bandwidth measured in the same run). Goals (GOALS): mhc_pre and mhc_post each
<= 4x their floor at T = 64; mhc_post_pre <= 20 us at T <= 8.

Then mhc_pre's pre-norm GEMM alone (rows op "mhc_pre_gemm", d 4096 and 7168, T = 1 .. 4096): the Triton split-K
partials launch that mhc_pre makes, DeepGEMM's tf32_hc_prenorm_gemm at a few split counts (where importable and
the GPU is SM90/SM100) and the PyTorch reference's fp32 GEMM, against the floor of reading x and fn once; each
result summed over its splits is compared with the Triton one and with an fp64 product, so that DeepGEMM is bound
only where it wins."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from dsv4hal.bench.common import bound_op, candidates
from dsv4hal.bench.timing import eager_us, graph_us

HIDDEN = 4096
TOKENS = (1, 8, 64, 4096)
OPS = ("mhc_pre", "mhc_post", "mhc_post_pre", "mhc_head")
GOALS = {("mhc_pre", 64): ("floor_ratio", 4.0), ("mhc_post", 64): ("floor_ratio", 4.0),
         ("mhc_post_pre", 1): ("us", 20.0), ("mhc_post_pre", 8): ("us", 20.0)}


def _args(op: str, t: int, d: int, gen: torch.Generator) -> tuple[Any, ...]:
    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, device="cuda")

    x = randn(t, 4, d).bfloat16()
    rows, scales = (4, 1) if op == "mhc_head" else (24, 3)
    gates = (randn(rows, 4 * d) / math.sqrt(4 * d), 0.5 * randn(rows), 0.5 + 0.1 * randn(scales).abs())
    post, comb = 2 * torch.sigmoid(randn(t, 4)), torch.softmax(randn(t, 4, 4), dim=-1)
    f = randn(t, d).bfloat16()
    return {"mhc_pre": (x, *gates), "mhc_head": (x, *gates), "mhc_post": (f, x, post, comb),
            "mhc_post_pre": (f, x, post, comb, *gates)}[op]


def _nbytes(v: Any) -> int:
    if isinstance(v, torch.Tensor):
        return v.numel() * v.element_size()
    if isinstance(v, (tuple, list)):
        return sum(_nbytes(u) for u in v)
    return 0


def run(platform: Any, ceilings: dict[str, float], quick: bool = False) -> list[dict[str, Any]]:
    gen = torch.Generator(device="cuda").manual_seed(1)
    copy_bw = ceilings["copy_bytes_per_s"]
    rows = []
    for op in OPS:
        names = candidates(platform, op, with_reference=True)
        for t in (1, 64) if quick else TOKENS:
            args = _args(op, t, HIDDEN, gen)
            row: dict[str, Any] = {"op": op, "T": t, "hidden": HIDDEN, "us": {}, "floor_ratio": {}}
            for impl in names:
                fn = bound_op(platform, op, impl)
                row["us"][impl] = graph_us(lambda fn=fn, a=args: fn(*a))
            out = bound_op(platform, op, names[0])(*args)
            row["bytes"] = _nbytes(args) + _nbytes(out)
            row["floor_us"] = row["bytes"] / copy_bw * 1e6
            row["floor_ratio"] = {i: us / row["floor_us"] for i, us in row["us"].items()}
            best = min((i for i in row["us"] if not i.startswith("torch_reference")), key=row["us"].get,
                       default=None)
            if best is not None and "torch_reference" in row["us"]:
                row["speedup_vs_reference"] = row["us"]["torch_reference"] / row["us"][best]
            goal = GOALS.get((op, t))
            if goal and best is not None:
                kind, limit = goal
                value = row["floor_ratio"][best] if kind == "floor_ratio" else row["us"][best]
                row["goal"] = {"kernel": best, kind: value, "limit": limit, "met": value <= limit}
            rows.append(row)
            line = ", ".join(f"{i} {u:.1f}us ({row['floor_ratio'][i]:.1f}x floor)" for i, u in row["us"].items())
            if "goal" in row:
                kind, limit = goal
                line += f"; goal {kind} <= {limit}: {'met' if row['goal']['met'] else 'MISSED'}"
            print(f"{op} T={t}: floor {row['floor_us']:.2f}us; {line}", flush=True)
    _unfused(rows)
    return rows + gemm_rows(copy_bw, quick)


def _unfused(rows: list[dict[str, Any]]) -> None:
    """mhc_post_pre rows get the best mhc_post + best mhc_pre time at the same T (the boundary unfused)."""
    def best(op: str, t: int) -> float | None:
        row = next((r for r in rows if r["op"] == op and r["T"] == t), None)
        times = [u for i, u in (row or {}).get("us", {}).items() if not i.startswith("torch_reference")]
        return min(times) if times else None

    for r in rows:
        if r["op"] == "mhc_post_pre":
            parts = (best("mhc_post", r["T"]), best("mhc_pre", r["T"]))
            if None not in parts:
                r["unfused_post_plus_pre_us"] = parts[0] + parts[1]
                print(f"mhc_post_pre T={r['T']}: unfused mhc_post + mhc_pre {r['unfused_post_plus_pre_us']:.1f}us",
                      flush=True)


# ---------------------------------------------------------------- mhc_pre's pre-norm GEMM alone

GEMM_OP = "mhc_pre_gemm"
GEMM_HIDDEN = (4096, 7168)  # V4-Flash, V4-Pro
GEMM_TOKENS = (1, 8, 64, 512, 4096)
GEMM_ROWS = 24  # 4 pre + 4 post + 16 comb
TRITON = "triton_partials"  # a "triton" prefix, as the mhc plot looks for in every row
DEEP_GEMM = "deep_gemm"
# DeepGEMM 2.5.0 (csrc/jit_kernels/impls/sm{90,100}_tf32_hc_prenorm_gemm.hpp): one CTA per (64-token block,
# split), the split owning a share of K's 64-column blocks; K % 64 == 0, rows a multiple of 8 and at most
# 32 (SM90) or 128 (SM100); the kernel takes all shared memory, so one CTA per SM.
DG_BLOCK = 64
DG_MAX_ROWS = {9: 32, 10: 128}
DG_TEST_SPLITS: tuple[int | None, ...] = (None, 16)  # what DeepGEMM's tests/test_hyperconnection.py runs
DG_MORE_SPLITS = (32, 64)

Timer = Callable[[str, Callable[[], object]], tuple[float, str]]  # (name, fn) -> (us, "graph" or "eager")


def gemm_shapes(quick: bool = False) -> list[tuple[int, int]]:
    """(d, T) pairs of the GEMM comparison."""
    return [(d, t) for d in GEMM_HIDDEN for t in ((1, 64) if quick else GEMM_TOKENS)]


def gemm_bytes(t: int, d: int, rows: int = GEMM_ROWS) -> int:
    """x bf16 [T, 4d] and fn fp32 [rows, 4d], each read once (the [T, rows + 1] result is noise beside them)."""
    return t * 4 * d * 2 + rows * 4 * d * 4


def deep_gemm_splits(t: int, k: int, num_sms: int, quick: bool = False) -> list[int | None]:
    """Split counts to time: None (no split, d [T, rows]), the test's 16 and, unless quick, 32, 64 and one wave
    (num_sms CTAs over the token blocks); at most one split per 64-column K block (more only adds empty CTAs)."""
    wave = max(1, num_sms // -(-t // DG_BLOCK))
    out: list[int | None] = []
    for s in DG_TEST_SPLITS if quick else (*DG_TEST_SPLITS, *DG_MORE_SPLITS, wave):
        if (s is None or 1 <= s <= k // DG_BLOCK) and s not in out:
            out.append(s)
    return out


def deep_gemm_name(splits: int | None) -> str:
    return DEEP_GEMM if splits is None else f"{DEEP_GEMM} splits={splits}"


def deep_gemm_entry() -> tuple[Callable[..., Any] | None, str | None]:
    """(deep_gemm.tf32_hc_prenorm_gemm, None), or (None, why not)."""
    try:
        import deep_gemm
    except Exception as exc:  # its import also sets up the JIT (CUDA home): any failure means no DeepGEMM
        return None, f"deep_gemm not importable: {type(exc).__name__}: {exc}"
    entry = getattr(deep_gemm, "tf32_hc_prenorm_gemm", None)
    if entry is None:  # deep_gemm's __init__ silently leaves its kernels out with a CUDA runtime before 12.1
        return None, f"deep_gemm {getattr(deep_gemm, '__version__', '?')} has no tf32_hc_prenorm_gemm"
    return entry, None


def deep_gemm_shape_skip(arch_major: int, rows: int, k: int) -> str | None:
    """Why DeepGEMM's host checks would refuse this GPU or shape, or None."""
    if arch_major not in DG_MAX_ROWS:
        return f"tf32_hc_prenorm_gemm runs on SM90 and SM100 only, not compute capability {arch_major}.x"
    if k % DG_BLOCK:
        return f"K = {k} is not a multiple of {DG_BLOCK}"
    if rows % 8 or rows > DG_MAX_ROWS[arch_major]:
        return f"{rows} rows: needs a multiple of 8 <= {DG_MAX_ROWS[arch_major]} on SM{arch_major}0"
    return None


def deep_gemm_outputs(t: int, rows: int, splits: int | None, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(d fp32 [splits, T, rows] or [T, rows], sqr_sum fp32 [splits, T] or [T]) as tf32_hc_prenorm_gemm takes."""
    lead = () if splits is None else (splits,)
    return (torch.empty(*lead, t, rows, dtype=torch.float32, device=device),
            torch.empty(*lead, t, dtype=torch.float32, device=device))


def combine(mix: torch.Tensor, sq: torch.Tensor, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Split-K partials summed over the splits: (x @ fn^T [T, rows], sum x^2 [T])."""
    if sq.dim() == 2:
        mix, sq = mix.sum(0), sq.sum(0)
    return mix[:, :rows], sq


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    """max over tokens of max |got - want| / max |want| within the token's row: relative to the row's scale,
    so that entries near 0 do not blow it up."""
    if want.numel() == 0:
        return 0.0
    g, w = got.double().reshape(want.shape[0], -1), want.double().reshape(want.shape[0], -1)
    scale = w.abs().amax(dim=1).clamp_min(torch.finfo(torch.float64).tiny)
    return float(((g - w).abs().amax(dim=1) / scale).max())


def _triton_partials() -> tuple[Callable[..., Any] | None, str | None]:
    try:
        from dsv4hal.kernels.triton.mhc import prenorm_partials
    except Exception as exc:
        return None, f"Triton mHC kernels not importable: {type(exc).__name__}: {exc}"
    return prenorm_partials, None


def _deep_gemm_call(entry: Callable[..., Any], xf: torch.Tensor, fn: torch.Tensor, splits: int | None
                    ) -> Callable[[], tuple[torch.Tensor, torch.Tensor]]:
    """A call into preallocated outputs (as an engine would make it), returning them."""
    d, sq = deep_gemm_outputs(xf.shape[0], fn.shape[0], splits, str(xf.device))

    def call() -> tuple[torch.Tensor, torch.Tensor]:
        entry(xf, fn, d, sq, num_splits=splits)
        return d, sq

    return call


def _cuda_timer(name: str, fn: Callable[[], object]) -> tuple[float, str]:
    """CUDA-graph time; what cannot be captured is timed eagerly, and the row says so."""
    try:
        return graph_us(fn), "graph"
    except Exception:
        torch.cuda.synchronize()
        return eager_us(fn), "eager"


def gemm_row(t: int, d: int, *, copy_bw: float, timer: Timer, device: str, arch_major: int, num_sms: int,
             quick: bool = False, seed: int = 1) -> dict[str, Any]:
    """One (d, T) row: times, floor, agreement of every path with the Triton partials and with fp64, and
    why a path was skipped."""
    k = 4 * d
    gen = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(t, 4, d, generator=gen, device=device).bfloat16()
    fn = torch.randn(GEMM_ROWS, k, generator=gen, device=device) / math.sqrt(k)
    xf = x.view(t, k)
    row: dict[str, Any] = {"op": GEMM_OP, "T": t, "hidden": d, "K": k, "rows": GEMM_ROWS, "us": {}, "splits": {},
                           "rel_err": {}, "skipped": {}, "bytes": gemm_bytes(t, d)}
    row["floor_us"] = row["bytes"] / copy_bw * 1e6
    results: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    calls: dict[str, Callable[[], object]] = {}

    partials, why = _triton_partials()
    if partials is None:
        row["skipped"][TRITON] = why
    else:
        calls[TRITON] = lambda: partials(x, fn)
    entry, why = deep_gemm_entry()
    why = why or deep_gemm_shape_skip(arch_major, GEMM_ROWS, k)
    if why is not None:
        row["skipped"][DEEP_GEMM] = why
    else:
        for s in deep_gemm_splits(t, k, num_sms, quick):
            calls[deep_gemm_name(s)] = _deep_gemm_call(entry, xf, fn, s)

    def reference() -> tuple[torch.Tensor, torch.Tensor]:  # dsv4hal.reference.mhc.mixes's GEMM, unscaled
        xr = xf.float()
        return xr @ fn.t(), xr.pow(2).sum(1)

    calls["torch_reference"] = reference

    for name, call in calls.items():
        try:
            mix, sq = call()  # the first call also builds (JIT) DeepGEMM's kernel, outside any graph
        except Exception as exc:  # a refused shape or a failed build: record it, keep the other paths
            row["skipped"][name] = f"{type(exc).__name__}: {exc}"
            continue
        if name != "torch_reference":
            row["splits"][name] = mix.shape[0] if sq.dim() == 2 else 1
        results[name] = combine(mix, sq, GEMM_ROWS)
        try:
            us, how = timer(name, call)
        except Exception as exc:
            row["skipped"][name] = f"timing failed: {type(exc).__name__}: {exc}"
            continue
        row["us"][name] = us
        if how != "graph":
            row.setdefault("timing", {})[name] = how

    x64 = xf.double()
    exact = (x64 @ fn.double().t(), x64.pow(2).sum(1))
    del x64
    base = results.get(TRITON)
    for name, (mix, sq) in results.items():
        err = {"mix_vs_fp64": rel_err(mix, exact[0]), "sumsq_vs_fp64": rel_err(sq, exact[1])}
        if base is not None and name != TRITON:
            err |= {"mix_vs_triton": rel_err(mix, base[0]), "sumsq_vs_triton": rel_err(sq, base[1])}
        row["rel_err"][name] = err
    dg_err = [max(e["mix_vs_triton"], e["sumsq_vs_triton"]) for n, e in row["rel_err"].items()
              if n.startswith(DEEP_GEMM) and "mix_vs_triton" in e]
    if dg_err:
        row["max_rel_err_deep_gemm_vs_triton"] = max(dg_err)
    _verdict(row)
    return row


def _verdict(row: dict[str, Any]) -> None:
    """floor ratios, the fastest kernel and whether DeepGEMM beats the Triton partials."""
    us = row["us"]
    row["floor_ratio"] = {i: u / row["floor_us"] for i, u in us.items()}
    kernels = {i: u for i, u in us.items() if i != "torch_reference"}
    if kernels:
        row["best"] = min(kernels, key=kernels.get)
    dg = {i: u for i, u in kernels.items() if i.startswith(DEEP_GEMM)}
    if dg and TRITON in kernels:
        best = min(dg, key=dg.get)
        row["deep_gemm_best"] = best
        row["deep_gemm_speedup_vs_triton"] = kernels[TRITON] / dg[best]
        row["deep_gemm_wins"] = dg[best] < kernels[TRITON]


def gemm_line(row: dict[str, Any]) -> str:
    """The printed summary of one row."""
    parts = []
    for i, u in row["us"].items():
        s = f"{i} {u:.1f}us ({row['floor_ratio'][i]:.1f}x)"
        if i == TRITON:
            s += f" [{row['splits'][i]} splits]"
        err = row["rel_err"].get(i, {})
        if "mix_vs_triton" in err:
            s += f" err vs triton {max(err['mix_vs_triton'], err['sumsq_vs_triton']):.1e}"
        if "mix_vs_fp64" in err:
            s += f" vs fp64 {err['mix_vs_fp64']:.1e}"
        parts.append(s)
    line = f"{GEMM_OP} d={row['hidden']} T={row['T']}: floor {row['floor_us']:.2f}us; " + ", ".join(parts)
    if "deep_gemm_wins" in row:
        line += (f"; {row['deep_gemm_best']} is {row['deep_gemm_speedup_vs_triton']:.2f}x the Triton speed"
                 f" ({'WINS' if row['deep_gemm_wins'] else 'loses'})")
    if row["skipped"]:
        line += "; skipped: " + "; ".join(f"{i} ({why})" for i, why in row["skipped"].items())
    return line


def gemm_rows(copy_bw: float, quick: bool = False, timer: Timer = _cuda_timer, device: str = "cuda"
              ) -> list[dict[str, Any]]:
    """The GEMM comparison over gemm_shapes(quick), printed row by row and then where DeepGEMM wins."""
    if device == "cuda":
        arch_major = torch.cuda.get_device_capability()[0]
        num_sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    else:
        arch_major, num_sms = 0, 4
    rows = []
    for d, t in gemm_shapes(quick):
        try:
            row = gemm_row(t, d, copy_bw=copy_bw, timer=timer, device=device, arch_major=arch_major,
                           num_sms=num_sms, quick=quick)
        except Exception as exc:  # e.g. out of memory: keep the other shapes and the mhc op rows
            print(f"{GEMM_OP} d={d} T={t} failed: {type(exc).__name__}: {exc}", flush=True)
            rows.append({"op": GEMM_OP, "T": t, "hidden": d, "error": f"{type(exc).__name__}: {exc}"})
            continue
        print(gemm_line(row), flush=True)
        rows.append(row)
    wins = [f"d={r['hidden']} T={r['T']} ({r['deep_gemm_best']})" for r in rows if r.get("deep_gemm_wins")]
    if any("deep_gemm_wins" in r for r in rows):
        print(f"{GEMM_OP}: DeepGEMM beats the Triton partials at " + (", ".join(wins) if wins else "no shape"),
              flush=True)
    return rows
