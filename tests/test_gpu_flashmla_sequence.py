"""On the GPU, the call sequence that can fire FlashMLA's scheduler assertion runs clean and
right when streams are ordered (bench/flashmla_sequence.py says why). Skipped without a GPU and FlashMLA."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest
import torch

from tests.conftest import ROOT

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available() or importlib.util.find_spec("flash_mla") is None,
                                 reason="needs a CUDA GPU with FlashMLA (sgl-flash-mla)")]


def test_flashmla_sequence_runs_and_matches_the_reference() -> None:
    """The FlashMLA shape sequence runs on a GPU and matches the reference."""
    # a process of its own: a device assertion would end the CUDA context, not just the test
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "flashmla_sequence.py")], capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert res["ok"] and len(res["eager"]) == 8
    assert res["T1024_rel_error"] <= 2e-2
