"""The environment header of every result file (GPU, driver, CUDA, torch, Triton, Python, the vendor libraries, the
git commit and a digest of the source files), and the card a result folder is named by. Read without initialising
CUDA: the suites run in processes of their own."""

from __future__ import annotations

import hashlib
import os
import platform as pyplatform
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any


def _quiet(argv: list[str], cwd: Path | None = None) -> str | None:
    """A command's stripped stdout, or None when it is missing or fails."""
    if shutil.which(argv[0]) is None:
        return None
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=20, check=True, cwd=cwd).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return out or None


SOURCE_DIRS = ("dsv4hal", "platforms")  # the code a suite runs


def source_digest(repo: Path) -> str | None:
    """sha256 over the paths and bytes of the .py and C++ files under SOURCE_DIRS, sorted by path: which code ran,
    where a copied tree's git metadata cannot say (`python3 -c "from dsv4hal.runner.environment import
    source_digest; print(source_digest(Path('.')))"` on a checkout gives the digest to compare)."""
    files = sorted(f for d in SOURCE_DIRS for f in (repo / d).rglob("*")
                   if f.is_file() and f.suffix in (".py", ".cpp", ".h", ".cu") and "__pycache__" not in f.parts)
    if not files:
        return None
    h = hashlib.sha256()
    for f in files:
        h.update(f.relative_to(repo).as_posix().encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


def card_name(device_name: str, vendor: str) -> str:
    """The result folder of a device: h100, h200, ... from an NVIDIA name, the name's last word otherwise, cpu
    without a GPU."""
    if vendor == "cpu":
        return "cpu"
    upper = device_name.upper()
    for card in ("H200", "H100", "B200", "MI300X", "MI325X", "MI355X"):
        if card in upper:
            return card.lower()
    return (device_name.split() or ["gpu"])[-1].lower()


def environment(repo: Path) -> dict[str, Any]:
    """What a result depends on besides the code's arguments: the device, its driver, the toolkit, the libraries
    (the ones the platforms' kernels need, with their versions) and the commit of the code."""
    import torch

    from dsv4hal import __version__, hardware
    from dsv4hal.platform import load_registry

    info = hardware.detect(load_registry().requirements())
    driver = _quiet(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    commit = _quiet(["git", "rev-parse", "HEAD"], cwd=repo)
    dirty = _quiet(["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo)
    return {
        "card": card_name(info.device_name, info.vendor.value),
        "device": info.device_name, "arch": info.arch, "device_count": info.device_count,
        "driver": driver.splitlines()[0] if driver else None,
        "cuda": torch.version.cuda, "hip": getattr(torch.version, "hip", None),
        "torch": torch.__version__, "python": pyplatform.python_version(), "dsv4hal": __version__,
        "libraries": dict(info.libraries),
        "git_commit": commit, "git_dirty": bool(dirty) if commit else None, "source_sha256": source_digest(repo),
        "command_line": " ".join(sys.argv),
        # dsv4hal's own settings (a forced kernel, a lock, strict mode): they change what a suite measures
        "dsv4hal_env": {k: v for k, v in sorted(os.environ.items()) if k.startswith("DSV4HAL_")},
    }
