"""CUDA-graph capture as every GPU path here does it (conformance graph cells, the decode-step check, the
benchmarks, the demo): warm the callable up once on a side stream, so compilation, autotuning, allocator pools
and lazy scheduler plans happen outside capture, then capture it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def capture(fn: Callable[[], Any], *, repeat: int = 1) -> tuple[torch.cuda.CUDAGraph, Any]:
    """(graph, result of the last captured call): one warm-up call on a side stream, then `repeat` calls
    captured in one graph. The result's tensors are the graph's output buffers, refreshed by each replay."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    ret = None
    with torch.cuda.graph(graph):
        for _ in range(repeat):
            ret = fn()
    return graph, ret
