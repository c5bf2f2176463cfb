"""The demo model's dimensions: DSV4's fixed ones (head, RoPE, window, page, top-k, layer ratios) and the sizes
that scale (`DemoConfig`; `SIZES` names the CPU one and V4-Flash's)."""

from __future__ import annotations

from dataclasses import dataclass

D_HEAD, ROPE, WINDOW, PAGE, C4_TOPK = 512, 64, 128, 256, 512
RATIOS = (0, 4, 128)  # one layer each: SWA only, C4 with the indexer, C128


@dataclass(frozen=True)
class DemoConfig:
    hidden: int = 256
    heads: int = 64
    experts: int = 8
    inter: int = 64
    top_k: int = 6
    q_lora: int = 64  # q = RMSNorm(a @ wq_a) @ wq_b (also the indexer's query input)
    o_groups: int = 8  # grouped low-rank output projection: heads split in groups, each to o_lora
    o_lora: int = 64
    max_pages: int = 4  # per request (run_demo sizes it to the context)
    draw_on_device: bool = False  # random weights drawn on the device (full size), else on the CPU
    # the dense projections (wq_a, wq_b, wkv, wo_b, the indexer's wq_b) in FP8 with 128x128 block scales through
    # the fp8_linear op, as V4's checkpoint stores them (their input widths must be multiples of 128); else bf16
    fp8_linears: bool = False


SIZES = {"small": DemoConfig(),
         "flash": DemoConfig(hidden=4096, heads=64, experts=256, inter=2048, q_lora=1024, o_groups=8, o_lora=1024,
                             draw_on_device=True, fp8_linears=True)}
