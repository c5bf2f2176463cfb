"""What a conformance run is made of and hands back: cells (op, implementation, case, mode, status), the report
of a run, and the argument copies graph cells need (a capture's static inputs, fresh inputs written into them).
Shared by the runner, the decode-step cells, the report and the shape-sequence run, so that the decode-step cells
need not import the runner that runs them."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

import torch

STATUSES = ("pass", "fail", "production-unreachable", "blocked", "deferred", "not-run")
DESELECTED = "not selected in this run (--ops / --cases)"  # the detail of a not-run cell left out by the caller


@dataclass
class Cell:
    op: str
    implementation: str
    case: str
    mode: str
    compress_ratio: int | None
    platform: str
    status: str
    max_error: float | None = None
    tolerance: dict[str, Any] | None = None
    detail: str = ""
    seconds: float = 0.0


@dataclass
class Report:
    platform: str
    info: dict[str, Any]
    cells: list[Cell] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        return {s: sum(c.status == s for c in self.cells) for s in STATUSES}

    @property
    def ok(self) -> bool:
        return not any(c.status == "fail" for c in self.cells)

    def to_json(self) -> dict[str, Any]:
        """The report as JSON. Cells left out by --ops / --cases are counted in the summary (as not-run) and in
        "deselected", not listed: a run of one op would otherwise write ~800 cells that say nothing."""
        def clean(c: Cell) -> dict[str, Any]:
            d = dataclasses.asdict(c)
            if d["max_error"] is not None and not math.isfinite(d["max_error"]):
                d["max_error"] = str(d["max_error"])
            return d
        kept = [c for c in self.cells if c.detail != DESELECTED]
        return {"platform": self.platform, "info": self.info, "summary": self.counts(),
                "deselected": len(self.cells) - len(kept), "cells": [clean(c) for c in kept]}


def copy_into(static: Any, new: Any) -> None:
    """Write `new` into the buffers of `static` in place (graph replay with fresh inputs)."""
    if isinstance(static, torch.Tensor):
        if static.shape != new.shape or static.dtype != new.dtype:
            raise ValueError(f"replay input {tuple(new.shape)} {new.dtype} does not match the captured "
                             f"{tuple(static.shape)} {static.dtype}")
        static.copy_(new)
    elif dataclasses.is_dataclass(static):
        for f in dataclasses.fields(static):
            if f.init:  # derived fields (cached views) follow their source
                copy_into(getattr(static, f.name), getattr(new, f.name))
    elif isinstance(static, dict):
        for k in static:
            copy_into(static[k], new[k])
    elif isinstance(static, (tuple, list)):
        for a, b in zip(static, new, strict=True):
            copy_into(a, b)
    elif type(static) is type(new) and hasattr(static, "__dict__") and not callable(static):
        # a library's plain object (e.g. triton_kernels' layout descriptors): equal when its fields are
        copy_into(vars(static), vars(new))
    elif static != new:
        raise ValueError(f"non-tensor argument differs between capture and replay: {static!r} != {new!r}")


def clone_args(x: Any) -> Any:
    if isinstance(x, torch.Tensor):  # pinned host memory stays pinned (an offloaded pool's kernel maps it)
        return x.clone().pin_memory() if x.device.type == "cpu" and x.is_pinned() else x.clone()
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return dataclasses.replace(x, **{f.name: clone_args(getattr(x, f.name)) for f in dataclasses.fields(x)
                                         if f.init})
    if isinstance(x, dict):
        return {k: clone_args(v) for k, v in x.items()}
    if isinstance(x, (tuple, list)):  # a pair of caches, a step's per-token inputs
        return type(x)(clone_args(v) for v in x)
    return x
