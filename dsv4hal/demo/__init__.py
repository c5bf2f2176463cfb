"""An engine-shaped program on the public API only: three DSV4 layers (SWA-only, C4 with the lightning
indexer, C128), each followed by MoE and wrapped in mHC, over paged caches; a batch of prompts is
prefilled, then decoded token by token. It prints decode tokens per second and the time of each op.

Small shapes run on the CPU (CI runs it there against the same program with dsv4hal's Triton kernels
forced under the interpreter). Prefill compresses each prompt with the prefill-form compressor and seeds
the compressors' state rings; decode steps run the decode form (compress_decode) on those rings.

On a GPU (`--size flash`: V4-Flash layers) the decode step is captured once in a CUDA graph and replayed with
new positions; one step is also recorded op by op and each call is timed alone (in its own CUDA graph), so
the graph step can be compared with the sum of its ops and with each op's bandwidth floor. `--fill random`
skips the prefill compute and fills the caches and compressor rings with random rows through pack_store
(a long context at full size in seconds); decode then runs exactly as after a real prefill.

The model (dimensions, weights, caches, forward pass, random fill, per-op timers, the op-call tape) is
`dsv4hal.engine_model`, which `dsv4hal soak` runs too. Modules here: `floors` (bandwidth floors from the byte
formats), `plots`, `step_profile`, `runner` (run_demo: prefill and eager or CUDA-graph decode), `cpu_comparison`,
`command` (`dsv4hal demo`)."""

from __future__ import annotations

from dsv4hal.demo.command import main
from dsv4hal.demo.cpu_comparison import CPU_TOLERANCE, CPU_TOLERANCE_REASON, compare_with_cpu
from dsv4hal.demo.floors import floor_bytes
from dsv4hal.demo.plots import plot_breakdown, plot_eager
from dsv4hal.demo.runner import kernels_in_use, run_demo
from dsv4hal.engine_model.config import C4_TOPK, D_HEAD, PAGE, RATIOS, ROPE, SIZES, WINDOW, DemoConfig
from dsv4hal.engine_model.model import DemoModel, fill_random
from dsv4hal.engine_model.tape import REPLAY_TOLERANCE, Tape, replay, tensors_of
from dsv4hal.engine_model.timers import NullTimer, OpTimer, Timer

__all__ = [
    "C4_TOPK", "CPU_TOLERANCE", "CPU_TOLERANCE_REASON", "D_HEAD", "PAGE", "RATIOS", "REPLAY_TOLERANCE", "ROPE",
    "SIZES", "WINDOW", "DemoConfig", "DemoModel", "NullTimer", "OpTimer", "Tape", "Timer", "compare_with_cpu",
    "fill_random", "floor_bytes", "kernels_in_use", "main", "plot_breakdown", "plot_eager", "replay", "run_demo",
    "tensors_of",
]
