"""The wheel ships every package of the source tree: pyproject's explicit package list names each folder with an
__init__.py under dsv4hal/ and platforms/."""

from __future__ import annotations

from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[2]


def test_every_source_package_is_in_the_wheel_list() -> None:
    """A package folder missing from [tool.setuptools] packages would be left out of the wheel."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    by_dir = {Path(d): name for name, d in config["package-dir"].items()}
    found = set()
    for init in sorted((ROOT / "dsv4hal").rglob("__init__.py")):
        found.add(".".join(init.parent.relative_to(ROOT).parts))
    for folder, name in by_dir.items():
        for init in sorted((ROOT / folder).rglob("__init__.py")):
            found.add(".".join((name, *init.parent.relative_to(ROOT / folder).parts)))
    assert sorted(found - listed) == []
    assert "dsv4hal.distributed.backends" in found  # the walk reaches nested packages
