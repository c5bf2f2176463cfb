"""Typed hardware identity and its detection.

Detection never initialises CUDA or HIP: it asks nvidia-smi, reads the ROCm KFD topology in sysfs,
and looks for libraries with importlib.util.find_spec (which does not import them). Only when the
caller's process has already initialised CUDA does it read torch's device properties.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from types import MappingProxyType


class Vendor(str, Enum):
    NVIDIA = "nvidia"
    AMD = "amd"
    CPU = "cpu"


# Architecture -> (vendor, features). SM120 (consumer Blackwell) is deliberately not in the SM100
# family: it lacks tcgen05/TMEM, so SM100 kernels do not run there.
ARCHS: Mapping[str, tuple[Vendor, frozenset[str]]] = MappingProxyType({
    "cpu": (Vendor.CPU, frozenset()),
    "sm80": (Vendor.NVIDIA, frozenset({"bf16", "cp.async"})),
    "sm89": (Vendor.NVIDIA, frozenset({"bf16", "cp.async", "fp8"})),
    "sm90": (Vendor.NVIDIA, frozenset({"bf16", "fp8", "wgmma", "tma", "sm90a"})),
    "sm100": (Vendor.NVIDIA, frozenset({"bf16", "fp8", "fp4", "tma", "tcgen05", "sm100f"})),
    "sm103": (Vendor.NVIDIA, frozenset({"bf16", "fp8", "fp4", "tma", "tcgen05", "sm100f"})),
    "sm110": (Vendor.NVIDIA, frozenset({"bf16", "fp8", "fp4", "tma", "tcgen05"})),
    "sm120": (Vendor.NVIDIA, frozenset({"bf16", "fp8", "fp4", "tma"})),
    "sm121": (Vendor.NVIDIA, frozenset({"bf16", "fp8", "fp4", "tma"})),
    "gfx90a": (Vendor.AMD, frozenset({"bf16", "mfma"})),
    "gfx942": (Vendor.AMD, frozenset({"bf16", "fp8", "mfma"})),
    "gfx950": (Vendor.AMD, frozenset({"bf16", "fp8", "fp4", "mfma"})),
})

# Multiprocessor counts of common parts, used when CUDA is not initialised (nvidia-smi has none).
_SM_COUNT_BY_NAME = {"H100": 132, "H200": 132, "H20": 78, "H800": 132, "B200": 148, "B300": 148, "GB200": 152,
                     "MI300X": 304, "MI325X": 304, "MI355X": 256, "MI350X": 256}


def _check_arch(arch: object) -> None:
    if not isinstance(arch, str) or arch not in ARCHS:
        from dsv4hal.errors import UnknownArchError

        raise UnknownArchError(f"unknown arch {arch!r}", remedy=f"use one of: {', '.join(ARCHS)}")


def fp8_flavor_for(arch: str) -> str:
    """gfx942 (MI300) implements the FNUZ FP8 variant; everything else the OCP e4m3fn."""
    return "e4m3fnuz" if arch == "gfx942" else "e4m3fn"


@dataclass(frozen=True)
class PlatformInfo:
    """What the machine is. Selection is a pure function of this (plus op, case and overrides)."""

    vendor: Vendor
    arch: str
    device_name: str = ""
    sm_count: int = 0
    fp8: str = "e4m3fn"
    features: frozenset[str] = frozenset()
    # library (import name or torch-op namespace) -> version string; absent means not installed
    libraries: Mapping[str, str] = field(default_factory=dict)
    device_count: int = 0
    detected_by: str = "none"
    notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _check_arch(self.arch)

    @property
    def is_gpu(self) -> bool:
        return self.vendor is not Vendor.CPU

    def has(self, library: str) -> bool:
        return library in self.libraries

    def summary(self) -> str:
        dev = f" {self.device_name}" if self.device_name else ""
        return f"{self.vendor.value}/{self.arch}{dev} (fp8 {self.fp8}, detected by {self.detected_by})"

    def to_json(self) -> dict[str, object]:
        return {
            "vendor": self.vendor.value, "arch": self.arch, "device_name": self.device_name,
            "sm_count": self.sm_count, "fp8": self.fp8, "features": sorted(self.features),
            "libraries": dict(sorted(self.libraries.items())), "device_count": self.device_count,
            "detected_by": self.detected_by, "notes": list(self.notes),
        }


def simulated(arch: str, *, libraries: Mapping[str, str] | None = None, device_name: str = "",
              sm_count: int | None = None, extra_features: Iterable[str] = ()) -> PlatformInfo:
    """A PlatformInfo for hardware that is not here (tests, `dsv4hal info --simulate`)."""
    _check_arch(arch)
    vendor, feats = ARCHS[arch]
    return PlatformInfo(
        vendor=vendor, arch=arch, device_name=device_name or f"simulated {arch}",
        sm_count=sm_count if sm_count is not None else (0 if vendor is Vendor.CPU else 132),
        fp8=fp8_flavor_for(arch), features=feats | frozenset(extra_features), libraries=dict(libraries or {}),
        device_count=0 if vendor is Vendor.CPU else 1, detected_by="simulated",
    )


def _sm_count_from_name(name: str) -> int:
    for key, n in _SM_COUNT_BY_NAME.items():
        if key in name.replace(" ", ""):
            return n
    return 0


def _detect_nvidia() -> tuple[str, str, int, int, str] | None:
    """(arch, name, sm_count, device_count, how) from nvidia-smi, or None."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run([smi, "--query-gpu=name,compute_cap", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    rows = [r.split(",") for r in out.strip().splitlines() if "," in r]
    if not rows:
        return None
    name, cap = rows[0][0].strip(), rows[0][1].strip()
    major, _, minor = cap.partition(".")
    arch = f"sm{int(major)}{int(minor or 0)}"
    return arch, name, _sm_count_from_name(name), len(rows), "nvidia-smi"


