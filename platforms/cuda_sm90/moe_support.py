"""What the Hopper MoE bindings check of a moe_experts case alike: the weight format, NVIDIA FP8, the shapes."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dsv4hal.hardware import PlatformInfo


def expert_case_reasons(case: Mapping[str, object], info: PlatformInfo, *, kernel: str, fmt: str, fmt_reason: str,
                        shape_reasons: Callable[[int, int], list[str]]) -> list[str]:
    """Reasons `kernel` cannot take these expert weights: not `fmt` (fmt_reason says why), e4m3fnuz, or
    shape_reasons(H, I)."""
    reasons = []
    if case.get("format") != fmt:
        reasons.append(f"{fmt_reason}; these are {case.get('format')}")
    if case.get("fp8") == "e4m3fnuz" or info.fp8 == "e4m3fnuz":
        reasons.append(f"e4m3fnuz (FNUZ FP8) is a ROCm format; {kernel} takes NVIDIA's e4m3fn")
    h, i = case.get("H"), case.get("I")
    if isinstance(h, int) and isinstance(i, int):
        reasons.extend(shape_reasons(h, i))
    return reasons
