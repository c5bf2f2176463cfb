"""Project hygiene a new user meets: license, type hints shipped, changelog, the README's op list, extras checked,
what the sdist ships."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

import dsv4hal

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parents[2]


def test_license_and_typed_package() -> None:
    """The package declares Apache-2.0, ships LICENSE and py.typed, and images copy LICENSE."""
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert meta["project"]["license"] == "Apache-2.0"
    assert "Apache License" in (ROOT / "LICENSE").read_text() and "Version 2.0" in (ROOT / "LICENSE").read_text()
    assert (ROOT / "dsv4hal" / "py.typed").is_file()
    assert "py.typed" in meta["tool"]["setuptools"]["package-data"]["dsv4hal"]
    for dockerfile in (ROOT / "docker").glob("Dockerfile.*"):  # the wheel build needs its license file
        assert re.search(r"^COPY .*\bLICENSE\b", dockerfile.read_text(), re.M), dockerfile.name
    assert (ROOT / "CHANGELOG.md").read_text().startswith("# Changelog")


def test_readme_lists_every_op() -> None:
    """The README's op list is the block generated from the catalog, naming every op in order."""
    from dsv4hal.ops import gen_stub

    readme = (ROOT / "README.md").read_text()
    assert readme == gen_stub.render_readme(readme), f"the README's op list is stale: run `{gen_stub.COMMAND}`"
    ops_line = readme[readme.index("Ops: `"):readme.index("(`dsv4hal.OP_NAMES`")]
    assert re.findall(r"`([a-z_0-9]+)`", ops_line) == list(dsv4hal.OP_NAMES)


def test_every_extra_has_a_torch_line_in_ci() -> None:
    """Every optional extra has a torch line in the CI dry run and an install line in README."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    script = (ROOT / ".ci" / "extras-dry-run.sh").read_text()
    assert "bash .ci/extras-dry-run.sh" in (ROOT / ".ci" / "run").read_text()
    for extra in extras:
        assert f"[{extra}]=" in script, f"extra {extra} has no torch version in .ci/extras-dry-run.sh"
        assert f"'.[{extra}]'" in (ROOT / "README.md").read_text() or extra in ("triton", "plot", "test"), extra


def test_sdist_ships_the_installable_package_and_no_tests(tmp_path: Path) -> None:
    """The sdist built from the checkout's files holds every module and package-data file of dsv4hal and the platform
    plugins, and no tests/ (they read examples/, docker/, .ci/ and CHANGELOG.md, which stay in the repository)."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, text=True)
    if listed.returncode != 0:
        pytest.skip("not a git checkout: the sdist is built from a clone's files")
    files = [f for f in listed.stdout.split("\0") if f and (ROOT / f).is_file()]
    src = tmp_path / "src"  # a copy, so the build's egg-info lands there and not in the checkout
    for f in files:
        (src / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / f, src / f)
    build = "from setuptools.build_meta import build_sdist; print(build_sdist('dist'))"  # offline: no isolation
    r = subprocess.run([sys.executable, "-c", build], cwd=src, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    with tarfile.open(src / "dist" / r.stdout.split()[-1]) as tar:
        shipped = {name.split("/", 1)[1] for name in tar.getnames() if "/" in name}
        pkg_info = tar.extractfile(f"{tar.getnames()[0].split('/')[0]}/PKG-INFO").read().decode()  # type: ignore[union-attr]
    assert not [f for f in shipped if f.startswith("tests/")], sorted(f for f in shipped if f.startswith("tests/"))
    needed = [f for f in files if f.startswith(("dsv4hal/", "platforms/")) and f.endswith((".py", ".cpp", "py.typed"))]
    assert needed and not set(needed) - shipped, sorted(set(needed) - shipped)
    assert re.search(r"^Requires-Dist: numpy", pkg_info, re.M), \
        "numpy is a dependency (tests/core/test_import_surface.py)"


def test_readme_runs_the_quick_subset_and_ci_the_whole_suite_under_both_tritons() -> None:
    """The README's test line leaves slow tests out; .ci/run runs every test (no -m) with xdist twice, the second time
    under triton 3.7.1, stopping at the first failure; the markers are registered under --strict-markers."""
    pytest_cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert "--strict-markers" in pytest_cfg["addopts"]
    assert {m.split(":")[0] for m in pytest_cfg["markers"]} == {"slow", "gpu"}
    readme = (ROOT / "README.md").read_text()
    assert re.search(r"^python3 -m pip install torch==2\.13\.0 -e '\.\[test\]' && python3 -m pytest -n auto "
                     r"-m \"not slow\"$", readme, re.M)
    ci = (ROOT / ".ci" / "run").read_text()
    assert "set -euo pipefail" in ci and "triton==3.7.1" in ci
    runs = re.findall(r"^\S*python\S* -m pytest (.*)$", ci, re.M)
    assert len(runs) == 2 and all("-n auto" in r and "-m " not in r for r in runs), runs
