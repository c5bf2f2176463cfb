"""Reading back what a plot drew: the figure a plotting function saved, and its bars and lines, so a test checks the
data behind a PNG rather than its bytes."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def drawn(monkeypatch: pytest.MonkeyPatch, draw: Callable[[str], None], out: Path) -> Any:
    """Run draw(str(out)) and return the one figure it saved there (the file written is a PNG)."""
    from matplotlib.figure import Figure

    saved: list[Figure] = []
    original = Figure.savefig

    def savefig(fig: Figure, *args: Any, **kwargs: Any) -> None:
        saved.append(fig)
        original(fig, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", savefig)
    draw(str(out))
    assert out.read_bytes()[:8] == PNG_MAGIC and len(saved) == 1
    return saved[0]


def bars(ax: Any) -> dict[str, list[float]]:
    """Each labelled bar series of a panel: its heights in drawing order."""
    return {c.get_label(): [round(p.get_height(), 6) for p in c] for c in ax.containers}


def lines(ax: Any) -> dict[str, tuple[list[float], list[float]]]:
    """Each labelled line of a panel: its x and y data."""
    return {ln.get_label(): ([float(x) for x in ln.get_xdata()], [round(float(y), 6) for y in ln.get_ydata()])
            for ln in ax.lines if not ln.get_label().startswith("_")}


def tick_labels(ax: Any) -> list[str]:
    """A panel's x tick labels as drawn."""
    return [t.get_text() for t in ax.get_xticklabels()]
