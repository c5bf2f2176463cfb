"""Plots of H200 results that `dsv4hal bench --plot` does not draw: the soak's memory reads and the host
enqueue cost of a bound attention call against the direct vendor call.

    python3 bench/plot_results.py soak bench/results/h200/soak-3.6min.json bench/results/h200/soak-3.6min.png
    python3 bench/plot_results.py host bench/results/h200/bench-attention-host.json \
        bench/results/h200/bench-attention-host.png"""

from __future__ import annotations

import json
import sys
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


if __name__ == "__main__":
    kind, src, dst = sys.argv[1:4]
    {"soak": soak, "host": host}[kind](json.loads(open(src).read()), dst)
