"""On a GPU: shuffled shapes through every vendor-bound op (eager, captured, replayed) and garbage decode inputs (an
unsynchronised do_bench_cudagraph, lengths outside the index rows) leave the CUDA context alive and every result
right (dsv4hal.conformance.sequence). Skipped without a GPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def test_shuffled_shapes_and_garbage_inputs_keep_the_context_and_the_results(tmp_path: Path) -> None:
    """Shuffled shapes and garbage inputs on a GPU neither kill the CUDA context nor change results."""
    report = tmp_path / "sequence.json"
    # a process of its own: a device assertion would end the CUDA context, not just the test
    r = subprocess.run([sys.executable, "-m", "dsv4hal.conformance.sequence", "--rounds", "1", "--json", str(report)],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    cells = json.loads(report.read_text())["cells"]
    assert cells and not [c for c in cells if c["status"] == "fail"]
