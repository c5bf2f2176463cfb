"""Modules stay small: every module under dsv4hal/ and platforms/ has fewer than MAX_LINES lines, or its docstring
has a line starting with "Size:" that says why its one idea needs more."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 450
PACKAGES = ("dsv4hal", "platforms")


def oversized(root: Path, packages: tuple[str, ...] = PACKAGES) -> list[str]:
    """The modules (paths relative to root) of MAX_LINES lines or more whose docstring gives no "Size:" reason."""
    found = []
    for path in sorted(p for pkg in packages for p in (root / pkg).rglob("*.py")):
        text = path.read_text()
        if len(text.splitlines()) < MAX_LINES:
            continue
        doc = ast.get_docstring(ast.parse(text, str(path))) or ""
        if not any(line.startswith("Size:") and line[len("Size:"):].strip() for line in doc.splitlines()):
            found.append(path.relative_to(root).as_posix())
    return found


def test_every_module_is_under_450_lines_or_says_why_in_its_docstring() -> None:
    """No module of dsv4hal/ or platforms/ reaches MAX_LINES lines without a "Size:" line in its docstring."""
    assert oversized(ROOT) == [], "split these modules or give a 'Size:' reason"


def test_the_size_check_reads_line_counts_and_size_reasons(tmp_path: Path) -> None:
    """A long module is reported unless its docstring has a "Size:" line with a reason; a short one never is."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    body = "x = 1\n" * MAX_LINES
    (pkg / "long.py").write_text('"""A module."""\n' + body)
    (pkg / "empty_reason.py").write_text('"""A module.\n\nSize:\n"""\n' + body)
    (pkg / "reasoned.py").write_text('"""A module.\n\nSize: one kernel family with its launch.\n"""\n' + body)
    (pkg / "short.py").write_text('"""A module."""\n' + "x = 1\n" * (MAX_LINES - 2))
    assert oversized(tmp_path, ("pkg",)) == ["pkg/empty_reason.py", "pkg/long.py"]
