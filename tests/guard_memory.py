"""Guard memory around a caller's buffers, to prove a call touches nothing outside them.

Each buffer handed to the op is the middle of a larger allocation whose rest (the guard) is filled with one byte
value. `assert_confined` runs the same call twice, the guards filled with two different byte values, and asserts
that no guard byte changed (nothing written outside) and that the outputs and the buffers the op writes are the same
in both runs (nothing read from outside: a read of guard memory would carry its fill into the result).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

# Two fills whose bytes make different, finite values in every float format the ops read: 0x11 is a tiny positive
# number and 0x5C a large one in fp32, bf16, fp16 and the FP8 formats, and neither is an ordinary index.
FILLS = (0x11, 0x5C)
# Guard bytes on each side of a buffer: past the widest single access a kernel makes with a bad index (a page of
# the indexer cache is 8448 bytes, a compressor ring a few KiB), a multiple of 256 so that views stay aligned.
PAD = 1 << 16


@dataclass
class Guards:
    """The allocations made for one run: each buffer's whole block and where the buffer lies in it."""

    fill: int
    pad: int = PAD
    blocks: list[tuple[torch.Tensor, int, int]] = field(default_factory=list)

    def __call__(self, t: torch.Tensor) -> torch.Tensor:
        """A copy of `t` (same dtype, shape, strides, contents) placed in the middle of a guarded block."""
        span = _span_bytes(t)
        block = torch.full((span + 2 * self.pad,), self.fill, dtype=torch.uint8, device=t.device)
        body = block[self.pad:self.pad + span]
        flat = body.view(t.dtype)
        inner = flat.as_strided(t.shape, t.stride(), flat.storage_offset())
        inner.copy_(t)
        self.blocks.append((block, self.pad, span))
        return inner

    def changed(self) -> list[str]:
        """A line for each guard whose bytes are no longer the fill."""
        bad = []
        for i, (block, pad, span) in enumerate(self.blocks):
            for name, part in (("before", block[:pad]), ("after", block[pad + span:])):
                hit = (part != self.fill).nonzero()
                if hit.numel():
                    off = int(hit[0]) - (pad if name == "before" else 0)
                    bad.append(f"buffer {i}: {int(hit.numel())} guard bytes {name} it changed (first at offset {off})")
        return bad


def _span_bytes(t: torch.Tensor) -> int:
    """Bytes from a tensor's first element to one past its last (its strides may leave gaps)."""
    if t.numel() == 0:
        return 0
    last = sum((n - 1) * s for n, s in zip(t.shape, t.stride()) if n > 0)
    return (last + 1) * t.element_size()


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        if a.dtype.is_floating_point and a.element_size() > 1:
            return bool(torch.equal(torch.nan_to_num(a.float(), nan=0.5), torch.nan_to_num(b.float(), nan=0.5))
                        and torch.equal(a.isnan(), b.isnan()))
        return bool(torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8)))
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def assert_confined(build: Callable[[Guards], tuple[Callable[[], Any], Sequence[torch.Tensor]]],
                    fills: tuple[int, int] = FILLS) -> Any:
    """Run `build(guard)` -> (call, written) once per fill and check the call stays inside its buffers.

    `build` makes the op's arguments, passing every tensor the op reads or writes through `guard` so that it lies
    in guarded memory, and returns the call (no arguments) and the buffers the op writes in place. Returns the first
    run's result for further checks."""
    runs = []
    for fill in fills:
        guard = Guards(fill)
        call, written = build(guard)
        result = call()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        bad = guard.changed()
        assert not bad, f"wrote outside its buffers (guard fill {fill:#x}): " + "; ".join(bad)
        runs.append((result, [w.clone() for w in written]))
    (r0, w0), (r1, w1) = runs
    assert _same(r0, r1), "the result depends on the memory around the buffers (it read outside them)"
    assert _same(w0, w1), "the buffers written depend on the memory around them (it read outside them)"
    return r0
