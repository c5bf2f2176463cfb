"""Shared helpers for platform plugins to state which hardware they claim, with reasons."""

from __future__ import annotations

from collections.abc import Collection

from dsv4hal.hardware import PlatformInfo, Vendor


def claim_arch(info: PlatformInfo, vendor: Vendor, archs: Collection[str], why_not_others: str = "") -> list[str]:
    """Reasons `info` is not one of `archs` of `vendor` (empty when it is)."""
    reasons = []
    if info.vendor is not vendor:
        who = "NVIDIA" if vendor is Vendor.NVIDIA else vendor.value.upper()
        reasons.append(f"needs an {who} GPU ({', '.join(sorted(archs))}); this machine is "
                       f"{info.vendor.value}/{info.arch}")
    elif info.arch not in archs:
        reasons.append(f"needs arch {' or '.join(sorted(archs))}; this GPU is {info.arch}"
                       + (f" ({why_not_others})" if why_not_others else ""))
    if "torch" not in info.libraries:
        reasons.append("torch is not installed")
    return reasons
