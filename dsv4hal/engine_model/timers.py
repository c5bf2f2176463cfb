"""Per-op wall-clock timers the model's forward pass reports to: `Timer` sums seconds and calls per op name
(synchronising the GPU around each op), `NullTimer` records nothing (CUDA-graph capture, full-speed runs)."""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager

import torch


class Timer:
    def __init__(self, device: torch.device) -> None:
        self.device, self.seconds, self.calls = device, defaultdict(float), defaultdict(int)

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        yield
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        self.seconds[name] += time.perf_counter() - t0
        self.calls[name] += 1


class NullTimer:
    """No synchronisation, nothing recorded: inside CUDA-graph capture and for full-speed runs."""

    def __call__(self, name: str) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()


OpTimer = Timer | NullTimer  # what DemoModel.forward reports each op call to
