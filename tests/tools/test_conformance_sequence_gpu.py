"""On a GPU: shuffled shapes through every vendor-bound op (eager, captured, replayed) and garbage decode inputs (an
unsynchronised do_bench_cudagraph, lengths outside the index rows) leave the CUDA context alive and every result
right (dsv4hal.conformance.sequence). With FlashMLA installed, its decode is among them: the call sequence that can
fire FlashMLA's scheduler assertion (the decode timed before its inputs are written) runs clean and right. Skipped
without a GPU."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
DECODE = "sparse_attention_decode"


@pytest.fixture(scope="module")
def cells(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    report = Path(tmp_path_factory.mktemp("sequence")) / "sequence.json"
    # a process of its own: a device assertion would end the CUDA context, not just the test
    r = subprocess.run([sys.executable, "-m", "dsv4hal.conformance.sequence", "--rounds", "1", "--json", str(report)],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    return json.loads(report.read_text())["cells"]


def test_shuffled_shapes_and_garbage_inputs_keep_the_context_and_the_results(cells: list[dict[str, Any]]) -> None:
    """Shuffled shapes and garbage inputs on a GPU neither kill the CUDA context nor change results."""
    assert cells and not [c for c in cells if c["status"] == "fail"]


@pytest.mark.skipif(importlib.util.find_spec("flash_mla") is None, reason="needs FlashMLA (sgl-flash-mla)")
def test_flashmla_decode_survives_the_unordered_timing_race_and_matches_the_reference(
        cells: list[dict[str, Any]]) -> None:
    """FlashMLA's decode, timed before its inputs are written and then run eager and in graphs, stays right."""
    flashmla = [c for c in cells if c["op"] == DECODE and c["implementation"].startswith("flashmla_")]
    races = [c for c in flashmla if c["case"].startswith("race")]
    assert len(races) == 2 and {c["mode"] for c in flashmla} == {"eager", "graph"}
    assert all(c["status"] == "pass" for c in flashmla), [c for c in flashmla if c["status"] != "pass"]
