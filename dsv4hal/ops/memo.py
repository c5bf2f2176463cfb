"""Host cost of a bound call: validation memoised on tensor metadata.

Unchecked validation (every op but compress, which reads cu_seqlens on the CPU) and case selection read only
host attributes: types, dtypes, shapes, strides, devices and scalar values. So a call whose arguments have the
same metadata as one that passed gives the same verdict and the same kernel, and the bound op skips straight to the
kernel. The key costs ~0.3 us a tensor against ~2 us a tensor to validate. Only calls that passed are remembered:
a bad argument is checked, and refused, every time. Checked mode (which reads values) never uses the memo."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import torch

from dsv4hal.formats.indexer_cache import IndexerPagedCache
from dsv4hal.formats.v4_cache import V4PagedCache
from dsv4hal.ops.attention_metadata import AttentionMetadata

MAX_ENTRIES = 1024  # engines see a few shapes per op; a fuzzer sees thousands: then start over

_Tensor = torch.Tensor
_SCALARS = (int, float, str, bool, type(None))
# dataclasses whose validation reads only their fields' metadata (PreparedWeights is not among them: it is
# checked against its payload, so an op with weights is never memoised)
_FIELDS: dict[type, tuple[str, ...]] = {
    cls: tuple(f.name for f in dataclasses.fields(cls) if f.init)
    for cls in (V4PagedCache, IndexerPagedCache, AttentionMetadata)}


class _Unkeyable(Exception):
    pass


def _key(v: object) -> object:
    tv = type(v)
    if tv is _Tensor or isinstance(v, _Tensor):
        return (tv, v.dtype, v.shape, v.stride(), v.device)  # type: ignore[union-attr]
    if tv in _SCALARS:
        return (tv, v)  # the type too: True, 1 and 1.0 validate differently
    names = _FIELDS.get(tv)
    if names is None:
        raise _Unkeyable
    return (tv, *(_key(getattr(v, n)) for n in names))


def metadata_key(args: Sequence[object], kwargs: Mapping[str, object]) -> tuple | None:
    """A hashable key of everything unchecked validation and case selection read, or None when an argument is
    of a kind the key does not describe (then validate in full)."""
    try:
        if kwargs:
            return (*map(_key, args), *((k, _key(v)) for k, v in kwargs.items()))
        return tuple(map(_key, args))
    except _Unkeyable:
        return None
