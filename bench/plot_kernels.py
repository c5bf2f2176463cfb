"""Plot of `dsv4hal bench mhc,compress,indexer` (bench/results/h200/bench-kernels.json): each kernel's time over its
bandwidth floor, against the PyTorch reference, per shape. Usage: python3 bench/plot_kernels.py JSON PNG"""

from __future__ import annotations

import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def _bars(ax, labels: list[str], series: dict[str, list[float]], title: str, goal: float | None) -> None:  # noqa: ANN001
    width = 0.8 / max(len(series), 1)
    for i, (name, values) in enumerate(series.items()):
        ax.bar([x + i * width for x in range(len(labels))], values, width, label=name)
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(labels))], labels, rotation=60, ha="right", fontsize=6)
    ax.set_yscale("log")
    ax.set_ylabel("time / bandwidth floor")
    if goal:
        ax.axhline(goal, color="red", lw=0.8, ls="--", label=f"goal {goal}x")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=6)
    ax.grid(alpha=0.3)


def main(src: str, dst: str) -> None:
    b = json.load(open(src))
    fig, axes = plt.subplots(1, 3, figsize=(16, 5))
    mhc = [r for r in b["mhc"] if r.get("op") != "mhc_pre_gemm"]  # the GEMM-part comparison rows: printed, not drawn
    labels = [f"{r['op']} T={r['T']}" for r in mhc]
    _bars(axes[0], labels, {"triton": [next(v for k, v in r["floor_ratio"].items() if k.startswith("triton"))
                                       for r in mhc],
                            "torch reference": [r["floor_ratio"]["torch_reference"] for r in mhc]},
          "mHC, V4-Flash d 4096", 4.0)
    dec = b["compress"]["decode"]
    _bars(axes[1], [f"{r['config']} {r['step']}" for r in dec],
          {"triton": [r["over_floor"]["triton_compress_decode"] for r in dec],
           "torch reference": [r["over_floor"]["torch_reference"] for r in dec]},
          "compress_decode, batch 64 at 32K", 3.0)
    il = b["indexer"]["indexer_logits"]
    names = ["deepgemm_paged_mqa_logits_sm90 (in decode_step)", "deep_gemm direct", "triton_indexer_logits"]
    _bars(axes[2], [f"T={r['T']} rows={r['context_rows']}" for r in il],
          {n: [r["x_floor"].get(n, float("nan")) for r in il] for n in names}, "indexer_logits", 3.0)
    fig.suptitle(f"dsv4hal kernels on {b['device']} (copy {b['ceilings']['copy_bytes_per_s'] / 1e12:.2f} TB/s)",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(dst, dpi=110)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
