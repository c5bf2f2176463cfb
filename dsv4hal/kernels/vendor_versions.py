"""Minimum releases of the vendor libraries, as KernelImpl.min_versions entries: one constructor per library,
holding its name in messages and where a usable release comes from. Importing this module imports no vendor code."""

from __future__ import annotations

from dsv4hal.registry import MinVersion


def deep_gemm(release: tuple[int, int, int], brings: str) -> MinVersion:
    """DeepGEMM from `release`, the first release `brings`."""
    return MinVersion("deep_gemm", release, brings, label="DeepGEMM", remedy=" (vLLM 0.24 bundles 2.5.0)")


def flashinfer(release: tuple[int, int, int], brings: str) -> MinVersion:
    return MinVersion("flashinfer", release, brings)


def sgl_flash_mla(release: tuple[int, int, int], brings: str) -> MinVersion:
    """sgl-flash-mla (import name flash_mla) from `release`."""
    return MinVersion("flash_mla", release, brings, label="sgl-flash-mla")
