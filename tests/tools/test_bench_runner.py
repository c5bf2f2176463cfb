"""`dsv4hal run`: the suite table, the listing on a CPU machine, and the result file a suite writes (environment
header, status, output tail), overwritten on each run."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

from dsv4hal import cli
from dsv4hal.errors import Dsv4HalError
from dsv4hal.runner import execute
from dsv4hal.runner.suites import SUITES, Suite

# A name that records a run instead of what it measures: a run or version number, a date, a log, an old/new copy
RUN_NAMES = re.compile(r"(^|[-_.])(r\d+|run\d*|v\d+|\d{4}-?\d{2}-?\d{2}|\d+|log|logs|old|new|tmp|test\d*)([-_.]|$)")


def _write_value(value: int, code: int = 0) -> tuple[str, ...]:
    return ("{python}", "-c", f"import json, sys; json.dump({{'value': {value}}}, open(sys.argv[1], 'w')); "
            f"print('line one'); print('boom {value}'); sys.exit({code})", "{json}")


def _run_cli(monkeypatch: pytest.MonkeyPatch, suites: tuple[Suite, ...], out: Path, *names: str) -> int:
    monkeypatch.setattr(execute, "SUITES", suites)
    return cli.main(["run", *names, "--out-dir", str(out), "--card", "testcard"])


def test_suite_names_are_unique_and_name_what_they_measure() -> None:
    """Every suite has its own name, made of words (no run number, date or log), and says what it measures."""
    names = [s.name for s in SUITES]
    assert len(names) == len(set(names))
    for s in SUITES:
        assert re.fullmatch(r"[a-z][a-z0-9_]*(-[a-z0-9_]+)*", s.name), s.name
        assert not RUN_NAMES.search(s.name), s.name
        assert len(s.measures) > 20 and s.timeout_s > 0 and s.tags, s.name


def test_run_name_pattern_catches_run_and_log_names() -> None:
    """The pattern the table is checked with rejects names that record a run and accepts ones that measure."""
    for bad in ("bench-attention-r1", "soak-2024-05-01", "memcheck-log", "bench-moe-old", "sweep-3"):
        assert RUN_NAMES.search(bad), bad
    for good in ("bench-moe-quick", "conformance-cuda_sm90-moe", "memcheck-index-ops", "demo-flash"):
        assert not RUN_NAMES.search(good), good


def test_suite_commands_parse_as_dsv4hal_commands() -> None:
    """Each suite that runs a dsv4hal subcommand gives arguments the command line accepts."""
    parser = cli.build_parser()
    seen = 0
    for s in SUITES:
        if s.command[1:3] == ("-m", "dsv4hal"):
            args = [a.replace("{json}", "r.json").replace("{dir}", "d").replace("{name}", s.name)
                    for a in s.command[3:]]
            assert parser.parse_args(args).cmd == args[0], s.name
            seen += 1
    assert seen >= 10


def test_suite_test_files_resolve_to_one_file_each() -> None:
    """Each test file a pytest suite names exists exactly once under tests/."""
    for s in SUITES:
        for arg in s.command:
            if arg.startswith("test_") and arg.endswith(".py"):
                assert (ROOT / execute.resolve_test_file(arg, ROOT)).is_file(), (s.name, arg)
    with pytest.raises(Dsv4HalError, match="test_no_such_file.py"):
        execute.resolve_test_file("test_no_such_file.py", ROOT)


def test_run_list_on_a_cpu_machine_names_every_suite() -> None:
    """`dsv4hal run --list` runs without a GPU and prints one line per suite."""
    r = subprocess.run([sys.executable, "-m", "dsv4hal", "run", "--list"], capture_output=True, text=True,
                       cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    assert [line.split()[0] for line in r.stdout.splitlines()] == [s.name for s in SUITES]


def test_unknown_suite_is_a_typed_error_naming_the_suites() -> None:
    """A name that is neither a suite nor a tag fails before anything runs, listing the valid names."""
    with pytest.raises(Dsv4HalError, match="bench-moe-quick"):
        execute.select(["bench-mo"])


def test_tags_select_their_suites_and_none_named_on_a_cpu_runs_cpu_suites() -> None:
    """A tag runs every suite it tags, in table order; no name on a CPU machine runs only the CPU suites."""
    assert [s.name for s in execute.select(["memcheck"])] == ["memcheck-guard-tests", "memcheck-index-ops"]
    assert [s.name for s in execute.select([], gpu=False)] == [s.name for s in SUITES if not s.gpu]


def test_run_writes_the_suite_result_with_the_environment_header(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """A suite's result lands in <out>/<card>/<suite>.json with the environment, its command, status and report."""
    suite = Suite("fake-value", "a value the command writes, for the runner's test", _write_value(3), 60, ("t",))
    assert _run_cli(monkeypatch, (suite,), tmp_path, "fake-value") == 0
    assert sorted(p.name for p in (tmp_path / "testcard").iterdir()) == ["fake-value.json"]
    rec = json.loads((tmp_path / "testcard" / "fake-value.json").read_text())
    assert rec["status"] == "passed" and rec["exit_code"] == 0 and rec["result"] == {"value": 3}
    env = rec["environment"]
    assert env["torch"] == __import__("torch").__version__ and env["python"] and env["card"] == "cpu"
    assert env["libraries"]["torch"] and "git_commit" in env and "driver" in env
    assert rec["command"].startswith("python3 -c") and "boom 3" in rec["output_tail"]


