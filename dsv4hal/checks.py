"""Argument checks shared by every op contract and by the formats' constructors: a leaf module (it imports only
dsv4hal.errors), so the formats, which sit below the ops, can use it. They never synchronise with the device
unless the caller asked for checked mode (value checks read tensor contents).

Negative indices mean one thing in every op that takes slot or row indices: -1 is an unused entry; any other
negative is invalid (checked mode refuses it with InvalidArgumentError; unchecked, the entry's contribution is
unspecified, but no kernel reads or writes outside its buffers for it)."""

from __future__ import annotations

import math
import operator
import os
from collections.abc import Sequence
from numbers import Real

import torch

from dsv4hal.errors import InvalidArgumentError

Dim = int | None  # None matches any size


def describe(t: object) -> str:
    if isinstance(t, torch.Tensor):
        return f"{t.dtype} tensor of shape {tuple(t.shape)} on {t.device}"
    return type(t).__name__ if t is not None else "None"


def show(value: object) -> str:
    """A scalar argument as an error message shows it: its repr, or for a tensor its description (torch.compile,
    which traces validation, cannot take a tensor's repr)."""
    return describe(value) if isinstance(value, torch.Tensor) else repr(value)


def check_tensor(
    op: str,
    name: str,
    t: object,
    *,
    dtype: torch.dtype | Sequence[torch.dtype] | None = None,
    shape: Sequence[Dim] | None = None,
    device: torch.device | None = None,
    contiguous: bool = False,
    unit_stride: bool = False,
) -> torch.Tensor:
    """Check type, dtype, rank/shape, device and layout; raise InvalidArgumentError naming `name`.
    `contiguous`: the kernels index the tensor as dense. `unit_stride`: only the last dimension must be dense
    (the kernels take the other strides)."""
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
        raise InvalidArgumentError(op, name, "a contiguous tensor", f"a strided view (strides {t.stride()})",
                                   remedy="call .contiguous()")
    if unit_stride and t.dim() and t.shape[-1] > 1 and t.stride(-1) != 1:
        raise InvalidArgumentError(op, name, "unit stride along the last dimension", f"strides {t.stride()}",
                                   remedy="call .contiguous()")
    return t


def check_positive_float(op: str, name: str, value: object, *, allow_inf: bool = False) -> float:
    """A positive real number (int or float, never bool), finite unless allow_inf."""
    ok = isinstance(value, Real) and not isinstance(value, bool) and not math.isnan(value) and value > 0
    if not ok or (not allow_inf and math.isinf(value)):
        raise InvalidArgumentError(op, name, "a positive " + ("number" if allow_inf else "finite number"),
                                   show(value))
    return float(value)


_memory: dict[tuple[str, int | None], int] = {}


def _memory_bytes(device_type: str, index: int | None) -> int:
    """Total memory of a device (a host query made once: no sync and no CUDA call after the first). torch.compile
    runs it rather than traces it (dsv4hal.custom_ops marks it a constant)."""
    key = (device_type, index)
    n = _memory.get(key)
    if n is None:
        n = _memory[key] = _query_memory(device_type, index)
    return n


def _query_memory(device_type: str, index: int | None) -> int:
    if device_type == "cuda":
        return int(torch.cuda.get_device_properties(index if index is not None else 0).total_memory)
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 1 << 62


def check_alloc(op: str, what: str, nbytes: int, device: torch.device, *, kind: str = "outputs") -> None:
    """Refuse an output (or a buffer of another `kind`) that cannot be allocated on `device` before allocating
    it: inputs may be expand views (stride 0) whose sizes say nothing about memory that exists."""
    limit = _memory_bytes(device.type, device.index)
    if nbytes > limit:
        if kind == "outputs":
            raise InvalidArgumentError(op, what, f"outputs that fit the device's {limit / 2**30:.1f} GiB",
                                       f"{nbytes / 2**30:.1f} GiB of outputs",
                                       remedy="split the call into smaller batches")
        raise InvalidArgumentError(op, what, f"{kind} within the device's {limit / 2**30:.1f} GiB",
                                   f"{nbytes / 2**30:.1f} GiB", remedy=f"ask for fewer {what.split()[0]}")


