"""The command line answers every mistake before any work, with exit 2 and a message naming the argument and the
remedy: numeric options out of range (one shared argparse type), unwritable outputs of tune, an unknown
torch.compile backend, an unknown plugin to disable, an unknown DSV4HAL_NATIVE_GLUE mode; and a reader of stdout
that goes away (`dsv4hal info | head -1`) ends the command quietly. Most cases run main() in-process."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, plugin_module, registry_with

import dsv4hal
from dsv4hal import cli
from dsv4hal.errors import BadOverrideError
from dsv4hal.kernels.native_glue import MODE_ENV, NativeGlueError


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    try:
        rc = cli.main(list(args))
    except SystemExit as exc:  # argparse usage errors
        rc = exc.code if isinstance(exc.code, int) else 1
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return rc, err


@pytest.mark.parametrize(("args", "needle"), [
    (("tune", "--margin", "-1"), "argument --margin: -1 is less than 0: give a number >= 0 and < 1"),
    (("tune", "--margin", "1"), "argument --margin: 1 is not less than 1: give a number >= 0 and < 1"),
    (("tune", "--margin", "nan"), "'nan' is not a finite number"),
    (("tune", "--margin", "lots"), "'lots' is not a number"),
    (("demo", "--steps", "0"), "argument --steps: 0 is less than 1: give an integer >= 1"),
    (("demo", "--batch", "0"), "argument --batch: 0 is less than 1"),
    (("demo", "--context", "-5"), "argument --context: -5 is less than 1"),
    (("demo", "--batch", "2.5"), "'2.5' is not an integer"),
    (("soak", "--context", "-3"), "argument --context: -3 is less than 2: give an integer >= 2"),
    (("soak", "--context", "1"), "argument --context: 1 is less than 2"),
    (("soak", "--minutes", "0"), "argument --minutes: 0 is not more than 0: give a number > 0"),
    (("soak", "--minutes", "-2"), "argument --minutes: -2 is less than 0"),
    (("soak", "--minutes", "inf"), "'inf' is not a finite number"),
    (("soak", "--seed", "-1"), "argument --seed: -1 is less than 0"),
    (("soak", "--seed", str(1 << 64)), "is not less than 9223372036854775808"),
])
def test_numeric_option_out_of_range_exits_2_naming_the_range(capsys: pytest.CaptureFixture[str],
                                                              args: tuple[str, ...], needle: str) -> None:
    """A nonsensical number is a usage error before the command starts, naming the option and what it takes."""
    rc, err = _run(capsys, *args)
    assert rc == 2 and needle in err, err


def test_number_type_accepts_its_bounds_and_refuses_beyond() -> None:
    """The shared argparse type admits exactly its range: low included (excluded with above), high excluded."""
    margin, steps, minutes = cli.number(float, 0, 1), cli.number(int, 1), cli.number(float, 0, above=True)
    assert margin("0") == 0.0 and margin("0.999") == 0.999 and steps("1") == 1 and minutes("0.01") == 0.01
    for parse, raw in ((margin, "1"), (margin, "-0.001"), (steps, "0"), (minutes, "0"), (minutes, "-inf")):
        with pytest.raises(argparse.ArgumentTypeError):
            parse(raw)


def test_every_numeric_option_goes_through_the_shared_type() -> None:
    """No option of any subcommand parses a number with a bare int/float (which accepts 0, negatives, nan)."""
    parser = cli.build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    numeric = []
    for name, sub in subparsers.choices.items():
        for action in sub._actions:
            assert action.type not in (int, float), f"{name} {action.option_strings} parses with bare {action.type}"
            if getattr(action.type, "__name__", "") in ("integer", "number"):
                numeric.append(f"{name} {action.option_strings[0]}")
    assert {"tune --margin", "demo --steps", "soak --context", "soak --minutes", "soak --seed"} <= set(numeric)


def test_tune_checks_its_outputs_before_measuring(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """`tune --out` (or --markdown) that is a folder or cannot be created is refused before any measurement."""
    import dsv4hal.tune as tune_module

    monkeypatch.setattr(tune_module, "tune", lambda *a, **k: pytest.fail("measured before checking --out"))
    blocker = tmp_path / "file"
    blocker.write_text("")
    rc, err = _run(capsys, "tune", "--platform", "cpu", "--out", str(tmp_path))
    assert rc == 2 and "is a folder" in err
    rc, err = _run(capsys, "tune", "--platform", "cpu", "--out", str(blocker / "sub" / "lock.json"))
    assert rc == 2 and "cannot create the folder" in err
    rc, err = _run(capsys, "tune", "--platform", "cpu", "--out", str(tmp_path / "ok.json"), "--markdown",
                   str(tmp_path))
    assert rc == 2 and "is a folder" in err


def test_demo_unknown_compile_backend_is_refused_before_selecting_or_prefilling(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """`demo --compile nosuchbackend` is exit 2 naming the valid backends; the platform is not even selected."""
    monkeypatch.setattr(dsv4hal, "select_platform", lambda *a, **k: pytest.fail("selected before the check"))
    rc, err = _run(capsys, "demo", "--compile", "nosuchbackend")
    assert rc == 2 and "--compile 'nosuchbackend' is not a torch.compile backend" in err and "inductor" in err


def test_demo_known_compile_backends_pass_the_check() -> None:
    """Every backend dynamo lists (debug ones included) passes; the check refuses only unknown names."""
    from dsv4hal.demo.command import check_backend

    for name in ("inductor", "eager", "aot_eager"):
        check_backend(name)


def test_disabling_an_unknown_plugin_is_refused_naming_the_installed_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    """DSV4HAL_DISABLE_PLUGINS=nosuch is a BadOverrideError naming it and every installed plugin."""
    with pytest.raises(BadOverrideError, match="names 'nosuch': no such plugin") as err:
        registry_with(disabled=("cpu", "nosuch"))
    assert err.value.remedy and "cpu" in err.value.remedy and "portable_triton" in err.value.remedy
    monkeypatch.setenv("DSV4HAL_DISABLE_PLUGINS", "nosuch")
    with pytest.raises(BadOverrideError, match="nosuch"):
        dsv4hal.select_platform("cpu")


def test_disabling_a_plugin_that_is_present_still_works() -> None:
    """Built-ins, entry points and directly registered plugins are known: disabling one drops its entries."""
    def register(registry) -> None:  # noqa: ANN001
        pass

    reg = registry_with(("acme", plugin_module("acme", register)), disabled=("acme", "rocm"))
    assert "acme" not in reg.plugin_versions and "rocm" not in reg.plugin_versions and "cpu" in reg.plugin_versions


def test_unknown_native_glue_mode_is_refused_at_selection(capsys: pytest.CaptureFixture[str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """DSV4HAL_NATIVE_GLUE=2 is refused when a platform is selected (and by `dsv4hal info`), naming auto/0/1."""
    monkeypatch.setenv(MODE_ENV, "2")
    with pytest.raises(NativeGlueError, match="'2' is not one of auto, 0, 1"):
        dsv4hal.select_platform("cpu")
    rc, err = _run(capsys, "info", "--platform", "cpu")
    assert rc == 2 and "DSV4HAL_NATIVE_GLUE='2'" in err
    monkeypatch.setenv(MODE_ENV, "0")
    assert dsv4hal.select_platform("cpu").name == "cpu"


class _ClosedPipe:
    """A stdout whose reader went away."""

    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")

    def flush(self) -> None:
        raise BrokenPipeError(32, "Broken pipe")


def test_stdout_reader_going_away_ends_the_command_quietly(capsys: pytest.CaptureFixture[str],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A BrokenPipeError on stdout is exit 141 (as SIGPIPE) with nothing on stderr."""
    monkeypatch.setattr(sys, "stdout", _ClosedPipe())
    assert cli.main(["info", "--platform", "cpu"]) == 141
    assert capsys.readouterr().err == ""


def test_info_into_a_closed_pipe_has_no_traceback() -> None:
    """`dsv4hal info | head -0` in a real process: no BrokenPipeError traceback, at exit either."""
    proc = subprocess.Popen([sys.executable, "-m", "dsv4hal.cli", "info", "--platform", "cpu"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # before the command writes anything: its first flush meets a closed pipe
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141 and "Traceback" not in err and "BrokenPipe" not in err, err
