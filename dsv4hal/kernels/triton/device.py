"""Host facts about the device a Triton kernel launches on, asked once per device."""

from __future__ import annotations

import functools

import torch


@functools.lru_cache(maxsize=8)
def sm_count(device: torch.device) -> int:
    """The device's SM count, asked once per device (kernels size their grids by it); 4 off a GPU (the interpreter:
    a few programs are enough to exercise a split)."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4
