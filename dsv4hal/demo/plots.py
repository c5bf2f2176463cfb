"""Plots of a demo run: per-op time against its bandwidth floor (graph mode), or eager per-op time."""

from __future__ import annotations

from typing import Any


def plot_breakdown(res: dict[str, Any], path: str) -> None:
    """Per-op time alone vs bandwidth floor per decode step, and the graph step against the sum of its ops."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    alone, floors = res["ops_alone_us"], res["ops_floor_us"]
    names = sorted(alone, key=lambda n: -alone[n])
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(14, 5), gridspec_kw={"width_ratios": [3, 1]})
    xs = range(len(names))
    ax.bar([x - 0.2 for x in xs], [alone[n] for n in names], 0.4, label="op alone (CUDA graph)")
    ax.bar([x + 0.2 for x in xs], [floors[n] for n in names], 0.4, label="bandwidth floor", color="grey")
    ax.set_xticks(list(xs), [f"{n}\n{res['kernels'].get(n, '')}" for n in names], rotation=60, fontsize=6,
                  ha="right")
    ax.set_yscale("log")
    ax.set_ylabel("us per decode step (3 layers)")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    ax2.bar(["sum of ops alone", "graph step"], [res["sum_ops_alone_us"], res["graph_step_us"]],
            color=["tab:blue", "tab:orange"])
    ax2.set_ylabel("us")
    ax2.set_title(f"graph step / sum = {res['graph_step_over_sum_ops']:.2f}", fontsize=9)
    fig.suptitle(f"dsv4hal demo on {res['device']}: batch {res['batch']}, context {res['context']}, "
                 f"{res['config']['hidden']} hidden, {res['config']['experts']} experts", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def plot_eager(res: dict[str, Any], path: str) -> None:
    """Without graph mode (the CPU): the eager decode time of each op per step, with its kernel."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    per_step = {n: 1e3 * s / max(res["steps"], 1) for n, s in res["decode_breakdown_s"].items()}
    names = sorted(per_step, key=lambda n: -per_step[n])
    fig, ax = plt.subplots(figsize=(10, 5))
    ax.bar(range(len(names)), [per_step[n] for n in names])
    ax.set_xticks(range(len(names)), [f"{n}\n{res['kernels'].get(n, '')}" for n in names], rotation=60, fontsize=6,
                  ha="right")
    ax.set_ylabel("ms per decode step (eager)")
    ax.set_title(f"dsv4hal demo on {res['platform']} ({res['device']}): batch {res['batch']}, context "
                 f"{res['context']}, {res['decode_tokens_per_s']:.1f} tokens/s", fontsize=9)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

