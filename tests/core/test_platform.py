"""select_platform(), bound ops, import cost, and a third-party plugin found through entry points."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
import torch
from conftest import fake, run_cli, run_py

import dsv4hal
from dsv4hal.errors import BadOverrideError, InvalidArgumentError, PlatformNotFoundError


def test_import_is_free_and_does_not_touch_cuda() -> None:
    """Importing dsv4hal loads neither torch nor triton. On a CPU machine selection then binds the references and
    loads nothing more (on a GPU machine it binds, and so imports, the GPU's kernels)."""
    r = run_py(textwrap.dedent("""
        import sys
        import dsv4hal
        assert 'triton' not in sys.modules and 'torch' not in sys.modules, sorted(sys.modules)
        p = dsv4hal.select_platform()
        import torch
        print(p.name, 'triton' in sys.modules, torch.cuda.is_initialized())
    """))
    assert r.returncode == 0, r.stderr
    name, triton_loaded, cuda_initialised = r.stdout.split()
    if not torch.cuda.is_available():
        assert (name, triton_loaded, cuda_initialised) == ("cpu", "False", "False")
    else:  # the GPU's platform (whose bound kernels may import Triton: that is their use)
        assert name.startswith(("cuda_", "rocm")), name


def test_select_platform_binds_ops_and_caches_per_case() -> None:
    """select_platform binds every op and caches one decision per new case."""
    p = dsv4hal.select_platform(info=fake("cpu"))
    assert p.name == "cpu" and set(p.default_decisions) == set(dsv4hal.OP_NAMES)
    scores = torch.randn(2, 700)
    lengths = torch.tensor([3, 700], dtype=torch.int32)
    before = len(p.ops.indexer_topk.dispatcher)  # the default case is decided at selection time
    raw, pages = p.ops.indexer_topk(scores, lengths, 512)
    p.ops.indexer_topk(scores, lengths, 512)
    assert pages is None and raw[0, :4].tolist() == [0, 1, 2, -1]
    assert len(p.ops.indexer_topk.dispatcher) == before + 1
    p.ops.indexer_topk(scores, lengths, 1024)
    assert len(p.ops.indexer_topk.dispatcher) == before + 2
    with pytest.raises(InvalidArgumentError, match="'k'"):
        p.ops.indexer_topk(scores, lengths, 300)


def test_select_platform_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    """select_platform raises typed errors for an unfit platform or a bad kernel override."""
    with pytest.raises(PlatformNotFoundError, match="does not fit"):
        dsv4hal.select_platform("cuda_sm90", info=fake("cpu"))
    monkeypatch.setenv("DSV4HAL_KERNELS", "indexer_topk=warp_speed")
    with pytest.raises(BadOverrideError, match="torch_reference"):
        dsv4hal.select_platform(info=fake("cpu"))


def test_gpu_platform_on_fake_hardware_reports_reference_fallback() -> None:
    """A simulated GPU selects its platform and reports a tier for each op."""
    p = dsv4hal.select_platform(info=fake("gfx942"))
    assert p.name == "rocm" and p.info.fp8 == "e4m3fnuz"
    assert p.explain("mhc_post").chosen.tier in ("reference", "portable", "vendor")


def _third_party(site: Path, body: str) -> None:
    (site / "acme_dsv4.py").write_text(textwrap.dedent(body))
    dist = site / "acme_dsv4-1.2.3.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-dsv4\nVersion: 1.2.3\n")
    (dist / "entry_points.txt").write_text("[dsv4hal.platforms]\nacme = acme_dsv4\n")


def test_third_party_plugin_through_entry_points(tmp_path: Path) -> None:
    """A third-party plugin found through entry points registers a kernel that can be chosen."""
    _third_party(tmp_path, """
        from dsv4hal import hookimpl
        from dsv4hal.registry import KernelImpl

        def topk(scores, lengths, k, page_table=None, page_size=64):
            from dsv4hal.reference.indexer_topk import indexer_topk
            return indexer_topk(scores, lengths, k, page_table, page_size)

        @hookimpl
        def dsv4hal_register(registry):
            registry.add_kernel(KernelImpl(op="indexer_topk", name="acme_topk", target="acme_dsv4:topk",
                                           platforms=("cpu",), priority=10, tier="portable"))
    """)
    r = run_cli("explain", "indexer_topk", "--json", "--simulate", "cpu", env={"PYTHONPATH": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["chosen"] == "acme_topk"
    assert {c["name"]: c["plugin"] for c in d["candidates"]}["acme_topk"] == "acme"
    r = run_cli("info", "--json", env={"PYTHONPATH": str(tmp_path)})
    assert {"name": "acme", "version": "acme-dsv4 1.2.3"} in json.loads(r.stdout)["plugins"]
    r = run_cli("explain", "indexer_topk", "--json", "--simulate", "cpu", env={"PYTHONPATH": str(tmp_path),
                                                                              "DSV4HAL_DISABLE_PLUGINS": "acme"})
    assert json.loads(r.stdout)["chosen"] == "torch_reference"


def test_broken_third_party_plugin_warns_or_fails_strict(tmp_path: Path) -> None:
    """A broken third-party plugin warns, or fails the command under DSV4HAL_STRICT."""
    _third_party(tmp_path, "raise ImportError('acme needs libacme.so')\n")
    r = run_cli("info", "--json", env={"PYTHONPATH": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    assert "libacme.so" in json.loads(r.stdout)["plugin_errors"]["acme"]
    assert "PluginWarning" in r.stderr
    r = run_cli("info", env={"PYTHONPATH": str(tmp_path), "DSV4HAL_STRICT": "1"})
    assert r.returncode == 2 and "libacme.so" in r.stderr and "DSV4HAL_DISABLE_PLUGINS=acme" in r.stderr
