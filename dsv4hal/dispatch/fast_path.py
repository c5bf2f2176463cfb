"""The fast path of a validated call: a call whose argument metadata passed before skips validation and selection.

Unchecked validation (every op but compress, which reads cu_seqlens on the CPU) and case selection read only
host attributes: types, dtypes, shapes, strides, devices and scalar values (and of prepared weights: the op,
kernel and platform they were made for, their case and their payload's devices). So a call whose arguments have
the same metadata as one that passed gives the same verdict and the same kernel: FastPath maps that metadata to the
kernel. Only calls that passed are remembered: a bad argument is checked, and refused, every time. Checked mode
(which reads values) never uses it.

The key is one flat tuple built in one loop, with no Python call per argument for the common kinds (plain tensors,
plain scalars, caches, prepared weights): ~0.3 us a tensor, most of it the four metadata reads every key needs,
against ~2 us a tensor to validate. A paged cache or a PreparedWeights is one item, a token kept on the object for
its metadata (formats.cache_object; PreparedWeights is frozen), built on its first call. Plain Python and public
torch attributes only: on the 2-core CI machine sparse_attention_decode (six tensors and two caches in nine
arguments) finds its kernel in ~4 us (~13 us to validate and select), or in ~1 us where the plain tensors are
checked by Dynamo's C++ TensorGuards (FastPath)."""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from dsv4hal.dispatch import bounded
from dsv4hal.formats.indexer_cache import IndexerPagedCache
from dsv4hal.formats.v4_cache import V4PagedCache
from dsv4hal.ops.attention_metadata import AttentionMetadata
from dsv4hal.prepared import PreparedWeights

_Tensor = torch.Tensor
_SCALARS = frozenset((int, float, str, bool, type(None)))


def _getter(cls: type) -> Callable[[object], tuple]:
    names = tuple(f.name for f in dataclasses.fields(cls) if f.init)
    get = operator.attrgetter(*names)
    return get if len(names) > 1 else lambda v: (get(v),)


# dataclasses whose validation reads only their fields' metadata: their init fields, as a tuple (PreparedWeights,
# checked against its payload, is described by _describe instead)
_FIELDS: dict[type, Callable[[object], tuple]] = {
    cls: _getter(cls) for cls in (V4PagedCache, IndexerPagedCache, AttentionMetadata)}


class _Unkeyable(Exception):
    pass


class _Token:
    """One object's metadata (_describe): hashed and compared by identity, so a key holding it costs what an int
    does. Tokens are never reused for other metadata."""

    __slots__ = ()


_TOKENED = frozenset((V4PagedCache, IndexerPagedCache, PreparedWeights))
_tokens: dict[tuple, _Token] = {}  # metadata -> its token, so that equal objects share fast-path entries


def _describe(obj: V4PagedCache | IndexerPagedCache | PreparedWeights) -> tuple:
    """What validation and selection read of a cache (its type, then its fields' items as _extend appends them) or
    of prepared weights: the op, kernel, layout and platform they were made for, their case, and the payload's
    tensors (as _extend describes them; validation reads their devices)."""
    items: list[object] = []
    if type(obj) is PreparedWeights:
        items += (PreparedWeights, obj.op, obj.implementation, obj.layout, obj.platform, tuple(obj.case.items()),
                  type(obj.payload))
        payload = obj.payload
        if dataclasses.is_dataclass(payload) and not isinstance(payload, type):
            for f in dataclasses.fields(payload):
                v = getattr(payload, f.name)
                if isinstance(v, _Tensor):
                    items.append(f.name)
                    _extend(items, v)
    else:
        _extend(items, obj)
    return tuple(items)


