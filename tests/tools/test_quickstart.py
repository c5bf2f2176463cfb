"""The README's quick start is examples/quickstart.py; running it here keeps it in step with the API."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import torch
from conftest import ROOT

EXAMPLE = ROOT / "examples" / "quickstart.py"


def _load():
    spec = importlib.util.spec_from_file_location("quickstart", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_quickstart_runs(capsys):
    """examples/quickstart.py runs and returns finite attention and MoE outputs."""
    res = _load().main()
    assert res["out"].shape == (2, 64, 512) and res["out"].dtype == torch.bfloat16
    assert res["lse"].shape == (2, 64) and torch.isfinite(res["lse"]).all()
    assert res["moe"].shape == (2, 256) and torch.isfinite(res["moe"].float()).all()
    assert res["moe"].float().abs().sum() > 0
    printed = capsys.readouterr().out
    assert "PreparedWeights(" in printed and "tensor(" not in printed  # repr names the payload, no dump


def test_readme_points_to_the_quickstart():
    """README points to the quickstart and every name it imports is exported."""
    readme = (ROOT / "README.md").read_text()
    assert "examples/quickstart.py" in readme
    # every name the example takes from dsv4hal is exported by the package
    import dsv4hal

    for name in ("select_platform", "V4PagedCache", "ExpertWeights", "quantize_experts", "PreparedWeights"):
        assert name in dsv4hal.__all__ and getattr(dsv4hal, name) is not None


def test_import_stays_free_of_torch():
    """import dsv4hal and reading __all__ does not import torch."""
    code = "import sys, dsv4hal; dsv4hal.__all__; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
