"""The per-platform images (docker/): structure of each Dockerfile, the entry point's behaviour (run here with a
stand-in `dsv4hal` on PATH), and hadolint when it is installed. No docker engine is needed."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    tomllib = None

DOCKER = ROOT / "docker"
ENTRYPOINT = DOCKER / "entrypoint.sh"
ENTRYPOINT_IN_IMAGE = "/usr/local/bin/dsv4hal-entrypoint"

# image -> (extra, platform)
IMAGES = {
    "cuda-sm90": ("cuda-sm90", "cuda_sm90"),
    "cuda-sm100": ("cuda-sm100", "cuda_sm100"),
    "rocm": ("rocm", "rocm"),
}


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, with continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    buf = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not buf and (not line or line.startswith("#")):
            continue
        if buf and line.startswith("#"):  # a comment inside a continued instruction
            continue
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        buf += line
        word, _, rest = buf.partition(" ")
        out.append((word.upper(), rest.strip()))
        buf = ""
    assert not buf, f"{path.name}: dangling line continuation"
    return out


def commands(run_args: str) -> list[list[str]]:
    """The simple commands of a RUN's shell line, split at &&, ||, ; and |, each as its words."""
    lex = shlex.shlex(run_args, posix=True, punctuation_chars=";&|")
    lex.whitespace_split = True
    cmds: list[list[str]] = [[]]
    for tok in lex:
        if tok and set(tok) <= set(";&|"):
            cmds.append([])
        else:
            cmds[-1].append(tok)
    return [c for c in cmds if c]


def pip_installs(ins: list[tuple[str, str]]) -> list[tuple[int, list[str]]]:
    """(instruction index, arguments) of every `pip install` in a RUN."""
    found = []
    for i, (word, args) in enumerate(ins):
        if word != "RUN":
            continue
        for toks in commands(args):
            for j in range(len(toks) - 1):
                if toks[j:j + 2] == ["pip", "install"]:
                    found.append((i, toks[j + 2:]))
                    break
    return found


def env_of(ins: list[tuple[str, str]]) -> dict[str, str]:
    env: dict[str, str] = {}
    for word, args in ins:
        if word == "ENV":
            for tok in shlex.split(args):
                key, sep, value = tok.partition("=")
                assert sep, f"ENV {args!r}: use the KEY=value form"
                env[key] = value
    return env


def pyproject() -> dict:
    if tomllib is None:
        pytest.skip("tomllib needs Python 3.11")
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


@pytest.fixture(params=sorted(IMAGES), ids=sorted(IMAGES))
def image(request: pytest.FixtureRequest) -> str:
    return request.param


def test_dockerfile_exists_and_base_is_pinned(image: str) -> None:
    """Each image's Dockerfile exists with one FROM pinned to a tag."""
    path = DOCKER / f"Dockerfile.{image}"
    assert path.is_file(), path
    froms = [args for word, args in instructions(path) if word == "FROM"]
    assert len(froms) == 1, froms
    ref = froms[0].split()[0]
    name, _, tag = ref.rpartition(":")
    assert name and tag and tag != "latest" and "$" not in ref, f"FROM {ref}: pin a tag"
    expected = {"cuda-sm90": "nvidia/cuda", "cuda-sm100": "nvidia/cuda", "rocm": "rocm/pytorch"}[image]
    assert name == expected, ref
    if name == "nvidia/cuda":
        assert re.fullmatch(r"13\.\d+\.\d+-devel-ubuntu24\.04", tag), tag


def test_installs_dsv4hal_with_its_own_extra(image: str) -> None:
    """Each image pip-installs the project with its own optional extra."""
    extra, _ = IMAGES[image]
    assert extra in pyproject()["project"]["optional-dependencies"]
    ins = instructions(DOCKER / f"Dockerfile.{image}")
    installs = pip_installs(ins)
    assert installs, "no pip install"
    project = [(i, a) for i, a in installs if any(re.fullmatch(r"\./?\[[^\]]*\]|\.", t) for t in a)]
    assert len(project) == 1, f"one install of the project expected: {installs}"
    _, args = project[0]
    targets = [t for t in args if t.startswith((".", "./"))]
    assert targets in ([f".[{extra}]"], [f"./[{extra}]"]), targets
    for _, a in installs:
        assert "--no-cache-dir" in a, a
    # The project and its sources are copied in before that install.
    copies = " ".join(args for word, args in ins if word == "COPY")
    for needed in ("pyproject.toml", "dsv4hal", "platforms"):
        assert needed in copies, needed
    if image.startswith("cuda"):
        # torch is pinned (sgl-flash-mla needs torch>=2.14.1) and installed before the extra resolves.
        first_torch = next(i for i, a in installs if any(t.startswith("torch==") for t in a))
        assert first_torch < project[0][0]
        assert any(t.startswith("torch==") for t in args)


