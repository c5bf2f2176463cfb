"""Programmatic dependent launch (PDL, NVIDIA sm_90 and later) for the portable Triton kernels.

A kernel launched with PDL may be scheduled before the kernel ahead of it in the stream has finished: its launch
(and, once the kernel ahead triggers, its programs' start) overlaps that kernel's tail instead of following its
completion. Every such kernel first waits (`griddepcontrol.wait`) until the kernel ahead has completed and its
writes are visible, so nothing it reads can be stale. Modes (`DSV4HAL_PDL`, read once per process):
- 0: off (plain launches);
- 1: launched with PDL, each kernel waiting first; the kernel ahead triggers its dependents only by exiting;
- 2: as 1, and each kernel triggers its own dependents right after its wait, so that the next kernel's launch
  overlaps this kernel's whole run (at most one kernel waits ahead: a trigger follows the trigger-er's own wait).
Off on other devices, under the interpreter and on ROCm (no such instructions). CUDA graphs keep the launch
attribute as a programmatic edge."""

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl

MODES = (0, 1, 2)
DEFAULT_MODE = 0


@triton.jit
def pdl_enter(PDL: tl.constexpr):
    """First statement of a kernel that takes PDL: wait for the kernel ahead (mode >= 1), then let the next kernel
    launch (mode 2)."""
    if PDL >= 1:
        tl.extra.cuda.gdc_wait()
    if PDL >= 2:
        tl.extra.cuda.gdc_launch_dependents()


def _env_mode() -> int:
    raw = os.environ.get("DSV4HAL_PDL", str(DEFAULT_MODE))
    if raw not in {str(m) for m in MODES}:
        raise ValueError(f"DSV4HAL_PDL={raw!r}: set one of {', '.join(map(str, MODES))} (0: off)")
    return int(raw)


@functools.lru_cache(maxsize=8)
def pdl_mode(device: torch.device) -> int:
    """The PDL mode for kernels launched on `device` (0 where PDL does not exist)."""
    if (device.type != "cuda" or os.environ.get("TRITON_INTERPRET") == "1" or torch.version.hip is not None
            or torch.cuda.get_device_capability(device)[0] < 9):
        return 0
    return _env_mode()


def pdl_args(device: torch.device) -> dict[str, object]:
    """The launch keywords of a kernel that takes PDL: its constexpr and the launch attribute."""
    mode = pdl_mode(device)
    return {"PDL": mode, "launch_pdl": mode > 0}
