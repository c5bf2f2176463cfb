"""bench/results/README.md against the files it cites: every file named exists, and every measured time in its tables
(a column in us other than the floor, which is derived from bytes and the measured bandwidth) is a value of the
section's files, rounded as printed; every ratio is its row's time over its floor."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

from conftest import ROOT

RESULTS = ROOT / "bench" / "results"
NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def _numbers(x: object) -> Iterator[float]:
    if isinstance(x, bool):
        return
    if isinstance(x, (int, float)):
        yield float(x)
    elif isinstance(x, dict):
        for v in x.values():
            yield from _numbers(v)
    elif isinstance(x, list):
        for v in x:
            yield from _numbers(v)


def _sections() -> list[tuple[str, list[Path], list[list[str]], list[str]]]:
    """(heading, files cited in the section, table rows, table header) per table of the README."""
    out = []
    for block in re.split(r"^## ", (RESULTS / "README.md").read_text(), flags=re.M)[1:]:
        heading = block.splitlines()[0]
        files = [RESULTS / f for f in re.findall(r"`((?:h100|h200|cpu)/[\w.-]+\.(?:json|png|txt|md))`", block)]
        table = [line for line in block.splitlines() if line.startswith("|")]
        if table:
            header = [c.strip() for c in table[0].strip("|").split("|")]
            rows = [[c.strip() for c in r.strip("|").split("|")] for r in table[2:]]
            out.append((heading, files, rows, header))
        else:
            out.append((heading, files, [], []))
    return out


def _printed(cell: str) -> tuple[float, int] | None:
    m = NUMBER.match(cell.replace(",", ""))
    if not m:
        return None
    text = m.group()
    return float(text), len(text.partition(".")[2])


def test_every_file_the_results_readme_cites_exists() -> None:
    """Each result file the README names is in bench/results."""
    cited = [f for _, files, _, _ in _sections() for f in files]
    assert len(cited) > 10
    assert [str(f.relative_to(RESULTS)) for f in cited if not f.exists()] == []


def test_results_readme_times_are_values_of_their_files() -> None:
    """Every measured time in a table's us column is one of the section's JSON values, rounded as printed."""
    checked, missing = 0, []
    for heading, files, rows, header in _sections():
        values = [v for f in files if f.suffix == ".json" for v in _numbers(json.loads(f.read_text()))]
        if not values:
            continue
        cols = [i for i, h in enumerate(header) if (h.endswith(" us") or h == "us" or h.startswith("us "))
                and h != "floor us"]
        for row in rows:
            for i in cols:
                got = _printed(row[i]) if i < len(row) else None
                if got is None:
                    continue
                x, places = got
                half = 0.5 * 10 ** -places + 1e-9
                checked += 1
                if not any(abs(v - x) <= half for v in values):
                    missing.append(f"{heading}: {header[i]} {row[i]} ({row[0]})")
    assert checked > 100 and missing == []


def test_results_readme_ratios_are_time_over_floor() -> None:
    """A ratio printed as Nx is its row's time over its floor, within the rounding of the three figures."""
    checked = 0
    for _, _, rows, header in _sections():
        if "ratio" not in header or "floor us" not in header:
            continue
        r, f = header.index("ratio"), header.index("floor us")
        t = next(i for i, h in enumerate(header) if h in ("us", "us a call"))
        for row in rows:
            m = re.match(r"(\d+(?:\.\d+)?)x", row[r])
            if not m:
                continue
            time, floor = _printed(row[t]), _printed(row[f])
            assert time and floor and floor[0] > 0, row
            ratio = float(m.group(1))
            low = (time[0] - 0.5 * 10 ** -time[1]) / (floor[0] + 0.5 * 10 ** -floor[1])
            high = (time[0] + 0.5 * 10 ** -time[1]) / (floor[0] - 0.5 * 10 ** -floor[1])
            step = 0.5 * 10 ** -len(m.group(1).partition(".")[2])
            assert low - step <= ratio <= high + step, row
            checked += 1
    assert checked > 20