def _token_of(obj: V4PagedCache | IndexerPagedCache | PreparedWeights) -> _Token:
    """The token of an object's metadata, built and kept on it on its first call (assigning a cache's field
    forgets it: formats.cache_object; PreparedWeights is frozen)."""
    described = _describe(obj)
    try:
        tok = _tokens.get(described)
    except TypeError:  # an unhashable item (a case value): such weights are validated every call
        raise _Unkeyable from None
    if tok is None:
        tok = bounded.put(_tokens, described, _Token())  # a dropped token only costs equal caches a shared entry
    object.__setattr__(obj, "_memo_token", tok)
    return tok


def _extend(key: list[object], v: object) -> None:
    """Append the items that describe `v`: a plain tensor is its dtype, shape, strides and device; a plain scalar its
    type and value (True, 1 and 1.0 validate differently); a tensor subclass its type then as a plain tensor; one of
    the dataclasses its type then each field in turn. Read left to right the items decode one way only (a dtype
    starts a plain tensor, a type says what follows, and every kind has a fixed number of items), so two different
    argument lists never give the same key. metadata_key inlines the common branches of this function: they
    must append the same items as it does, but for a cache or prepared weights, which it describes by a token (a
    _Token item starts and ends such an argument)."""
    tv = type(v)
    if tv is _Tensor:
        key += (v.dtype, v.shape, v.stride(), v.device)  # type: ignore[attr-defined]
    elif tv in _SCALARS:
        key += (tv, v)
    elif isinstance(v, _Tensor):
        key += (tv, v.dtype, v.shape, v.stride(), v.device)
    else:
        get = _FIELDS.get(tv)
        if get is None:
            raise _Unkeyable
        key.append(tv)
        for f in get(v):  # the fields inline too: a cache costs its tensor's items and a little
            tf = type(f)
            if tf is _Tensor:
                key += (f.dtype, f.shape, f.stride(), f.device)  # type: ignore[attr-defined]
            elif tf in _SCALARS:
                key += (tf, f)
            else:
                _extend(key, f)


def metadata_key(args: Sequence[object], kwargs: Mapping[str, object]) -> tuple | None:
    """A hashable key of everything unchecked validation and case selection read, or None when an argument is
    of a kind the key does not describe (then validate in full).

    One flat tuple: with keyword arguments, the tuple of their names first (no other item is a tuple of strs),
    then the items of each positional argument in order, then those of each keyword value. The common kinds (plain
    tensors, plain scalars, caches, prepared weights) are described inline here, with no call per argument."""
    key: list[object] = []
    if kwargs:
        key.append(tuple(kwargs))
        args = (*args, *kwargs.values())
    try:
        for v in args:
            tv = type(v)
            if tv is _Tensor:
                key += (v.dtype, v.shape, v.stride(), v.device)  # type: ignore[attr-defined]
            elif tv in _SCALARS:
                key += (tv, v)
            elif tv in _TOKENED:
                tok = v._memo_token  # type: ignore[attr-defined]
                key.append(_token_of(v) if tok is None else tok)  # type: ignore[arg-type]
            else:
                get = _FIELDS.get(tv)
                if get is None:  # a tensor subclass, or unkeyable
                    _extend(key, v)
                    continue
                key.append(tv)  # a cache or metadata dataclass: its fields, as _extend appends them
                for f in get(v):
                    tf = type(f)
                    if tf is _Tensor:
                        key += (f.dtype, f.shape, f.stride(), f.device)  # type: ignore[attr-defined]
                    elif tf in _SCALARS:
                        key += (tf, f)
                    else:
                        _extend(key, f)
    except _Unkeyable:
        return None
    return tuple(key)


