"""Argument checks shared by every op contract. They never synchronise with the device
unless the caller asked for checked mode (value checks read tensor contents)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from dsv4hal.errors import InvalidArgumentError

Dim = int | None  # None matches any size


def describe(t: object) -> str:
    if isinstance(t, torch.Tensor):
        return f"{t.dtype} tensor of shape {tuple(t.shape)} on {t.device}"
    return type(t).__name__ if t is not None else "None"


def check_tensor(
    op: str,
    name: str,
    t: object,
    *,
    dtype: torch.dtype | Sequence[torch.dtype] | None = None,
    shape: Sequence[Dim] | None = None,
    device: torch.device | None = None,
    contiguous: bool = False,
) -> torch.Tensor:
    """Check type, dtype, rank/shape, device and contiguity; raise InvalidArgumentError naming `name`."""
    if not isinstance(t, torch.Tensor):
        raise InvalidArgumentError(op, name, "a torch.Tensor", describe(t))
    if dtype is not None:
        allowed = (dtype,) if isinstance(dtype, torch.dtype) else tuple(dtype)
        if t.dtype not in allowed:
            raise InvalidArgumentError(
                op, name, "dtype " + " or ".join(str(d) for d in allowed), describe(t),
                remedy=f"convert with .to({allowed[0]})",
            )
    if shape is not None:
        ok = t.dim() == len(shape) and all(w is None or w == s for w, s in zip(shape, t.shape))
        if not ok:
            want = "[" + ", ".join("*" if w is None else str(w) for w in shape) + "]"
            raise InvalidArgumentError(op, name, f"shape {want}", describe(t))
    # a kernel cannot read across devices: the type must match, and the index too when one is given
    if device is not None and (t.device.type != device.type
                               or (device.index is not None and t.device.index != device.index)):
        raise InvalidArgumentError(
            op, name, f"a tensor on {device}", describe(t), remedy=f"move it with .to('{device}')"
        )
    if contiguous and not t.is_contiguous():
        raise InvalidArgumentError(op, name, "a contiguous tensor", "a strided view", remedy="call .contiguous()")
    return t


def check_choice(op: str, name: str, value: object, allowed: Sequence[object]) -> None:
    if value not in allowed:
        raise InvalidArgumentError(op, name, "one of " + ", ".join(map(repr, allowed)), repr(value))


def check_finite(op: str, name: str, t: torch.Tensor) -> None:
    """Checked mode only: reads the tensor (a host sync on GPUs)."""
    if t.is_floating_point() and not bool(torch.isfinite(t.float()).all()):
        raise InvalidArgumentError(
            op, name, "finite values", "NaN or infinity", remedy="inspect the producer of this tensor"
        )


def check_index_range(op: str, name: str, idx: torch.Tensor, limit: int) -> None:
    """Checked mode only: every index is -1 (invalid) or in [0, limit)."""
    if idx.numel() == 0:
        return
    bad = (idx < -1) | (idx >= limit)
    if bool(bad.any()):
        first = int(idx[bad].flatten()[0])
        raise InvalidArgumentError(
            op, name, f"indices in [0, {limit}) or -1", f"index {first}",
            remedy="indices address slots of the cache; -1 marks an unused entry",
        )


def check_same_device(op: str, tensors: dict[str, torch.Tensor], device: torch.device, anchor: str) -> None:
    """Every tensor sits on `device` (the device of `anchor`, named in the message)."""
    for name, t in tensors.items():
        if t.device != device:
            raise InvalidArgumentError(op, name, f"a tensor on {device} ({anchor}'s device)", describe(t),
                                       remedy=f"move it with .to('{device}')")
