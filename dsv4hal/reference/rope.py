"""The references' RoPE: the table and rotation of `dsv4hal.rope` (the model's math, which the engine-shaped model
uses too)."""

from __future__ import annotations

from dsv4hal.rope import (
    DSV4_YARN,
    ROPE_DIM,
    ROPE_PAIRS,
    YarnConfig,
    apply_rope,
    make_rope_table,
    rope_frequencies,
    table_positions,
    table_rows,
)

__all__ = ["DSV4_YARN", "ROPE_DIM", "ROPE_PAIRS", "YarnConfig", "apply_rope", "make_rope_table", "rope_frequencies",
           "table_positions", "table_rows"]
