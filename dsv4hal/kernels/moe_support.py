"""What MoE kernel bindings check of a moe_experts case alike: the weight format, NVIDIA FP8, the shapes."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dsv4hal.formats.experts import ExpertWeights
    from dsv4hal.hardware import PlatformInfo
    from dsv4hal.registry import KernelImpl


def expert_case_reasons(case: Mapping[str, object], info: PlatformInfo, *, kernel: str, fmt: str, fmt_reason: str,
                        shape_reasons: Callable[[int, int], list[str]], fp8_check: bool = True) -> list[str]:
    """Reasons `kernel` cannot take these expert weights: not `fmt` (fmt_reason says why), e4m3fnuz (NVIDIA
    kernels: fp8_check), or shape_reasons(H, I)."""
    reasons = []
    if case.get("format") != fmt:
        reasons.append(f"{fmt_reason}; these are {case.get('format')}")
    if fp8_check and (case.get("fp8") == "e4m3fnuz" or info.fp8 == "e4m3fnuz"):
        reasons.append(f"e4m3fnuz (FNUZ FP8) is a ROCm format; {kernel} takes NVIDIA's e4m3fn")
    h, i = case.get("H"), case.get("I")
    if isinstance(h, int) and isinstance(i, int):
        reasons.extend(shape_reasons(h, i))
    return reasons


def multiple_of_reasons(what: str, hidden: int, intermediate: int, multiple: int, why: str) -> list[str]:
    """'<what> needs H and I multiples of <multiple> (<why>); got ...' for the sizes that are not (empty: fine)."""
    bad = [f"{n}={v}" for n, v in (("H", hidden), ("I", intermediate)) if v % multiple]
    return [f"{what} needs H and I multiples of {multiple} ({why}); got " + ", ".join(bad)] if bad else []


def check_prepare(weights: ExpertWeights, name: str, fmt: str,
                  shape_reasons: Callable[[int, int], list[str]]) -> None:
    """prepare_weights' refusal (ValueError naming the kernel) of weights it cannot lay out."""
    if weights.format != fmt:
        raise ValueError(f"{name} takes {fmt} expert weights; got {weights.format!r}: prepare them for another "
                         "moe_experts kernel (platform.ops.moe_experts.prepare_weights chooses one)")
    reasons = shape_reasons(weights.hidden, weights.intermediate)
    if reasons:
        raise ValueError(f"{name}: " + "; ".join(reasons))


def moe_kernel(name: str, module: str, platform: str, priority: int, requires: tuple[str, ...], layout: str,
               supports: Callable[..., list[str]], description: str,
               priority_when: tuple[tuple[Mapping[str, object], int], ...] = (), priority_why: str = ""
               ) -> KernelImpl:
    """The KernelImpl of a vendor moe_experts binding whose module defines moe_experts and prepare_weights."""
    from dsv4hal.registry import KernelImpl

    kw: dict[str, Any] = dict(platforms=(platform,), priority=priority, tier="vendor", requires=requires,
                              priority_when=priority_when, priority_why=priority_why)
    return KernelImpl(op="moe_experts", name=name, target=f"{module}:moe_experts",
                      prepare=f"{module}:prepare_weights", supports=supports, layout=layout,
                      description=description, **kw)
