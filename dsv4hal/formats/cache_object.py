"""What the paged cache dataclasses share: a slot for the host-side key of their metadata.

A bound op's fast path (dsv4hal.dispatch.fast_path) describes each argument by its metadata. A cache is the same
object call after call, so its description is built once and kept on the object as one token (a cache is then one item
of the key instead of its data tensor's dtype, shape, strides and device and its scalar fields: ~0.6 us less a cache a
call on the CI machine). Assigning any field forgets the token. In-place changes of the data tensor's own
metadata (Tensor.resize_, .set_, .data = ...) are not seen: a cache's buffer is fixed for its life, as its FlashMLA
view already assumes (V4PagedCache.flashmla_view); give a new buffer a new cache object."""

from __future__ import annotations

from typing import Any


class CacheObject:
    """Mixin for the cache dataclasses: they declare `_memo_token` (init=False, compare=False, default None)."""

    _memo_token: object | None

    def __setattr__(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)
        if name[0] != "_":  # a field changed: the token described the old one
            object.__setattr__(self, "_memo_token", None)
