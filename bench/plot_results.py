"""Plots of H200 results that `dsv4hal bench --plot` does not draw: the soak's memory reads, the host
enqueue cost of a bound attention call against the direct vendor call, a top-k tune's calls pass by pass, and the
FP8 MoE quantizers' launch sweep, mHC's apply launch sweep, and the MXFP4 decode MoE's settings beside the
libraries.

    python3 bench/plot_results.py soak bench/results/h200/soak-3.6min.json bench/results/h200/soak-3.6min.png
    python3 bench/plot_results.py host bench/results/h200/bench-attention-host.json \
        bench/results/h200/bench-attention-host.png
    python3 bench/plot_results.py topk bench/results/h200/tune-triton-topk-perkey.json \
        bench/results/h200/tune-triton-topk-perkey.png
    python3 bench/plot_results.py quant bench/results/h200/sweep-moe-quant.json \
        bench/results/h200/sweep-moe-quant.png
    python3 bench/plot_results.py apply bench/results/h200/sweep-mhc-apply-apart.json \
        bench/results/h200/sweep-mhc-apply-apart.png
    python3 bench/plot_results.py mxmoe bench/results/h200/sweep-mx-moe-decode-m8.json \
        bench/results/h200/sweep-mx-moe-decode-m8.png
    python3 bench/plot_results.py mxmoe bench/results/h200/sweep-mx-moe-decode-v2.json \
        bench/results/h200/sweep-mx-moe-decode-v2.png
    python3 bench/plot_results.py mxmoe bench/results/h200/sweep-mx-moe-decode-v2b.json \
        bench/results/h200/sweep-mx-moe-decode-v2b.png
    python3 bench/plot_results.py mxmoe bench/results/h200/ab-mx-moe-decode.json bench/results/h200/ab-mx-moe-decode.png
    (the same for sweep-mx-moe-decode-v4/v5 and ab-mx-moe-decode-runs8/-runs16/-fused-all)
    python3 bench/plot_results.py pdl bench/results/h200/ab-pdl.json bench/results/h200/ab-pdl.png
    python3 bench/plot_results.py parts bench/results/h200/host-parts.json bench/results/h200/host-parts.png
    python3 bench/plot_results.py pertoken bench/results/h200/sweep-moe-per-token.json \
        bench/results/h200/sweep-moe-per-token.png   # (and -few)
    python3 bench/plot_results.py alignprefill bench/results/h200/sweep-moe-align-prefill.json \
        bench/results/h200/sweep-moe-align-prefill.png
    python3 bench/plot_results.py swiglureal bench/results/h200/sweep-moe-swiglu-real.json \
        bench/results/h200/sweep-moe-swiglu-real.png
    python3 bench/plot_results.py fp8call bench/results/h200/sweep-moe-fp8-call.json \
        bench/results/h200/sweep-moe-fp8-call.png
    python3 bench/plot_results.py fastswiglu bench/results/h200/sweep-moe-fast-swiglu.json \
        bench/results/h200/sweep-moe-fast-swiglu.png
    python3 bench/plot_results.py scatter bench/results/h200/sweep-moe-scatter-grid.json \
        bench/results/h200/sweep-moe-scatter-grid.png
    python3 bench/plot_results.py fp8ab bench/results/h200/ab-moe-fp8-block-n.json \
        bench/results/h200/ab-moe-fp8-block-n.png   # (and ab-moe-fp8-gather)
    python3 bench/plot_results.py conformance A.json,B.json,... out.png   # reports of one catalog split over runs
    python3 bench/plot_results.py demos A.json,B.json,... out.png         # demo runs side by side, op by op
    python3 bench/plot_results.py hostratio A.json,B.json,... out.png     # bench attention rounds: issue 13's ratios
    python3 bench/plot_results.py alignab A.json,B.json out.png           # sweep_moe_align.py --old: before, after"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def _pct(d: dict[str, float] | None) -> str:
    return "n/a" if d is None else ", ".join(f"{k} {100 * v:+.2f}%" for k, v in d.items())


def soak(data: dict[str, Any], path: str) -> None:
    from dsv4hal.soak import memory_growth

    mem = data["memory"]
    growth, spread = memory_growth(mem)
    fig, ax = plt.subplots(figsize=(9, 4.5))
    for kind in ("allocated", "reserved", "device_used"):
        ax.plot([m["t_s"] for m in mem], [m[kind] / 2**20 for m in mem], marker=".", label=kind)
    ax.set_xlabel("seconds since start (reads after each round; the first is after warm-up)")
    ax.set_ylabel("MiB")
    ax.set_ylim(bottom=0)
    ax.set_title(f"soak {data['platform']}: {data['op_calls']:,} op calls, {data['captures']} captures, "
                 f"{data['crashes']} crashes, {data['results_outside_tolerance']} outside tolerance\n"
                 f"growth (late vs early ceiling): {_pct(growth)}; spread (max-min)/min: {_pct(spread)}", fontsize=9)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def host(data: dict[str, Any], path: str) -> None:
    rows = [r for r in data["attention"] if r["host_us"]]
    names = list(rows[0]["host_us"])
    fig, ax = plt.subplots(figsize=(12, 5))
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        ax.bar([j + i * width for j in range(len(rows))], [r["host_us"][name] for r in rows], width, label=name)
    ax.set_xticks([j + 0.4 for j in range(len(rows))], [f"{r['config']}\nT={r['T']}" for r in rows], fontsize=7)
    ax.set_ylabel("host us per call (enqueue, no sync)")
    ax.set_title("host cost: bound op vs direct FlashMLA call (goals: <= 1.2x validated, <= 1.1x without)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def hostratio(runs: list[tuple[str, dict[str, Any]]], path: str) -> None:
    """Issue 13's ratios against the direct FlashMLA call (views hoisted), one panel a round of `dsv4hal bench
    attention`: the bound call validated and not, the glue alone with C++ and with Python views; the goals as lines."""
    sys.path.insert(0, str(Path(__file__).parent))
    from host_ratio_summary import GOALS, _columns

    fig, axes = plt.subplots(1, len(runs), figsize=(4 * len(runs), 4.5), squeeze=False, sharey=True)
    for ax, (name, data) in zip(axes[0], runs, strict=True):
        rows = [r for r in data["attention"] if r.get("host_ratio_vs_direct")]
        cols = [_columns(r["host_ratio_vs_direct"]) for r in rows]
        names = list(cols[0])
        width = 0.8 / len(names)
        for i, n in enumerate(names):
            ax.bar([j + i * width for j in range(len(rows))], [c[n] for c in cols], width, label=n)
        for label, goal in GOALS.items():
            ax.axhline(goal, ls="--", lw=0.8, color="k")
            ax.text(len(rows) - 0.5, goal, f"goal {label}", fontsize=6, va="bottom", ha="right")
        ax.set_xticks([j + 0.4 for j in range(len(rows))], [r["config"].split(" ")[0] for r in rows], rotation=30,
                      ha="right", fontsize=7)
        ax.set_ylim(0.8, 1.3)
        ax.set_title(name, fontsize=8)
    axes[0][0].set_ylabel("host time / direct FlashMLA call (T = 1)")
    axes[0][0].legend(fontsize=6, loc="lower left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def topk(data: dict[str, Any], path: str) -> None:
    """One panel a shape of bench/tune_triton.py --ops topk: each config's passes stacked (sample, filter, select)
    where the kernel has passes (the sampled top-k), else one bar a config (the row kernel's tilings and warps)."""
    rows = data["topk"]
    fig, axes = plt.subplots(1, len(rows), figsize=(3.2 * len(rows), 5), squeeze=False)
    for ax, r in zip(axes[0], rows, strict=True):
        if r.get("us_passes"):
            names = list(r["us_passes"])
            bottom = [0.0] * len(names)
            for i, label in enumerate(("sample", "filter", "select")):
                part = [r["us_passes"][n][i] - (r["us_passes"][n][i - 1] if i else 0.0) for n in names]
                ax.bar(range(len(names)), part, bottom=bottom, label=label)
                bottom = [b + v for b, v in zip(bottom, part, strict=True)]
        else:
            names = [n for n in r["us"] if n != "torch.topk"]
            ax.bar(range(len(names)), [r["us"][n] for n in names], color="tab:purple", label="one launch")
        ax.axhline(r["us"]["torch.topk"], color="k", ls="--", lw=0.8, label="torch.topk")
        ax.set_xticks(range(len(names)), names, rotation=90, fontsize=5)
        ax.set_title(f"{r.get('kernel', 'sampled')}\n{r['B']} x {r['N']}, k {r['k']}", fontsize=7)
        ax.set_ylabel("us (CUDA graph)")
    axes[0][0].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def quant(data: dict[str, Any], path: str) -> None:
    """bench/sweep_moe_quant.py: every setting's time a pass, the default's bar marked."""
    passes = sorted({(r["T"], r["pass"]) for r in data["rows"] if "us" in r})
    fig, axes = plt.subplots(1, len(passes), figsize=(7 * len(passes), 4.5), squeeze=False)
    for ax, (t, name) in zip(axes[0], passes, strict=True):
        rows = [r for r in data["rows"] if r["T"] == t and r["pass"] == name and "us" in r]
        ax.bar(range(len(rows)), [r["us"] for r in rows], color=["C3" if r["default"] else "C0" for r in rows])
        ax.set_xticks(range(len(rows)), [f"{r['tile'][0]}x{r['tile'][1]} w{r['warps']} s{r['stages']}" for r in rows],
                      rotation=90, fontsize=6)
        ax.set_title(f"{name} pass, T = {t} (red: the default when measured)", fontsize=9)
        ax.set_ylabel("us (CUDA graph)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def apply(data: dict[str, Any], path: str) -> None:
    """bench/sweep_mhc_apply.py: the apply launch a setting (20 Sinkhorn iterations) a token count, post and the
    Sinkhorn in d block 0 or in a program of their own (comb_apart), the default when measured outlined."""
    rows = [r for r in data["rows"] if r.get("iters") == 20]
    tokens = sorted({r["tokens"] for r in rows})
    fig, axes = plt.subplots(1, len(tokens), figsize=(6 * len(tokens), 4.5), squeeze=False)
    for ax, t in zip(axes[0], tokens, strict=True):
        sel = [r for r in rows if r["tokens"] == t]
        colors = ["C1" if r.get("comb_apart") else "C0" for r in sel]
        ax.bar(range(len(sel)), [r["apply_us"] for r in sel], color=colors,
               edgecolor=["k" if r["current"] else "none" for r in sel])
        ax.set_xticks(range(len(sel)), [f"w{r['num_warps']} d{r['block_d']}" for r in sel], rotation=90, fontsize=6)
        ax.set_title(f"T = {t} (orange: comb apart; outlined: the default when measured)", fontsize=8)
        ax.set_ylabel("apply launch, us (CUDA graph)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def mxmoe(data: dict[str, Any], path: str) -> None:
    """bench/sweep_mx_moe_decode.py: each setting's share of copy bandwidth a token count, the libraries (Marlin,
    triton_kernels) and the fused MoE's row kernels apart in colour, issue 16's decode goals as dashes."""
    rows = data["rows"]
    fig, axes = plt.subplots(1, len(rows), figsize=(3.2 * len(rows), 5), squeeze=False, sharey=True)
    for ax, r in zip(axes[0], rows, strict=True):
        names = sorted(r["x_copy_bw"], key=r["x_copy_bw"].get, reverse=True)
        earlier = set(data.get("old_layouts", ())) | {"old"}  # bench/ab_mx_moe_decode.py: earlier module files
        colors = ["C3" if n.startswith(("marlin", "triton_kernels")) else "C7" if n.startswith("rows") else
                  "C2" if n in earlier else "C0" for n in names]
        ax.bar(range(len(names)), [r["x_copy_bw"][n] for n in names], color=colors)
        ax.set_xticks(range(len(names)), [n.replace("_mxfp4_sm90", "") for n in names], rotation=90, fontsize=6)
        ax.axhline(0.5 if r["T"] == 1 else 0.75, color="k", ls="--", lw=0.8)
        ax.set_title(f"T = {r['T']}", fontsize=9)
    axes[0][0].set_ylabel("share of copy bandwidth")
    fig.suptitle(f"{data.get('command', '')}\nred the libraries, grey the row kernels, green an earlier module file, "
                 "blue this tree's swapped kernels; dashes: issue 16's goal", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def pdl(data: dict[str, Any], path: str) -> None:
    """bench/ab_pdl.py: each call's time under PDL modes 1 and 2 as a ratio to the plain launch, a panel a T."""
    rows = data["rows"]
    fig, axes = plt.subplots(1, len(rows), figsize=(4.2 * len(rows), 4.8), squeeze=False, sharey=True)
    for ax, r in zip(axes[0], rows, strict=True):
        names = list(r["ratio_to_plain"])
        for i, mode in enumerate(("1", "2")):
            ax.bar([j + 0.4 * i for j in range(len(names))], [r["ratio_to_plain"][n][mode] for n in names], 0.4,
                   label=f"mode {mode}")
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xticks([j + 0.2 for j in range(len(names))], names, rotation=60, ha="right", fontsize=7)
        ax.set_title(f"T = {r['T']}", fontsize=9)
    axes[0][0].set_ylabel("time / plain launch (CUDA graphs)")
    axes[0][0].legend(fontsize=7)
    fig.suptitle(data.get("command", ""), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def parts(data: dict[str, Any], path: str) -> None:
    """bench/host_parts.py: the host time of each part of a bound call."""
    us = {**data["us"], **data.get("moe_experts", {}).get("us", {})}
    fig, ax = plt.subplots(figsize=(9, 4.5))
    ax.barh(range(len(us)), list(us.values()))
    ax.set_yticks(range(len(us)), list(us), fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("host us per call")
    ax.set_title(f"{data['command']}\n{data['platform']} ({data['kernel']} swapped for a no-op), Python "
                 f"{data['python']}", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[len(xs) // 2]


def _median_spread(us: list[list[float]]) -> tuple[list[float], list[list[float]]]:
    """Each list's median and its min-max as matplotlib error bars ([below], [above])."""
    med = [_median(u) for u in us]
    return med, [[m - min(u) for m, u in zip(med, us)], [max(u) - m for m, u in zip(med, us)]]


def pertoken(data: dict[str, Any], path: str) -> None:
    """bench/sweep_moe_quant.py --per-token: each part's median over its rounds a token count (the spread as error
    bars), the gather pass and the call apart."""
    rows = data["per_token"]
    groups = [g for g in ("gather", "call") if any(r["part"].startswith(g) for r in rows)]
    fig, axes = plt.subplots(1, len(groups), figsize=(7 * len(groups), 4.5), squeeze=False)
    for ax, g in zip(axes[0], groups, strict=True):
        parts_ = sorted({r["part"] for r in rows if r["part"].startswith(g)})
        tokens = sorted({r["T"] for r in rows})
        width = 0.8 / len(parts_)
        for i, part in enumerate(parts_):
            med, err = _median_spread([[r["us"] for r in rows if r["T"] == t and r["part"] == part] for t in tokens])
            ax.bar([j + i * width for j in range(len(tokens))], med, width, yerr=err, label=part)
        ax.set_xticks([j + 0.4 for j in range(len(tokens))], [f"T={t}" for t in tokens])
        ax.set_ylabel("us (CUDA graph; median, min-max of rounds)")
        ax.set_title(f"FP8 MoE {g}: one launch against per token + copy (same bytes)", fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def alignprefill(data: dict[str, Any], path: str) -> None:
    """bench/sweep_moe_align.py --prefill: the two launches' time over their program count, a line a token count."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for row in data["rows"]:
        progs = [int(m) for m in row["us"]]
        ax.plot(progs, list(row["us"].values()), marker="o", label=f"T={row['tokens']} ({row['routes']} routes)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("programs (MAX_PROGRAMS)")
    ax.set_ylabel("us (CUDA graph)")
    ax.set_title(f"{data['command']}\nE={data['experts']}, blocks of {data['block']}", fontsize=8)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def alignab(runs: list[tuple[str, dict[str, Any]]], path: str) -> None:
    """bench/sweep_moe_align.py --old: the previous file's alignment and this tree's at their defaults, timed in turns
    (median and min-max of the rounds), a panel a JSON (prefill: a bar pair a token count; decode: a route count)."""
    fig, axes = plt.subplots(1, len(runs), figsize=(6 * len(runs), 4.5), squeeze=False)
    for ax, (name, data) in zip(axes[0], runs, strict=True):
        rows = [r for r in data["rows"] if "previous_us" in r]
        labels = [f"T={r['tokens']}" if "tokens" in r else f"{r['routes']} routes" for r in rows]
        for i, (key, label) in enumerate((("previous_us", "previous"), ("now_us", "this tree"))):
            med, err = _median_spread([r[key] for r in rows])
            ax.bar([j + i * 0.4 for j in range(len(rows))], med, 0.4, yerr=err, capsize=3, label=label)
        ax.set_xticks([j + 0.2 for j in range(len(rows))], labels, fontsize=7)
        ax.set_ylabel("us (CUDA graph)")
        same = all(r["previous_same"] for r in rows)
        ax.set_title(f"{name}: E={data['experts']}, blocks of {data['block']} (outputs "
                     f"{'identical' if same else 'DIFFER'})", fontsize=8)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def swiglureal(data: dict[str, Any], path: str) -> None:
    """bench/sweep_moe_quant.py --real-swiglu: the SwiGLU pass a setting on GEMM1's output and on randn; the call
    with DeepGEMM's PDL off and on, a bar a round."""
    rows = data["real_swiglu"]
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    sw = [r for r in rows if r["part"].startswith("swiglu")]
    labels = sorted({(tuple(r["tile"]), r["warps"]) for r in sw})
    for i, src in enumerate(("real", "randn")):
        us = [next(r["us"] for r in sw if src in r["part"] and (tuple(r["tile"]), r["warps"]) == lab)
              for lab in labels]
        axes[0].bar([j + i * 0.4 for j in range(len(labels))], us, 0.4, label=f"{src} input")
    axes[0].set_xticks([j + 0.2 for j in range(len(labels))], [f"{a}x{b} w{w}" for (a, b), w in labels],
                       rotation=60, fontsize=7)
    axes[0].set_ylabel("us (CUDA graph)")
    axes[0].set_title("SwiGLU + quantize pass, T = 4096 (default 4x4 w4)", fontsize=9)
    axes[0].legend(fontsize=7)
    calls = [r for r in rows if r["part"].startswith("call")]
    axes[1].bar(range(len(calls)), [r["us"] for r in calls],
                color=["C1" if r["part"].endswith("on") else "C0" for r in calls])
    axes[1].set_xticks(range(len(calls)), [f"{r['part'].split('PDL ')[1]} r{r['round']}" for r in calls], fontsize=7)
    axes[1].set_ylabel("us (CUDA graph)")
    axes[1].set_title("the whole FP8 psum call, DeepGEMM PDL off (blue) / on (orange)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def fp8call(data: dict[str, Any], path: str) -> None:
    """bench/sweep_moe_quant.py --call-only: the call and each of its launches alone."""
    rows = [r for r in data["call"] if "us" in r]
    fig, ax = plt.subplots(figsize=(9, 4.5))
    ax.barh(range(len(rows)), [r["us"] for r in rows])
    ax.set_yticks(range(len(rows)), [f"T={r['T']} {r['part']}" for r in rows], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("us (CUDA graph)")
    ax.set_title("FP8 MoE through DeepGEMM's psum layout, V4-Flash", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def fastswiglu(data: dict[str, Any], path: str) -> None:
    """bench/sweep_moe_quant.py --fast-swiglu: each part's median over its rounds (min-max as error bars), the passes
    and the whole call apart; the codes' comparison in the title."""
    rows = [r for r in data["fast_swiglu"] if "us" in r]
    diff = next(r for r in data["fast_swiglu"] if "codes_differing" in r)
    fig, axes = plt.subplots(1, 2, figsize=(14, 4.8))
    for ax, calls in zip(axes, (False, True), strict=True):
        names = list(dict.fromkeys(r["part"] for r in rows if r["part"].startswith("call") == calls))
        med, err = _median_spread([[r["us"] for r in rows if r["part"] == n] for n in names])
        ax.barh(range(len(names)), med, xerr=err)
        ax.set_yticks(range(len(names)), names, fontsize=7)
        ax.invert_yaxis()
        ax.set_xlabel("us (CUDA graph; median, min-max of rounds)")
    axes[0].set_title(f"T = {rows[0]['T']}: fast SwiGLU codes differing {diff['codes_differing']} of {diff['codes']}",
                      fontsize=9)
    axes[1].set_title("the whole FP8 psum call (spread between calls wider than the passes' gain)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def scatter(data: dict[str, Any], path: str) -> None:
    """bench/sweep_moe_quant.py --scatter-grid: the scatter's time a (BLOCK_T, BLOCK_G) tile and warps, a panel a T."""
    rows = data["scatter"]
    tokens = sorted({r["T"] for r in rows})
    fig, axes = plt.subplots(1, len(tokens), figsize=(6 * len(tokens), 4.2), squeeze=False)
    for ax, t in zip(axes[0], tokens, strict=True):
        sel = [r for r in rows if r["T"] == t]
        ax.bar(range(len(sel)), [r["us"] for r in sel], color=["C1" if r["default"] else "C0" for r in sel])
        ax.set_xticks(range(len(sel)), [f"{a}x{b} w{r['warps']}" for r in sel for a, b in [r["tile"]]],
                      rotation=60, fontsize=7)
        ax.set_ylabel("us (CUDA graph)")
        ax.set_title(f"gather pass, scatter from tokens, T = {t} (orange: the sweep's default then)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def fp8ab(data: dict[str, Any], path: str) -> None:
    """bench/ab_moe_fp8_prefill.py: a panel a section present. gather / call: before and after in turns (median,
    min-max of rounds); knobs: the call and its GEMMs a DeepGEMM setting; block_n: each part's median time with
    BLOCK_N 128 over DeepGEMM's heuristic, a (T, dropped) case; triton_gemm: each GEMM's median a setting a T."""
    sections = [k for k in ("gather", "call", "knobs", "block_n", "triton_gemm") if data.get(k)]
    fig, axes = plt.subplots(1, len(sections), figsize=(6.5 * len(sections), 4.5), squeeze=False)
    for ax, key in zip(axes[0], sections, strict=True):
        rows = data[key]
        if key in ("gather", "call"):
            tokens = sorted({r["T"] for r in rows})
            for i, version in enumerate(("before", "after")):
                med, err = _median_spread([[r["us"] for r in rows if r["T"] == t and r["version"] == version]
                                           for t in tokens])
                ax.bar([j + i * 0.4 for j in range(len(tokens))], med, 0.4, yerr=err, label=version)
            ax.set_xticks([j + 0.2 for j in range(len(tokens))], [f"T={t}" for t in tokens])
            ax.set_ylabel("us (CUDA graph; median, min-max of rounds)")
            ax.set_title(f"FP8 psum MoE, {key}: before and after, in turns (equal bytes: "
                         f"{all(r['equal'] for r in rows)})", fontsize=9)
        elif key == "knobs":
            ok = [r for r in rows if "call_us" in r]
            for i, part in enumerate(("call", "gemm1", "gemm2")):
                ax.bar([j + i * 0.27 for j in range(len(ok))], [r[f"{part}_us"] for r in ok], 0.27, label=part)
            ax.set_xticks([j + 0.27 for j in range(len(ok))], [r["setting"] for r in ok], rotation=30, ha="right",
                          fontsize=7)
            ax.set_ylabel("us (CUDA graph)")
            ax.set_title("FP8 psum MoE at T = 4096: DeepGEMM settings (one run each)", fontsize=9)
        elif key == "triton_gemm":
            ok = [r for r in rows if "gemm1_us" in r]
            labels = sorted({(r["T"], r["impl"]) for r in ok}, key=lambda x: (-x[0], x[1]))
            for i, part in enumerate(("gemm1", "gemm2")):
                ax.bar([j + i * 0.4 for j in range(len(labels))],
                       [_median([r[f"{part}_us"] for r in ok if (r["T"], r["impl"]) == lab]) for lab in labels], 0.4,
                       label=part)
            ax.set_xticks([j + 0.2 for j in range(len(labels))], [f"T={t} {impl}" for t, impl in labels],
                          rotation=35, ha="right", fontsize=6)
            ax.set_ylabel("us (CUDA graph; median of rounds, the upper of two)")
            ax.set_title("FP8 psum MoE GEMMs: DeepGEMM against a Triton grouped FP8 GEMM prototype", fontsize=9)
        else:
            cases = sorted({(r["T"], r["dropped"]) for r in rows})
            for i, part in enumerate(("call", "gemm1", "gemm2")):
                ratio = [_median([r[f"{part}_us"] for r in rows if (r["T"], r["dropped"]) == c and r["block_n"] == 128])
                         / _median([r[f"{part}_us"] for r in rows
                                    if (r["T"], r["dropped"]) == c and r["block_n"] == "heuristic"]) for c in cases]
                ax.bar([j + i * 0.27 for j in range(len(cases))], ratio, 0.27, label=part)
            ax.axhline(1.0, color="k", lw=0.8)
            ax.set_ylim(0.85, 1.1)
            ax.set_xticks([j + 0.27 for j in range(len(cases))],
                          [f"T={t}" + (f"\n{d:.0%} dropped" if d else "") for t, d in cases], fontsize=7)
            ax.set_ylabel("time with BLOCK_N 128 / DeepGEMM's heuristic (medians)")
            ax.set_title("FP8 psum MoE: BLOCK_N 128 against the heuristic's 192, in turns", fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def conformance(reports: list[tuple[str, Any]], path: str) -> None:
    """Conformance reports (`dsv4hal conformance --json`) drawn as one: the cells run per op, stacked by status (a
    report's cells of other ops, deselected by its --ops, are left out)."""
    counts: dict[str, dict[str, int]] = {}
    for _, report in reports:
        for c in report["cells"]:
            by = counts.setdefault(c["op"], {})
            by[c["status"]] = by.get(c["status"], 0) + 1
    ops = sorted(counts)
    statuses = sorted({s for by in counts.values() for s in by})
    fig, ax = plt.subplots(figsize=(11, 5))
    left = [0] * len(ops)
    for status in statuses:
        n = [counts[op].get(status, 0) for op in ops]
        ax.barh(range(len(ops)), n, left=left, label=status)
        left = [a + b for a, b in zip(left, n)]
    ax.set_yticks(range(len(ops)), ops, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("cells (implementation x case x eager/graph)")
    total = {s: sum(counts[op].get(s, 0) for op in ops) for s in statuses}
    ax.set_title(f"conformance {reports[0][1]['platform']}: " + ", ".join(f"{v} {k}" for k, v in total.items())
                 + "\n(" + ", ".join(name for name, _ in reports) + ")", fontsize=8)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def demos(runs: list[tuple[str, Any]], path: str) -> None:
    """Demo runs side by side: each op alone (graph) and the graph step, with each op's kernel in the labels."""
    ops = list(runs[0][1]["ops_alone_us"])
    fig, ax = plt.subplots(figsize=(12, 5))
    width = 0.8 / len(runs)
    for i, (name, d) in enumerate(runs):
        ys = [d["ops_alone_us"].get(op, 0.0) for op in ops] + [d["graph_step_us"]]
        ax.bar([j + i * width for j in range(len(ops) + 1)], ys, width,
               label=f"{name}: step {d['graph_step_us']:.1f} us, attention {d['kernels']['sparse_attention_decode']}")
    ax.set_xticks([j + 0.4 for j in range(len(ops) + 1)], [*ops, "graph step"], rotation=40, ha="right", fontsize=7)
    ax.set_yscale("log")
    ax.set_ylabel("us a step (CUDA graph)")
    d = runs[0][1]
    ax.set_title(f"dsv4hal demo {d['config'].get('hidden')}-hidden layers, batch {d['batch']}, context {d['context']}",
                 fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    kind, src, dst = sys.argv[1:4]
    if kind in ("conformance", "demos", "hostratio", "alignab"):  # several reports drawn as one
        many = [(f.rsplit("/", 1)[-1].removesuffix(".json"), json.loads(open(f).read())) for f in src.split(",")]
        {"conformance": conformance, "demos": demos, "hostratio": hostratio, "alignab": alignab}[kind](many, dst)
    else:
        one = {"soak": soak, "host": host, "topk": topk, "quant": quant, "apply": apply, "mxmoe": mxmoe, "pdl": pdl,
               "parts": parts, "pertoken": pertoken, "alignprefill": alignprefill, "swiglureal": swiglureal,
               "fp8call": fp8call, "fastswiglu": fastswiglu, "scatter": scatter, "fp8ab": fp8ab}
        one[kind](json.loads(open(src).read()), dst)
