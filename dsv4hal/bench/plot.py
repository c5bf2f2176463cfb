"""PNG plot of a benchmark JSON: one panel per benchmark present."""

from __future__ import annotations

from typing import Any

# the bar panels: a label a row, and the title
_BAR_PANELS = {"topk": (lambda r: f"B{r['B']} N{r['N'] // 1024}K k{r['k']}", "indexer top-k"),
               "mhc": (lambda r: f"{r['op']} T{r['T']} d{r['hidden']}", "mHC")}


def _bars(ax: Any, rows: list[dict[str, Any]], name: str) -> None:
    """Microseconds a kernel a shape, beside the shape's bandwidth floor (log scale)."""
    label, title = _BAR_PANELS[name]
    impls = list(dict.fromkeys(i for r in rows for i in r["us"]))  # kernels differ by shape
    width = 0.8 / (len(impls) + 1)
    for i, impl in enumerate(impls):
        pts = [(x + i * width, r["us"][impl]) for x, r in enumerate(rows) if impl in r["us"]]
        ax.bar(*zip(*pts), width, label=impl)
    ax.bar([x + len(impls) * width for x in range(len(rows))], [r["floor_us"] for r in rows], width,
           label="bandwidth floor", color="grey")
    ax.set_xticks(range(len(rows)), [label(r) for r in rows], rotation=70, fontsize=7)
    ax.set_yscale("log")
    ax.set_ylabel("us")
    ax.set_title(title)


def plot(result: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [k for k in ("attention", "pack_store", "topk", "mhc", "moe", "compress") if result.get(k)]
    if not panels:
        raise ValueError(f"nothing to plot: no benchmark this plot draws in the result (keys {sorted(result)}); "
                         "plot a result of dsv4hal bench attention, pack_store, topk, mhc, moe or compress")
    fig, axes = plt.subplots(1, len(panels), figsize=(7 * len(panels), 5), squeeze=False)
    for ax, name in zip(axes[0], panels):
        rows = result[name]
        if name == "attention":
            for cfg in dict.fromkeys(r["config"] for r in rows):
                sel = [r for r in rows if r["config"] == cfg]
                for impl in sel[0]["us"]:
                    ax.plot([r["T"] for r in sel], [r["T"] * r["attended_per_query"] / r["us"][impl] / 1e3
                                                    for r in sel], marker="o", label=f"{cfg} {impl}")
            ax.set_xscale("log")
            ax.set_xlabel("query tokens T")
            ax.set_ylabel("G attended tokens/s")
            ax.set_title("sparse decode")
        elif name == "pack_store":
            for impl in rows[0]["GBps"]:
                ax.plot([r["tokens"] for r in rows], [r["GBps"][impl] for r in rows], marker="o", label=impl)
            ax.axhline(rows[0]["copy_GBps"], color="k", ls="--", label="D2D copy")
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlabel("tokens")
            ax.set_ylabel("GB/s")
            ax.set_title("pack store")
        elif name == "moe":
            for fmt in dict.fromkeys(r["format"] for r in rows):
                sel = [r for r in rows if r["format"] == fmt and not r.get("dropped")]  # EP rows: printed only
                for impl in dict.fromkeys(i for r in sel for i in r["us"]):
                    pts = [(r["T"], r["us"][impl]) for r in sel if impl in r["us"]]
                    ax.plot(*zip(*pts), marker="o", ls="-" if fmt == "mxfp4" else "--", label=f"{fmt} {impl}")
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlabel("tokens T (V4-Flash experts, top-6)")
            ax.set_ylabel("us per layer")
            ax.set_title("routed experts (moe_experts)")
        elif name == "compress":  # the prefill form's share of copy bandwidth, as each way of calling it runs
            pre = rows["prefill"]
            ways = {"op (eager, host sync)": lambda r: r["fraction_of_copy"][r["chosen"]],
                    "op given num_groups (graph)": lambda r: r.get("num_groups_fraction_of_copy", {}).get(r["chosen"]),
                    "kernel alone (graph)": lambda r: r.get("triton_kernel_fraction_of_copy")}
            width = 0.8 / len(ways)
            for i, (label, get) in enumerate(ways.items()):
                pts = [(x + i * width, get(r)) for x, r in enumerate(pre) if get(r) is not None]
                if pts:
                    ax.bar(*zip(*pts), width, label=label)
            ax.axhline(rows["goals"]["prefill_goal_min"], color="k", ls="--", label="goal")
            ax.set_xticks(range(len(pre)), [f"{r['config']} N{r['tokens'] // 1024}K" for r in pre], fontsize=8)
            ax.set_ylabel("fraction of copy bandwidth")
            ax.set_title("compress (prefill form)")
        else:
            _bars(ax, rows, name)
        ax.legend(fontsize=6)
        ax.grid(alpha=0.3)
    fig.suptitle(f"{result.get('device', '')}: {result.get('command', '')}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