def test_apt_and_shell_hygiene(image: str) -> None:
    """RUN steps follow apt and shell hygiene and the image sets a WORKDIR."""
    ins = instructions(DOCKER / f"Dockerfile.{image}")
    words = [w for w, _ in ins]
    assert "WORKDIR" in words
    for word, args in ins:
        if word != "RUN":
            continue
        assert not re.search(r"(^|&&|;)\s*cd\s", args), f"use WORKDIR, not cd: {args}"
        if "apt-get install" in args:
            assert "--no-install-recommends" in args and "rm -rf /var/lib/apt/lists/*" in args, args
        if "|" in args.replace("||", ""):
            assert any(w == "SHELL" and "pipefail" in a for w, a in ins[:ins.index((word, args))]), args


def test_non_root_numeric_user_after_installs(image: str) -> None:
    """Each image ends as a numeric non-root USER set after the installs."""
    ins = instructions(DOCKER / f"Dockerfile.{image}")
    users = [(i, args) for i, (word, args) in enumerate(ins) if word == "USER"]
    assert users, "no USER"
    last_i, last = users[-1]
    m = re.fullmatch(r"(\d+)(?::(\d+))?", last)
    assert m, f"USER {last}: use a numeric uid"
    assert int(m.group(1)) != 0 and (m.group(2) is None or int(m.group(2)) != 0), last
    runs = [i for i, (word, _) in enumerate(ins) if word == "RUN"]
    assert runs and max(runs) < last_i, "every RUN (installs, user creation) comes before the final USER"
    creates = [args for word, args in ins if word == "RUN" and "useradd" in args]
    assert creates and f"--uid {m.group(1)}" in creates[0], creates


def test_cuda_images_build_the_native_glue_for_the_runtime_user(image: str) -> None:
    """The CUDA images build dsv4hal's C++ call glue for FlashMLA (kernels/native_glue.py) with the glue required, after
    dsv4hal is installed, into TORCH_EXTENSIONS_DIR, and hand that folder to the runtime user (torch writes its lock
    and build file there on load); ROCm has no FlashMLA and builds nothing."""
    ins = instructions(DOCKER / f"Dockerfile.{image}")
    builds = [i for i, (word, args) in enumerate(ins) if word == "RUN" and "native_glue" in args]
    if image == "rocm":
        assert not builds
        return
    assert len(builds) == 1, builds
    run = ins[builds[0]][1]
    assert run.startswith("DSV4HAL_NATIVE_GLUE=1 ") and "FLASHMLA_DECODE" in run
    installs = [i for i, toks in pip_installs(ins) if any(t.startswith("./[") for t in toks)]
    assert installs and max(installs) < builds[0], "the glue is built after dsv4hal is installed"
    folder = env_of(ins).get("TORCH_EXTENSIONS_DIR")
    assert folder, "TORCH_EXTENSIONS_DIR not set: the build would land in root's home"
    assert [i for i, (word, args) in enumerate(ins[:builds[0]]) if word == "ENV" and "TORCH_EXTENSIONS_DIR" in args]
    owners = [args for word, args in ins if word == "RUN" and f"chown -R 10001:10001 {folder}" in args]
    assert owners, f"{folder} is not handed to uid 10001"
    extra = IMAGES[image][0]
    assert any(d.startswith("ninja") for d in pyproject()["project"]["optional-dependencies"][extra])


def test_entrypoint_and_default_platform(image: str) -> None:
    """Each image's ENTRYPOINT is the shared script and its default platform is a registered one."""
    _, platform = IMAGES[image]
    assert platform in pyproject()["project"]["entry-points"]["dsv4hal.platforms"]
    ins = instructions(DOCKER / f"Dockerfile.{image}")
    entry = [args for word, args in ins if word == "ENTRYPOINT"]
    assert entry and json.loads(entry[-1]) == [ENTRYPOINT_IN_IMAGE], entry
    copies = [shlex.split(args) for word, args in ins if word == "COPY"]
    assert any(c[-2:] == ["docker/entrypoint.sh", ENTRYPOINT_IN_IMAGE] for c in copies), copies
    env = env_of(ins)
    assert env.get("DSV4HAL_PLATFORM") == platform, env
    assert env.get("DSV4HAL_OUT") == "/out", env