def test_rerun_overwrites_the_result_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A second run replaces the suite's file: one file per suite, holding the newest run."""
    for value in (1, 2):
        suite = Suite("fake-value", "a value the command writes, for the runner's test", _write_value(value), 60,
                      ("t",))
        assert _run_cli(monkeypatch, (suite,), tmp_path, "fake-value") == 0
    assert [p.name for p in (tmp_path / "testcard").iterdir()] == ["fake-value.json"]
    assert json.loads((tmp_path / "testcard" / "fake-value.json").read_text())["result"] == {"value": 2}


def test_failing_suite_records_its_status_and_output_tail(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A suite whose command fails still writes its file: status failed, the exit code and its output's tail; the
    run exits 1."""
    suite = Suite("fake-fails", "a command that fails, for the runner's test", _write_value(5, code=3), 60, ("t",))
    assert _run_cli(monkeypatch, (suite,), tmp_path, "t") == 1
    rec = json.loads((tmp_path / "testcard" / "fake-fails.json").read_text())
    assert rec["status"] == "failed" and rec["exit_code"] == 3
    assert rec["output_tail"][-2:] == ["line one", "boom 5"]


def test_suite_past_its_limit_is_ended_and_recorded_as_timeout(tmp_path: Path) -> None:
    """A suite that runs past its time limit is ended with its child processes and recorded as a timeout."""
    child = "import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); " \
            "print('started', flush=True); time.sleep(60)"
    suite = Suite("fake-hangs", "a command that hangs, for the runner's test", ("{python}", "-c", child), 1, ("t",))
    rec = execute.run_suite(suite, tmp_path, {"card": "testcard"}, cwd=ROOT)
    assert rec["status"] == "timeout" and rec["exit_code"] is None and rec["seconds"] < 15
    assert rec["output_tail"] == ["started"]
    assert json.loads((tmp_path / "fake-hangs.json").read_text())["status"] == "timeout"


def test_sanitizer_suite_without_the_sanitizer_is_recorded_unavailable(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Where no compute-sanitizer is installed a memcheck suite writes status unavailable and why."""
    monkeypatch.setattr(execute, "sanitizer_path", lambda: None)
    suite = next(s for s in SUITES if s.sanitizer)
    rec = execute.run_suite(suite, tmp_path, {"card": "testcard"}, cwd=ROOT)
    assert rec["status"] == "unavailable" and "compute-sanitizer" in rec["why"]
    assert json.loads((tmp_path / f"{suite.name}.json").read_text())["status"] == "unavailable"


def test_bench_readme_lists_every_suite() -> None:
    """bench/README.md's suite table names every suite of the runner, and no other."""
    text = (ROOT / "bench" / "README.md").read_text()
    listed = re.findall(r"^\| `([a-z0-9_-]+)` \|", text, re.M)
    assert listed == [s.name for s in SUITES]


def test_source_digest_names_the_code_and_changes_with_it(tmp_path: Path) -> None:
    """The header's source digest is stable for the same files and changes when a source file's bytes or name do
    (a copied tree whose git metadata is stale still says which code ran)."""
    from dsv4hal.runner.environment import source_digest

    (tmp_path / "dsv4hal").mkdir()
    (tmp_path / "platforms").mkdir()
    (tmp_path / "dsv4hal" / "a.py").write_text("x = 1\n")
    (tmp_path / "platforms" / "b.cpp").write_text("int f();\n")
    first = source_digest(tmp_path)
    assert first is not None and first == source_digest(tmp_path)
    (tmp_path / "dsv4hal" / "a.py").write_text("x = 2\n")
    second = source_digest(tmp_path)
    assert second != first
    (tmp_path / "dsv4hal" / "a.py").rename(tmp_path / "dsv4hal" / "c.py")
    assert source_digest(tmp_path) not in (first, second)
    (tmp_path / "notes.md").write_text("not code\n")
    assert source_digest(tmp_path / "missing") is None


def test_a_failed_benchmark_fails_the_bench_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`dsv4hal bench` keeps the other benchmarks' results but exits 1 when one of them raised, so a suite that runs
    it is not recorded as passed; the JSON names the failure."""
    import argparse
    import types

    from dsv4hal.bench import main as bench_main

    def fails(*_args: object, **_kwargs: object) -> list:
        raise RuntimeError("PassManager::run failed")

    broken = types.ModuleType("dsv4hal_test_broken_bench")
    broken.run = fails  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, broken.__name__, broken)
    monkeypatch.setitem(bench_main.BENCHES, "broken", broken.__name__)
    monkeypatch.setattr(bench_main, "CPU_BENCHES", {*bench_main.CPU_BENCHES, "broken"})
    out = tmp_path / "bench.json"
    rc = bench_main.run_bench(argparse.Namespace(op="broken", quick=True, json=str(out), plot=None))
    assert rc == 1
    assert json.loads(out.read_text())["errors"] == {"broken": "RuntimeError: PassManager::run failed"}
