"""The compressor's per-request state (spec 2.4) as an engine allocates and passes it: fp32 rings of the
last kv_score rows, [num_slots, ring, 2*coff*hd], kv halves 0 and score halves -inf when empty. The ring
holds at least the rows one compressed entry pools (window_rows)."""

from __future__ import annotations

import torch

from dsv4hal.checks import check_alloc, check_choice, check_count, check_device
from dsv4hal.errors import InvalidArgumentError

OVERLAP_RATIO = 4  # the only ratio whose window reaches into the previous group
RATIOS = (OVERLAP_RATIO, 128)  # the compressed layers' ratios (C4, C128)


def coff_for(ratio: int) -> int:
    """Window width in groups: C4 looks at the previous group too (overlap), C128 only at its own."""
    return 2 if ratio == OVERLAP_RATIO else 1


def window_rows(ratio: int) -> int:
    """Rows one compressed entry pools: 8 for C4 (two overlapping groups of 4), else the ratio."""
    return 2 * OVERLAP_RATIO if ratio == OVERLAP_RATIO else ratio


def new_state(num_slots: int, ratio: int, width: int, device: torch.device | str = "cpu",
              ring: int | None = None) -> torch.Tensor:
    """Compressor state rings fp32 [num_slots, ring, width]: kv halves 0, score halves -inf (spec 2.4).
    Ring 8 for C4 and 128 for C128 (16 and 256 with speculative decoding)."""
    op = "new_state"
    num_slots = check_count(op, "num_slots", num_slots)
    check_choice(op, "ratio", ratio, RATIOS)
    width = check_count(op, "width", width, minimum=2)
    if width % 2:
        raise InvalidArgumentError(op, "width", "an even int (kv and score halves)", repr(width))
    window = window_rows(ratio)  # type: ignore[arg-type]
    ring = window if ring is None else check_count(op, "ring", ring, minimum=window)
    dev = check_device(op, "device", device)
    check_alloc(op, "num_slots (state size)", num_slots * ring * width * 4, dev, kind="a state")
    state = torch.zeros(num_slots, ring, width, dtype=torch.float32, device=dev)
    state[..., width // 2:] = float("-inf")
    return state