def test_entrypoint_script_text() -> None:
    """The entrypoint script is strict bash that runs info then conformance."""
    assert ENTRYPOINT.is_file()
    text = ENTRYPOINT.read_text()
    assert text.splitlines()[0] in ("#!/usr/bin/env bash", "#!/bin/bash")
    assert re.search(r"^set -euo pipefail$", text, re.M)
    assert re.search(r"^\s*dsv4hal info\b", text, re.M)
    assert re.search(r"dsv4hal conformance --platform\b", text)
    assert 'exec dsv4hal "$@"' in text
    assert ENTRYPOINT.stat().st_mode & stat.S_IXUSR, "docker/entrypoint.sh should be executable"
    bash = shutil.which("bash")
    if bash:
        r = subprocess.run([bash, "-n", str(ENTRYPOINT)], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr


@pytest.fixture
def fake_dsv4hal(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """An environment whose `dsv4hal` only records its arguments (one line per call) in a log."""
    if not shutil.which("bash"):
        pytest.skip("bash is not installed")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    log = tmp_path / "calls.log"
    stub = bindir / "dsv4hal"
    stub.write_text(f'#!/usr/bin/env bash\necho "$*" >> {shlex.quote(str(log))}\nexit "${{FAKE_RC:-0}}"\n')
    stub.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DSV4HAL_")}
    env["PATH"] = f"{bindir}{os.pathsep}{env.get('PATH', '')}"
    env["HOME"] = str(tmp_path)
    return env, log


def run_entrypoint(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(ENTRYPOINT), *args], env=env, capture_output=True, text=True, timeout=30)


def test_entrypoint_runs_info_then_conformance(fake_dsv4hal: tuple[dict[str, str], Path], tmp_path: Path) -> None:
    """The entrypoint runs dsv4hal info then conformance into DSV4HAL_OUT."""
    env, log = fake_dsv4hal
    out = tmp_path / "reports" / "h200"
    r = run_entrypoint({**env, "DSV4HAL_PLATFORM": "cuda_sm90", "DSV4HAL_OUT": str(out)})
    assert r.returncode == 0, r.stderr
    assert out.is_dir()
    assert log.read_text().splitlines() == [
        "info",
        f"conformance --platform cuda_sm90 --json {out}/conformance.json --markdown {out}/conformance.md",
    ]


def test_entrypoint_passes_conformance_status_and_survives_info(
        fake_dsv4hal: tuple[dict[str, str], Path], tmp_path: Path) -> None:
    """The entrypoint exits with conformance's status after running info."""
    env, log = fake_dsv4hal
    r = run_entrypoint({**env, "DSV4HAL_PLATFORM": "rocm", "DSV4HAL_OUT": str(tmp_path / "o"), "FAKE_RC": "1"})
    assert r.returncode == 1
    assert [line.split()[0] for line in log.read_text().splitlines()] == ["info", "conformance"]


def test_entrypoint_passes_arguments_through(fake_dsv4hal: tuple[dict[str, str], Path]) -> None:
    """Arguments given to the entrypoint run that dsv4hal command verbatim."""
    env, log = fake_dsv4hal
    r = run_entrypoint({**env, "DSV4HAL_PLATFORM": "cuda_sm100"}, "info", "--json", "a b")
    assert r.returncode == 0, r.stderr
    assert log.read_text().splitlines() == ["info --json a b"]


def test_entrypoint_without_platform_fails_clearly(fake_dsv4hal: tuple[dict[str, str], Path]) -> None:
    """The entrypoint without DSV4HAL_PLATFORM fails naming it and runs nothing."""
    env, log = fake_dsv4hal
    r = run_entrypoint(env)
    assert r.returncode != 0
    assert "DSV4HAL_PLATFORM" in r.stderr
    assert not log.exists()


def test_entrypoint_unwritable_out(fake_dsv4hal: tuple[dict[str, str], Path], tmp_path: Path) -> None:
    """The entrypoint exits 2 naming an unwritable DSV4HAL_OUT and runs nothing."""
    env, log = fake_dsv4hal
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    r = run_entrypoint({**env, "DSV4HAL_PLATFORM": "rocm", "DSV4HAL_OUT": str(blocker / "out")})
    assert r.returncode == 2 and "cannot write" in r.stderr, r.stderr
    assert not log.exists()


@pytest.mark.skipif(shutil.which("hadolint") is None,
                    reason="hadolint is not on PATH (.ci/lint-dockerfiles.sh installs it)")
def test_hadolint_passes(image: str) -> None:
    """Each Dockerfile passes hadolint at warning level."""
    cmd = ["hadolint", "--no-color", "--failure-threshold", "warning", str(DOCKER / f"Dockerfile.{image}")]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
