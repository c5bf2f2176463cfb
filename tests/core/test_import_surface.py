"""What a user's first lines meet: `import dsv4hal` lists its API without loading it, type checkers see the real
types behind the lazy names, and selecting a platform warns nothing."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import ROOT, run_py

import dsv4hal

tomllib = pytest.importorskip("tomllib")  # Python 3.11+


def _type_checking_imports() -> dict[str, str]:
    """name -> module of the imports under `if TYPE_CHECKING:` in dsv4hal/__init__.py."""
    tree = ast.parse((ROOT / "dsv4hal" / "__init__.py").read_text())
    found: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for imp in node.body:
                assert isinstance(imp, ast.ImportFrom) and imp.module, ast.dump(imp)
                for alias in imp.names:
                    assert alias.asname == alias.name, f"{alias.name}: re-export as itself (`import X as X`)"
                    mod = f"{imp.module}.{alias.name}" if alias.name == "errors" else imp.module
                    found[alias.name] = mod
    return found


def test_typed_reexports_match_the_lazy_names() -> None:
    """Every lazily loaded name has a TYPE_CHECKING import of the same object from the same module, and no other."""
    assert _type_checking_imports() == dsv4hal._LAZY


def test_dir_lists_the_public_api_without_importing_torch_or_triton() -> None:
    """dir(dsv4hal) shows every public name right after `import dsv4hal`, which imports no torch, triton or CUDA."""
    code = "import dsv4hal, json; print(json.dumps(dir(dsv4hal)))"
    r = subprocess.run([sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True, timeout=120,
                       cwd=ROOT)
    assert r.returncode == 0, r.stderr
    listed = json.loads(r.stdout)
    assert set(dsv4hal.__all__) <= set(listed), set(dsv4hal.__all__) - set(listed)
    imported = re.findall(r"^import time:\s+\d+ \|\s+\d+ \|\s+(\S+)", r.stderr, re.M)
    assert "dsv4hal" in imported
    assert not [m for m in imported if m.split(".")[0] in ("torch", "triton", "numpy") or "cuda" in m], imported


def test_selecting_a_platform_warns_nothing() -> None:
    """import dsv4hal, select_platform() and an op call run clean under `-W error` (torch's NumPy warning included)."""
    r = run_py(textwrap.dedent("""
        import dsv4hal, torch
        p = dsv4hal.select_platform("cpu")
        p.ops.indexer_topk(torch.randn(1, 600), torch.tensor([600], dtype=torch.int32), 512)
    """), env={"PYTHONWARNINGS": "error"})
    assert r.returncode == 0 and not r.stderr, r.stderr


def test_numpy_is_a_dependency_where_torch_warns_without_it() -> None:
    """torch warns "Failed to initialize NumPy" at import when numpy is absent, so a plain install brings numpy."""
    r = run_py("import sys; sys.modules['numpy'] = None; import torch")  # None in sys.modules: numpy absent
    assert r.returncode == 0, r.stderr
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    if "Failed to initialize NumPy" in r.stderr:
        assert any(re.match(r"numpy\b", d) for d in deps), deps


# A user's program: each line must type-check, and reveal_type shows select_platform's real signature.
_GOOD = """
import dsv4hal

reveal_type(dsv4hal.select_platform)
with dsv4hal.overrides(kernels={"pack_store": "torch_reference"}):
    platform: dsv4hal.Platform = dsv4hal.select_platform("cpu")
cache = dsv4hal.V4PagedCache.empty(4, 64)
page_size: int = cache.page_size
platform.ops.pack_store(cache.data, cache.data, cache)
names: tuple[str, ...] = dsv4hal.OP_NAMES
"""
# The same calls misused: each line must be reported, so a surface that had turned into Any would fail the test.
_BAD = """
import dsv4hal

dsv4hal.select_platform(3)
dsv4hal.V4PagedCache.empty("four", 64)
dsv4hal.select_platform("cpu").ops.pack_store(None)
dsv4hal.overrides(kernel="x")
"""


def test_user_program_type_checks_against_the_lazy_api(tmp_path: Path) -> None:
    """mypy sees select_platform, ops.pack_store, V4PagedCache.empty and overrides with their real types: a correct
    program passes, each misuse is an error, and reveal_type(dsv4hal.select_platform) is a signature, not Any."""
    pytest.importorskip("mypy")
    (tmp_path / "good.py").write_text(_GOOD)
    (tmp_path / "bad.py").write_text(_BAD)
    # torch's own stubs are skipped (Any) to keep the check to dsv4hal's surface and a few seconds long
    (tmp_path / "mypy.ini").write_text("[mypy]\n[mypy-torch.*]\nfollow_imports = skip\n"
                                       "[mypy-triton.*]\nfollow_imports = skip\n")
    env = {**os.environ, "MYPYPATH": str(ROOT)}  # this checkout's dsv4hal, whatever is installed
    r = subprocess.run([sys.executable, "-m", "mypy", "--config-file", "mypy.ini", "--no-incremental",
                        "--cache-dir", os.devnull, "--no-error-summary", "good.py", "bad.py"],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    lines = r.stdout.splitlines()
    reveal = [ln for ln in lines if ln.startswith("good.py:4: note: Revealed type is")]
    assert len(reveal) == 1 and "def (" in reveal[0] and "-> dsv4hal.platform.Platform" in reveal[0], r.stdout
    assert not [ln for ln in lines if ln.startswith("good.py") and ": error:" in ln], r.stdout
    bad_lines = {int(m) for m in re.findall(r"^bad\.py:(\d+): error:", r.stdout, re.M)}
    assert bad_lines == {4, 5, 6, 7}, r.stdout + r.stderr