def _detect_amd() -> tuple[str, str, int, int, str] | None:
    """(arch, name, cu_count, device_count, how) from the KFD topology in sysfs, or None."""
    nodes = Path("/sys/class/kfd/kfd/topology/nodes")
    if not nodes.is_dir():
        return None
    gpus = []
    for props in sorted(nodes.glob("*/properties")):
        kv = dict(line.split(None, 1) for line in props.read_text().splitlines() if " " in line)
        ver = int(kv.get("gfx_target_version", "0").strip() or 0)
        if ver == 0:
            continue  # a CPU node
        major, minor, step = ver // 10000, (ver // 100) % 100, ver % 100
        simd = int(kv.get("simd_count", "0")) // max(int(kv.get("simd_per_cu", "4")), 1)
        gpus.append((f"gfx{major}{minor:x}{step:x}", simd))
    if not gpus:
        return None
    arch, cus = gpus[0]
    return arch, f"AMD {arch}", cus, len(gpus), "sysfs-kfd"


def _cuda_properties_if_initialised() -> tuple[str, int] | None:
    """Device name and multiprocessor count, only if this process already initialised CUDA."""
    import sys

    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return None
    p = torch.cuda.get_device_properties(torch.cuda.current_device())
    return p.name, p.multi_processor_count


def version_before(version: str, minimum: tuple[int, int, int]) -> bool:
    """Whether a library's version string (as PlatformInfo.libraries holds it: "2.5.0", "1.0.0.post1", "2.5.0+cu13")
    names a release older than `minimum`; an unparsable or partial version is not judged older."""
    parts = []
    for piece in version.split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return len(parts) == 3 and tuple(parts) < minimum


def library_versions(names: Iterable[str]) -> dict[str, str]:
    """Which of these importable modules exist, with their distribution version, without importing them."""
    found: dict[str, str] = {}
    dists = importlib.metadata.packages_distributions()
    for name in sorted(set(names)):
        top = name.split(".")[0]
        try:
            spec = importlib.util.find_spec(top)
        except (ImportError, ValueError):
            spec = None
        if spec is None:
            continue
        version = "unknown"
        for dist in dists.get(top, []) or [top]:
            try:
                version = importlib.metadata.version(dist)
                break
            except importlib.metadata.PackageNotFoundError:
                continue
        found[name] = version
    return found


# Library behaviour set by an environment variable, recorded at detection as a library key (name: library,
# variable, value) so that selection stays a function of the PlatformInfo (a simulated machine lists the key).
ENV_CAPABILITIES: dict[str, tuple[str, str, str]] = {
    # aiter's MXFP4 MoE runs FP8 activations (and the SwiGLU clamp) for every batch size only with the bound at 0
    "aiter-fp8-moe-all-tokens": ("aiter", "AITER_BF16_FP8_MOE_BOUND", "0"),
}


def cpu_view(info: PlatformInfo) -> PlatformInfo:
    """The machine as a CPU platform sees it: its tensors live on the CPU whatever accelerator the host has, so
    kernels are judged as on a CPU-only host (Triton only under its interpreter, strict mode's GPU rule not in
    play), with the same libraries."""
    if not info.is_gpu:
        return info
    return dataclasses.replace(info, vendor=Vendor.CPU, arch="cpu", device_name="cpu", sm_count=0, fp8="e4m3fn",
                               features=frozenset(), device_count=0, notes=(*info.notes, (
                                   f"the CPU platform on a host with {info.arch} ({info.device_name or 'a GPU'}): "
                                   "its ops run on the CPU")))


def detect(probe_libraries: Iterable[str] = ()) -> PlatformInfo:
    """Detect the first accelerator (or the CPU) and which of `probe_libraries` are installed."""
    notes: list[str] = []
    sim = os.environ.get("DSV4HAL_SIMULATE")
    libs = library_versions(set(probe_libraries) | {"torch", "triton"})
    if os.environ.get("TRITON_INTERPRET") == "1" and "triton" in libs:
        libs["triton-interpreter"] = libs["triton"]
    for key, (library, variable, value) in ENV_CAPABILITIES.items():
        if library in libs and os.environ.get(variable) == value:
            libs[key] = libs[library]
    if sim:
        info = simulated(sim, libraries=libs)
        return dataclasses.replace(info, notes=(f"DSV4HAL_SIMULATE={sim}: no hardware was probed",))
    for probe in (_detect_nvidia, _detect_amd):
        found = probe()
        if found is None:
            continue
        arch, name, sms, count, how = found
        if arch not in ARCHS:
            notes.append(f"{how} reported {arch}, which dsv4hal does not know; treating the machine as CPU-only")
            break
        props = _cuda_properties_if_initialised()
        if props is not None:
            name, sms = props
        elif sms == 0:
            notes.append("multiprocessor count unknown until CUDA is initialised")
        vendor, feats = ARCHS[arch]
        return PlatformInfo(vendor=vendor, arch=arch, device_name=name, sm_count=sms, fp8=fp8_flavor_for(arch),
                            features=feats, libraries=libs, device_count=count, detected_by=how,
                            notes=tuple(notes))
    notes.append("no GPU found (no nvidia-smi answer, no KFD GPU node)")
    return PlatformInfo(vendor=Vendor.CPU, arch="cpu", device_name="cpu", fp8="e4m3fn", features=frozenset(),
                        libraries=libs, detected_by="fallback", notes=tuple(notes))
