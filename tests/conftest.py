"""Shared fixtures: fake hardware and registries built from plugin modules written in the test."""

from __future__ import annotations

import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

# Triton kernels run under the interpreter where there is no GPU; it is read when kernels are defined.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# One torch thread a pytest-xdist worker: the workers already fill the cores (-n auto), and more threads only contend
if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)

import dsv4hal  # noqa: E402
from dsv4hal.hardware import simulated  # noqa: E402
from dsv4hal.plugins import build_registry  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
# Where a test runs Triton kernels: the GPU, else the interpreter on the CPU (tensors must be on it)
TRITON_DEVICE = torch.device("cuda" if torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"
                             else "cpu")
# A test whose vendor stand-in (a fake GEMM, Marlin op, DeepGEMM call) keeps its tensors on the CPU: the Triton glue
# around it then runs only under the interpreter (on a GPU host it would be handed CPU tensors). The vendor kernels
# themselves are checked by the GPU conformance catalog.
on_the_cpu = pytest.mark.skipif(TRITON_DEVICE.type != "cpu",
                                reason="CPU tensors through Triton kernels: the interpreter's job (TRITON_INTERPRET=1)")


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("DSV4HAL_PLATFORM", "DSV4HAL_KERNELS", "DSV4HAL_DISABLE_PLUGINS", "DSV4HAL_STRICT",
                "DSV4HAL_SIMULATE", "DSV4HAL_LOCK", "DSV4HAL_LOCK_MISMATCH"):
        monkeypatch.delenv(var, raising=False)


def plugin_module(name: str, register) -> types.ModuleType:  # noqa: ANN001
    """A plugin module whose dsv4hal_register hook is `register`."""
    from dsv4hal.hookspecs import hookimpl

    mod = types.ModuleType(name)
    mod.dsv4hal_register = hookimpl(register)  # type: ignore[attr-defined]
    return mod


def registry_with(*extra: tuple[str, types.ModuleType], disabled: tuple[str, ...] = (), strict: bool = False):  # noqa: ANN201
    return build_registry(disabled=disabled, strict=strict, extra_modules=extra)


ALL_LIBS = {"torch": "2", "triton": "3", "flash_mla": "1.0.0", "deep_gemm": "2", "flashinfer": "0.5", "aiter": "1",
            "vllm_moe": "0.24"}


def first_conformance_case(platform, op: str) -> dict:  # noqa: ANN001
    """The arguments of an op's first CPU conformance case, in eager mode, weights prepared on `platform`."""
    import dataclasses

    from dsv4hal.conformance.runner import _prepared, load_catalog

    spec, build = next((s, b) for s, b in load_catalog([op]) if not s.gpu_only)
    spec = dataclasses.replace(spec, params={**spec.params, "mode": "eager"})
    return _prepared(platform.ops[op], build(spec, torch.device("cpu"), torch.Generator().manual_seed(0))).args


def fake(arch: str, **libs: str):  # noqa: ANN201
    return simulated(arch, libraries={"torch": "2", **libs})


def run_py(code: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    e = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=e, cwd=cwd, timeout=120)


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return run_py(f"import sys; from dsv4hal.cli import main; sys.exit(main({list(args)!r}))", env)


@pytest.fixture(scope="module")
def reference_checked() -> dsv4hal.Platform:
    """The machine's platform, checked, with every op's torch reference forced."""
    from op_args import REFERENCE, forced

    return forced(REFERENCE, checked=True)


@pytest.fixture(scope="module")
def reference_unchecked() -> dsv4hal.Platform:
    """The machine's platform, unchecked, with every op's torch reference forced."""
    from op_args import REFERENCE, forced

    return forced(REFERENCE, checked=False)


@pytest.fixture(scope="module")
def triton_checked() -> dsv4hal.Platform:
    """The machine's platform, checked, with the portable Triton kernels forced where an op has one."""
    pytest.importorskip("triton")
    from op_args import TRITON, forced

    return forced(TRITON, checked=True)


def collective_error(fn) -> str:  # noqa: ANN001
    """What a collective call raised, as a multi-rank test compares it: "<error class> <failing ranks> <has a
    remedy> <message>" for a CollectiveError (ExpertParallelError, TensorParallelError), "no error" otherwise."""
    from dsv4hal.errors import CollectiveError

    try:
        fn()
    except CollectiveError as exc:
        return f"{type(exc).__name__} {sorted(exc.failures)} {exc.remedy is not None} {exc.message}"
    return "no error"
