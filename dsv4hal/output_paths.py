"""Output paths checked before a long run: the command-line tools (dsv4hal.cli, the demo, tune, soak) refuse a
path they could not write before measuring anything, not after."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

from dsv4hal.errors import Dsv4HalError


def check_output(path: str | None, *, plot: bool = False) -> None:
    """The output's folder exists or can be made and is writable, the path is not a folder, and a plot's
    matplotlib is installed. None: nothing to check."""
    if not path:
        return
    p = Path(path)
    if p.is_dir():
        raise Dsv4HalError(f"output path {path!r} is a folder", remedy="give a file name inside it")
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise Dsv4HalError(f"cannot create the folder of {path!r}: {exc.strerror or exc}",
                           remedy="choose a writable location") from None
    if not os.access(p.parent, os.W_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise Dsv4HalError(f"cannot write {path!r}", remedy="choose a writable location")
    if plot and importlib.util.find_spec("matplotlib") is None:
        raise Dsv4HalError(f"--plot {path!r} needs matplotlib, which is not installed",
                           remedy="python3 -m pip install 'dsv4hal[plot]' (or matplotlib), or drop --plot")


def write_json(path: Path, data: object) -> None:
    """Write `data` as indented JSON, replacing the file whole: a reader never sees half of it, and an interrupted
    write leaves the previous file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str) + "\n")
    os.replace(tmp, path)
