"""The one size policy of the dispatch tables (the dispatcher's cases, the fast path's argument metadata): at most
LIMIT entries; a new entry past that drops the oldest. Engines see a few shapes per op; a fuzzer sees thousands."""

from __future__ import annotations

from typing import TypeVar

K = TypeVar("K")
V = TypeVar("V")
LIMIT = 1024


def put(table: dict[K, V], key: K, value: V) -> V:
    """table[key] = value, dropping the oldest entry first when the table is full; returns value."""
    if key not in table and len(table) >= LIMIT:
        del table[next(iter(table))]
    table[key] = value
    return value
