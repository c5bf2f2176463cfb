"""What the top-k kernels' tests share about running the conformance catalog through a forced kernel."""

from __future__ import annotations

from typing import Any

import torch

import dsv4hal
from dsv4hal.conformance.runner import load_catalog, run_cell

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")
GPU = torch.cuda.is_available()


def forced(name: str) -> dict[str, str]:
    return {"indexer_topk": name}


def wide_catalog(name: str) -> list[tuple[Any, Any]]:
    """The size=large cases (rows wider than 16384); B64 x 262144 takes ~40 s under the interpreter: only on a GPU."""
    return [(s, b) for s, b in load_catalog(forced(name)) if s.op == "indexer_topk" and int(s.params["s"]) > 16384
            and (GPU or int(s.params["b"]) * int(s.params["s"]) <= 8 * 65536)]


def forced_platform(name: str) -> Any:
    with dsv4hal.overrides(kernels=forced(name)):
        return dsv4hal.select_platform()


def assert_cell_passes(platform: Any, spec: Any, build: Any, name: str) -> None:
    cell = run_cell(platform, spec, build, "eager")
    assert cell.implementation == name
    assert cell.status == "pass", cell.detail