def split_key(args: Sequence[object], kwargs: Mapping[str, object]) -> tuple[tuple, list[torch.Tensor]] | None:
    """(metadata_key's items with each plain tensor replaced by its type, which no other item is, and the plain
    tensors in order), or None when an argument is of another kind than plain tensors, plain scalars, caches and
    prepared weights (then metadata_key alone)."""
    key: list[object] = []
    tensors: list[torch.Tensor] = []
    if kwargs:
        key.append(tuple(kwargs))
        args = (*args, *kwargs.values())
    for v in args:
        tv = type(v)
        if tv is _Tensor:
            key.append(_Tensor)
            tensors.append(v)  # type: ignore[arg-type]
        elif tv in _SCALARS:
            key += (tv, v)
        elif tv in _TOKENED:
            tok = v._memo_token  # type: ignore[attr-defined]
            if tok is None:
                try:
                    tok = _token_of(v)  # type: ignore[arg-type]
                except _Unkeyable:
                    return None
            key.append(tok)
        else:
            return None
    return tuple(key), tensors


def _tensor_guards() -> Callable[..., Any] | None:
    """Dynamo's C++ tensor metadata check, where this torch has it (a private API: without it, or if its signature
    changes, the fast path keys plain tensors in Python alone)."""
    try:
        from torch._C._dynamo.guards import TensorGuards
    except ImportError:  # pragma: no cover  (another torch)
        return None
    return TensorGuards  # type: ignore[no-any-return]


GUARDS_PER_KEY = 4  # tensor metadata variants kept per split key (the latest first)


class FastPath:
    """A bound op's validated calls -> the kernel each ran. A call is found by its argument metadata in one of two
    forms of the same facts: its plain tensors' metadata checked in C++ against the calls that passed with the same
    other arguments (Dynamo's TensorGuards: dtype, device, shape, strides, and stricter: Python type, requires_grad,
    the dispatch keys in force; ~0.4 us for six tensors against ~2.4 us to key them in Python), else the Python
    key (metadata_key). A miss in the first form only sends the call on to the second."""

    def __init__(self) -> None:
        self._kernels: dict[tuple, Callable[..., Any]] = {}
        self._guarded: dict[tuple, tuple[tuple[Any, Callable[..., Any]], ...]] = {}
        self._guards = _tensor_guards()

    def find(self, args: Sequence[object], kwargs: Mapping[str, object]) -> Callable[..., Any] | None:
        """The kernel of an earlier call that passed with this metadata, or None (then validate and choose)."""
        split = None if self._guards is None else split_key(args, kwargs)
        if split is not None:
            for guard, kernel in self._guarded.get(split[0], ()):
                if guard.check(*split[1]):
                    return kernel
        key = metadata_key(args, kwargs)
        kernel = None if key is None else self._kernels.get(key)
        if kernel is not None and split is not None and len(self._guarded.get(split[0], ())) < GUARDS_PER_KEY:
            # next time found in C++; a key whose guards are all taken keeps them (metadata cycling through more
            # variants than GUARDS_PER_KEY would otherwise build a guard on every call)
            self._guard(split, kernel)
        return kernel

    def remember(self, args: Sequence[object], kwargs: Mapping[str, object], kernel: Callable[..., Any]) -> None:
        """Keep `kernel` for this metadata; only ever called with a call that passed validation."""
        key = metadata_key(args, kwargs)
        if key is not None:
            bounded.put(self._kernels, key, kernel)
        split = None if self._guards is None else split_key(args, kwargs)
        if split is not None:
            self._guard(split, kernel)

    def _guard(self, split: tuple[tuple, list[torch.Tensor]], kernel: Callable[..., Any]) -> None:
        """Check these tensors' metadata in C++ from now on (the newest first, GUARDS_PER_KEY a split key)."""
        key, tensors = split
        try:
            guard = self._guards(*tensors, dynamic_dims_sizes=[list(t.shape) for t in tensors],  # type: ignore[misc]
                                 dynamic_dims_strides=[list(t.stride()) for t in tensors])
        except Exception:  # noqa: BLE001  (another torch's TensorGuards: from now on the Python key alone)
            self._guards = None
            return
        bounded.put(self._guarded, key, ((guard, kernel), *self._guarded.get(key, ())[:GUARDS_PER_KEY - 1]))

    def __len__(self) -> int:
        return len(self._kernels)
