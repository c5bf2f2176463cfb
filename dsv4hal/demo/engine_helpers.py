"""Engine-side math the demo needs that dsv4hal keeps only in `dsv4hal.reference` today: the RoPE table and
rotation (the indexer query's RoPE and Hadamard are the op indexer_q_prep). These are not ops: an engine computes
them itself (the table is the model's business, spec 1.3). The demo borrows dsv4hal's own copies instead of duplicating
them, and only through this module, so the rest of the package stays on the public API and a move of these
helpers to a public module changes this file alone. (The compressor rings' empty state and expert sizes already
have a public home: dsv4hal.formats.compressor_state and dsv4hal.formats.experts.)"""

from __future__ import annotations

from dsv4hal.reference.rope import apply_rope, make_rope_table

__all__ = ["apply_rope", "make_rope_table"]
