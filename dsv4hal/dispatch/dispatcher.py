"""Which kernel runs a case: one table per bound op, case -> Choice (the implementation, its loaded kernel function
and the decision that chose it), each case decided once and kept (dsv4hal.dispatch.bounded's size policy).

A registration names its kernel by a "module:function" target; this is the one place a bound op turns that string
into the function it calls (plugins.load_target), and the Choice keeps the function next to the decision."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

from dsv4hal.dispatch import bounded
from dsv4hal.plugins import load_target
from dsv4hal.registry import KernelImpl
from dsv4hal.selection import Decision, case_summary, select_kernel

if TYPE_CHECKING:
    from dsv4hal.ops.signatures import OpDefinition
    from dsv4hal.platform import Platform

log = logging.getLogger(__name__)
CALL = "call"  # the tag of a key made from a call's arguments by the op's case key


class Choice(NamedTuple):
    """What a case runs. `kernel` is the function `impl.target` names (for prepared weights: that function called
    on the weights' payload, with the function as its __wrapped__); `decision` says why, None when prepared
    weights fixed the implementation beforehand."""

    impl: KernelImpl
    kernel: Callable[..., Any]
    decision: Decision | None


class Dispatcher:
    """One op's cases on one platform -> Choice, in one table with one size limit. Keys: (None, the case's items)
    for a selected kernel; (implementation, the case's items) for a kernel fixed by prepared weights; (CALL, the
    op's case key) for a call of an op that defines one (OpDefinition.key), the same Choice as its case's."""

    def __init__(self, platform: Platform, definition: OpDefinition) -> None:
        self.platform, self.op = platform, definition.name
        self._case: Callable[..., Mapping[str, object]] = definition.case
        self._case_key: Callable[..., tuple] | None = definition.key
        self._table: dict[tuple, Choice] = {}

    def choose_for_call(self, args: tuple, kwargs: Mapping[str, object]) -> Choice:
        """The Choice of a call's case. An op with a case key is looked up by it: cheaper than building the case
        (sparse_attention_decode: ~1 us less), and the case is computed from it, so they cannot disagree."""
        case_key = self._case_key
        if case_key is None:
            return self.choose(self._case(*args, **kwargs))
        key = (CALL, case_key(*args, **kwargs))
        hit = self._table.get(key)
        return hit if hit is not None else bounded.put(self._table, key, self.choose(self._case(*args, **kwargs)))

    def choose(self, case: Mapping[str, object]) -> Choice:
        """The selected kernel for a case, decided on its first call. A case function builds its dict in one key
        order, so the items in order are the key (no sort per call); a mapping given in another order only makes a
        second entry for the same decision."""
        key = (None, tuple(case.items()))
        hit = self._table.get(key)
        return hit if hit is not None else bounded.put(self._table, key, self._select(case))

    def choose_fixed(self, implementation: str, case: Mapping[str, object],
                     resolve: Callable[[Mapping[str, object]], Choice]) -> Choice:
        """The kernel of an implementation fixed beforehand (prepared weights) for a case; `resolve` checks that it
        runs the case and loads it, on the case's first call (raising is never remembered)."""
        key = (implementation, tuple(case.items()))
        hit = self._table.get(key)
        return hit if hit is not None else bounded.put(self._table, key, resolve(case))

    def _select(self, case: Mapping[str, object]) -> Choice:
        p = self.platform
        while True:  # a kernel whose target does not import is marked broken; select again without it
            d = select_kernel(p.registry, self.op, case, p.info, p.name, p.overrides, p.lock)
            kernel = load_target(p.registry, d.chosen)
            if kernel is not None:
                break
        log.debug("%s on %s: %s (%s) for [%s]", d.op, d.platform, d.chosen.name, d.source, case_summary(d.case))
        return Choice(d.chosen, kernel, d)

    def __len__(self) -> int:
        return len(self._table)

    def choices(self) -> list[Choice]:
        """The cases decided so far, oldest first."""
        return list(self._table.values())
