"""Host cost of a bound call: validation memoised on tensor metadata.

Unchecked validation (every op but compress, which reads cu_seqlens on the CPU) and case selection read only
host attributes: types, dtypes, shapes, strides, devices and scalar values (and of prepared weights: the op,
kernel and platform they were made for, their case and their payload's devices). So a call whose arguments have
the same metadata as one that passed gives the same verdict and the same kernel, and the bound op skips straight to
the kernel. Only calls that passed are remembered: a bad argument is checked, and refused, every time. Checked mode
(which reads values) never uses the memo.

The key is one flat tuple built in one loop, with no Python call per argument for the common kinds (plain tensors,
plain scalars, caches, prepared weights): ~0.3 us a tensor, most of it the four metadata reads every key needs,
against ~2 us a tensor to validate. A paged cache or a PreparedWeights is one item, a token kept on the object for
its metadata (formats.cache_object; PreparedWeights is frozen), built on its first call.

Before the key, a bound op asks TensorChecks: the call's other items with the plain tensors left out (split_key),
and the tensors' metadata checked in C++ by Dynamo's TensorGuards against the last few calls that passed with those
items. On the 2-core CI machine, sparse_attention_decode (six tensors and two caches in nine arguments) then adds
~2.2 us over its kernel (~4 us through the key and its lookup, ~13 us to validate and select); moe_experts ~1.6 us
(~11 us when its prepared weights were validated every call)."""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable, Mapping, Sequence

import torch

try:  # Dynamo's tensor checks in C++ (TensorChecks below); a torch without them keys in Python only
    from torch._C._dynamo.guards import TensorGuards as _TensorGuards
except ImportError:  # pragma: no cover
    _TensorGuards = None

from dsv4hal.formats.indexer_cache import IndexerPagedCache
from dsv4hal.formats.v4_cache import V4PagedCache
from dsv4hal.ops.attention_metadata import AttentionMetadata
from dsv4hal.prepared import PreparedWeights

MAX_ENTRIES = 1024  # engines see a few shapes per op; a fuzzer sees thousands: then start over
GUARDS_PER_KEY = 4  # tensor metadata kept per split key (TensorChecks): a few batch sizes in turn

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
_tokens: dict[tuple, _Token] = {}  # metadata -> its token, so that equal objects share memo entries


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
        if len(_tokens) >= MAX_ENTRIES:  # forgetting only costs equal caches their shared entries
            _tokens.clear()
        tok = _tokens[described] = _Token()
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
    prepared weights (then metadata_key alone). The tensors' metadata is then checked in C++ (TensorChecks)."""
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


class TensorChecks:
    """A bound op's validated calls by split key: for each, the plain tensors' metadata of the last GUARDS_PER_KEY
    calls that passed, as Dynamo's TensorGuards (dtype, device, shape, strides, and stricter: Python type,
    requires_grad, the dispatch keys in force), each with its kernel. One check in C++ replaces the tensors' four
    metadata reads in Python and the hash of their items (CI machine, sparse_attention_decode: ~0.4 us for six
    tensors against ~2.4 us). A check that fails only sends the call on to metadata_key and the memo."""

    def __init__(self) -> None:
        self._by_key: dict[tuple, tuple[tuple[object, Callable[..., object]], ...]] = {}

    def find(self, key: tuple, tensors: list[torch.Tensor]) -> Callable[..., object] | None:
        for guard, fn in self._by_key.get(key, ()):
            if guard.check(*tensors):  # type: ignore[attr-defined]
                return fn
        return None

    def add(self, key: tuple, tensors: list[torch.Tensor], fn: Callable[..., object]) -> None:
        """Remember fn for these tensors' metadata (only ever called with a call that passed validation)."""
        global _TensorGuards
        if _TensorGuards is None:
            return
        try:
            guard = _TensorGuards(*tensors, dynamic_dims_sizes=[list(t.shape) for t in tensors],
                                  dynamic_dims_strides=[list(t.stride()) for t in tensors])
        except Exception:  # noqa: BLE001  (another torch's TensorGuards: from now on the Python key alone)
            _TensorGuards = None
            return
        if len(self._by_key) >= MAX_ENTRIES:
            self._by_key.clear()
        self._by_key[key] = ((guard, fn), *self._by_key.get(key, ())[:GUARDS_PER_KEY - 1])
