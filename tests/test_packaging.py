"""Project hygiene a new user meets: license, type hints shipped, changelog, the README's op list, extras checked."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import dsv4hal

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parents[1]


def test_license_and_typed_package() -> None:
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert meta["project"]["license"] == "Apache-2.0"
    assert "Apache License" in (ROOT / "LICENSE").read_text() and "Version 2.0" in (ROOT / "LICENSE").read_text()
    assert (ROOT / "dsv4hal" / "py.typed").is_file()
    assert "py.typed" in meta["tool"]["setuptools"]["package-data"]["dsv4hal"]
    for dockerfile in (ROOT / "docker").glob("Dockerfile.*"):  # the wheel build needs its license file
        assert re.search(r"^COPY .*\bLICENSE\b", dockerfile.read_text(), re.M), dockerfile.name
    assert (ROOT / "CHANGELOG.md").read_text().startswith("# Changelog")


def test_readme_lists_every_op() -> None:
    readme = (ROOT / "README.md").read_text()
    ops_line = readme[readme.index("Ops: `"):readme.index("(`dsv4hal.OP_NAMES`")]
    assert re.findall(r"`([a-z_0-9]+)`", ops_line) == list(dsv4hal.OP_NAMES)


def test_every_extra_has_a_torch_line_in_ci() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    script = (ROOT / ".ci" / "extras-dry-run.sh").read_text()
    assert "bash .ci/extras-dry-run.sh" in (ROOT / ".ci" / "run").read_text()
    for extra in extras:
        assert f"[{extra}]=" in script, f"extra {extra} has no torch version in .ci/extras-dry-run.sh"
        assert f"'.[{extra}]'" in (ROOT / "README.md").read_text() or extra in ("triton", "plot", "test"), extra
