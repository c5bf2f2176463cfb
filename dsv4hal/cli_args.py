"""The command line's argument types and the `demo` subcommand's options (kept out of cli.py, which wires the
subcommands)."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import Any


def number(kind: type[int] | type[float], low: float, high: float | None = None, *,
           above: bool = False) -> Callable[[str], int | float]:
    """argparse type for every numeric option: a finite `kind` >= low (> low with `above`) and < high. A value
    outside is a usage error naming the range (argparse prints it and exits 2), never a crash later in the run."""
    word = "an integer" if kind is int else "a number"

    def show(bound: float) -> str:
        return str(int(bound)) if kind is int else f"{bound:g}"

    expected = f"{word} {'>' if above else '>='} {show(low)}" + (f" and < {show(high)}" if high is not None else "")

    def parse(raw: str) -> int | float:
        try:
            value = kind(raw)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{raw!r} is not {word}: give {expected}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{raw!r} is not a finite number: give {expected}")
        if value < low or (above and value == low):
            raise argparse.ArgumentTypeError(f"{raw} is {'not more' if value == low else 'less'} than {show(low)}: "
                                             f"give {expected}")
        if high is not None and value >= high:
            raise argparse.ArgumentTypeError(f"{raw} is not less than {show(high)}: give {expected}")
        return value
    parse.__name__ = "integer" if kind is int else "number"  # how argparse and --help name the type
    return parse


def op_list(text: str) -> tuple[str, ...]:
    """A comma-separated list of op names (checked against the platform once it is selected)."""
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    if not names:
        raise argparse.ArgumentTypeError("expected op names separated by commas, such as sparse_attention_decode")
    return names


def add_demo_parser(sub: Any) -> None:
    """The `demo` subcommand and its options."""
    sp = sub.add_parser("demo", help="an engine-shaped DSV4 layer stack: prefill, then decode (small shapes)")
    sp.add_argument("--platform", help="platform to run on (default: the detected one; like DSV4HAL_PLATFORM)")
    sp.add_argument("--batch", type=number(int, 1), default=2, help="requests decoded together (default: %(default)s)")
    sp.add_argument("--context", type=number(int, 1), default=300,
                    help="tokens of context per request before decoding (default: %(default)s)")
    sp.add_argument("--steps", type=number(int, 1), default=4, help="decode steps (default: %(default)s)")
    sp.add_argument("--tokens-per-request", type=number(int, 1), default=1, metavar="N",
                    help="query tokens per request in each decode step: 1, or 1 + k for an MTP verify step (2: the "
                         "balanced recipe, 4: low latency), all drafts accepted (default: %(default)s)")
    sp.add_argument("--size", choices=("small", "flash"), default="small",
                    help="layer dimensions: small (CPU) or V4-Flash (full size, on a GPU) (default: %(default)s)")
    sp.add_argument("--fill", choices=("prefill", "random"), default="prefill",
                    help="prefill the prompts, or fill the caches with random rows (a synthetic long context) "
                         "(default: %(default)s)")
    sp.add_argument("--graph", action=argparse.BooleanOptionalAction, default=None,
                    help="capture the decode step in a CUDA graph (default: on a CUDA platform)")
    sp.add_argument("--compile", nargs="?", const="inductor", default=None, metavar="BACKEND",
                    help="torch.compile the decode step (default backend: inductor), as an engine compiles its "
                         "model: dsv4hal's ops stay opaque custom ops, the torch code around them is fused "
                         "(default: off, the step runs as written)")
    sp.add_argument("--offload-c4", nargs="?", type=number(float, 0, 1, above=True), const=0.25, default=None,
                    metavar="FRACTION", help="keep the C4 pool in pinned host memory with a device working set of "
                    "FRACTION of its pages (default fraction 0.25, raised to the pages one step selects), fetched each "
                    "step (default: off, the pool resident)")
    sp.add_argument("--kernels-per-call", type=op_list, default=(), metavar="OP[,OP...]",
                    help="graph mode: run each of the first step's calls of these ops through every kernel that "
                         "takes its case, on the call's own inputs: output checked, then timed alone (JSON "
                         "kernels_per_call; default: none)")
    sp.add_argument("--compare-cpu", action="store_true",
                    help="also run the small config on the CPU reference and compare every layer's output "
                         "(default: off)")
    sp.add_argument("--ep", type=number(int, 1), default=1, metavar="N",
                    help="expert parallel over N processes (gloo on the CPU, NCCL with one GPU each): E/N experts a "
                         "rank, --batch requests a rank; --compare-cpu checks the MoE layers against one rank's "
                         "(default: 1)")
    sp.add_argument("--tp", type=number(int, 1), default=1, metavar="N", help="tensor-parallel attention over N "
                    "processes (gloo/NCCL): heads/N a rank, the output projection all-reduced (default: 1)")
    sp.add_argument("--json", metavar="PATH", help="write the results as JSON here (default: not written)")
    sp.add_argument("--plot", metavar="PNG", help="per-op breakdown plot: op alone vs bandwidth floor in graph mode, "
                    "eager per-op time otherwise (default: none; needs matplotlib)")
    sp.set_defaults(func=lambda a: __import__("dsv4hal.demo", fromlist=["main"]).main(a))