def check_materializable(op: str, args: Sequence[object], kwargs: dict[str, object],
                         names: Sequence[str] = ()) -> None:
    """Every op, at dispatch: a tensor argument with a zero stride (an expand view) whose logical size exceeds
    its device's memory is refused, because a kernel or reference that copies it densely would die in the
    allocator; so is a tensor on the meta device (no data: checked mode and kernels must read it). Reads only
    host attributes; dense tensors are skipped at once (their memory exists). `names` are the op's parameter
    names, to name positional arguments."""
    named = list(kwargs.items()) + [(names[i] if i < len(names) else f"argument {i}", a)
                                    for i, a in enumerate(args)]
    for name, t in named:
        if not isinstance(t, torch.Tensor):
            continue
        if t.device.type == "meta":  # not t.is_meta: Dynamo, which traces this, keeps that read in the graph
            raise InvalidArgumentError(op, name, "a tensor with data", describe(t),
                                       remedy="meta tensors only describe shapes; allocate it on a device")
        if t.dim() and 0 in t.stride():
            nbytes = t.numel() * t.element_size()
            limit = _memory_bytes(t.device.type, t.device.index)
            if nbytes > limit:
                raise InvalidArgumentError(op, name, f"a tensor that fits the device's {limit / 2**30:.1f} GiB",
                                           f"an expand view of {nbytes / 2**30:.1f} GiB {describe(t)}",
                                           remedy="pass a smaller batch, or a dense tensor")


def check_count(op: str, name: str, value: object, *, minimum: int = 0) -> int:
    """An integer (a numpy or torch integer too, never a bool or a float) >= minimum: a size or a count."""
    try:
        n = -1 if isinstance(value, bool) else operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        n = minimum - 1
    if n < minimum:
        raise InvalidArgumentError(op, name, f"an int >= {minimum}", show(value))
    return n


def check_device(op: str, name: str, device: object) -> torch.device:
    """A torch.device, or a string torch.device accepts ("cpu", "cuda:0")."""
    try:
        dev = torch.device(device)  # type: ignore[call-overload]
    except (RuntimeError, TypeError):
        raise InvalidArgumentError(op, name, "a torch.device or a device string such as 'cuda:0'",
                                   show(device)) from None
    if dev.type == "cuda" and not torch.cuda.is_available():  # a query that does not initialise CUDA
        raise InvalidArgumentError(op, name, "a device this machine has", f"{dev} (no CUDA device is available)",
                                   remedy="allocate on 'cpu', or run where torch sees a GPU")
    return dev


def check_choice(op: str, name: str, value: object, allowed: Sequence[object]) -> None:
    """`value` is one of `allowed` and of its type (512.0 and True are not the int choices 512 and 1)."""
    def same(a: object) -> bool:
        if isinstance(a, int) and not isinstance(a, bool):
            return isinstance(value, int) and not isinstance(value, bool) and value == a
        return type(value) is type(a) and value == a

    if not any(same(a) for a in allowed):
        raise InvalidArgumentError(op, name, "one of " + ", ".join(map(repr, allowed)), show(value))


def check_finite(op: str, name: str, t: torch.Tensor) -> None:
    """Checked mode only: reads the tensor (a host sync on GPUs)."""
    if t.is_floating_point() and not bool(torch.isfinite(t.float()).all()):
        raise InvalidArgumentError(
            op, name, "finite values", "NaN or infinity", remedy="inspect the producer of this tensor"
        )


def check_index_range(op: str, name: str, idx: torch.Tensor, limit: int) -> None:
    """Checked mode only: every index is -1 (unused) or in [0, limit); other negatives are invalid."""
    if idx.numel() == 0:
        return
    bad = (idx < -1) | (idx >= limit)
    if bool(bad.any()):
        first = int(idx[bad].flatten()[0])
        raise InvalidArgumentError(
            op, name, f"indices in [0, {limit}) or -1", f"index {first}",
            remedy="indices address slots of the cache; -1 (and no other negative) marks an unused entry",
        )


def check_same_device(op: str, tensors: dict[str, torch.Tensor], device: torch.device, anchor: str) -> None:
    """Every tensor sits on `device` (the device of `anchor`, named in the message)."""
    for name, t in tensors.items():
        if t.device != device:
            raise InvalidArgumentError(op, name, f"a tensor on {device} ({anchor}'s device)", describe(t),
                                       remedy=f"move it with .to('{device}')")


def check_page_table_rows(op: str, page_table: torch.Tensor, pages_used: torch.Tensor, whose: str) -> None:
    """Checked mode: each row's first pages_used[row] entries are page ids >= 0 and the rest are ids or -1 (no
    other negative); the table holds at least max(pages_used) columns. `whose` names what uses the pages."""
    need = int(pages_used.max())
    if need > page_table.shape[1]:
        raise InvalidArgumentError(op, "page_table", f"at least {need} pages per row", describe(page_table))
    cols = torch.arange(page_table.shape[1], device=page_table.device)
    bad = ((cols[None, :] < pages_used[:, None]) & (page_table < 0)) | (page_table < -1)
    if bool(bad.any()):
        row = int(bad.any(dim=1).nonzero()[0, 0])
        raise InvalidArgumentError(op, "page_table", f"page ids >= 0 for every page {whose} (-1, and no other "
                                   "negative, for the others)",
                                   f"row {row}: page ids {page_table[row, :int(pages_used[row])].tolist()[:8]}",
                                   remedy="fill each row's used pages; -1 may mark only entries past its last page")
