"""The shipped text files state facts, not the project's history: no numbered work sessions, no internal tracker
numbers, no dates in prose and no "not kept" notes. A measured figure cites its file under bench/results/ instead."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from conftest import ROOT

SUFFIXES = {".py", ".md", ".toml", ".sh", ".cfg", ".cpp"}
# the changelog is history by design; this file names them
EXCLUDED = {"CHANGELOG.md", "tests/core/test_no_narration.py"}
_ORDINAL = (r"(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|[a-z]+teenth"
            r"|twentieth|thirtieth|(?:twenty|thirty)[- ]?[a-z]+|\d+(?:st|nd|rd|th))")
PATTERNS = {
    "numbered session": re.compile(rf"\b{_ORDINAL} sessions?\b|\bsessions? #?\d+\b"
                                   r"|\b(?:earlier|last|previous|prior|next) sessions?\b", re.IGNORECASE),
    "tracker number": re.compile(r"\bissues? #?\d+", re.IGNORECASE),
    # an ISO timestamp in a data literal ("2026-01-01T00:00:00") is data, not prose
    "date": re.compile(r"(?<![\d-])20\d\d-(?:0[1-9]|1[0-2])-(?:0[1-9]|[12]\d|3[01])(?![\dT])"),
    "not kept": re.compile(r"\bnot kept\b", re.IGNORECASE),
}


def _shipped_text_files(root: Path) -> list[str]:
    """Tracked source, docs, config, shell scripts and Dockerfiles; skips the test outside a git checkout."""
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as e:
        pytest.skip(f"git ls-files could not run ({e}): not a git checkout")
    if out.returncode != 0:
        pytest.skip(f"not a git checkout: {out.stderr.strip()}")
    files = []
    for name in filter(None, out.stdout.split("\0")):
        path = Path(name)
        if name in EXCLUDED or path.suffix == ".json":
            continue
        if path.suffix in SUFFIXES or path.name.startswith("Dockerfile") or _is_script(root / path):
            files.append(name)
    return files


def _is_script(path: Path) -> bool:
    """A suffixless executable script (e.g. .ci/run) starts with a shebang."""
    if path.suffix or not path.is_file():
        return False
    with path.open("rb") as f:
        return f.read(2) == b"#!"


def test_shipped_text_states_facts_not_history() -> None:
    """No shipped text file narrates history: numbered sessions, tracker numbers, prose dates or "not kept"."""
    hits = []
    for name in _shipped_text_files(ROOT):
        path = ROOT / name
        if not path.is_file():  # deleted in the work tree but still tracked
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            hits += [f"{name}:{number}: {kind}: {line.strip()[:100]}"
                     for kind, pattern in PATTERNS.items() if pattern.search(line)]
    assert not hits, ("history in shipped files: state the fact and cite the results file under bench/results/ that "
                      "backs a number instead (bench/results/README.md lists them):\n" + "\n".join(hits))
