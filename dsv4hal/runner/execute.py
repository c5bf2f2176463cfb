"""Run suites, each in a process of its own (a device fault or a hang ends that suite only), and write one result
file per suite with the environment header, its status and the tail of its output."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from dsv4hal.errors import Dsv4HalError
from dsv4hal.output_paths import write_json
from dsv4hal.runner.junit import junit_cases
from dsv4hal.runner.suites import SUITES, Suite

TAIL_LINES = 40
SANITIZER = ("--tool", "memcheck", "--error-exitcode", "99", "--print-limit", "20")


def select(names: Sequence[str], suites: Sequence[Suite] | None = None, *, gpu: bool = True) -> list[Suite]:
    """The suites named, or tagged, by `names` in table order; none named: every suite this machine runs."""
    suites = SUITES if suites is None else suites
    if not names:
        return [s for s in suites if gpu or not s.gpu]
    tags = {t for s in suites for t in s.tags}
    known = {s.name for s in suites}
    unknown = [n for n in names if n not in known and n not in tags]
    if unknown:
        raise Dsv4HalError(f"unknown suite {', '.join(map(repr, unknown))}",
                           remedy=f"suites: {', '.join(sorted(known))}; tags: {', '.join(sorted(tags))} "
                                  "(dsv4hal run --list)")
    return [s for s in suites if s.name in names or set(s.tags) & set(names)]


def sanitizer_path() -> str | None:
    """compute-sanitizer on PATH or in a CUDA toolkit under /usr/local."""
    found = shutil.which("compute-sanitizer")
    if found:
        return found
    return next((str(p) for p in sorted(Path("/usr/local").glob("cuda*/bin/compute-sanitizer"))), None)


def resolve_test_file(name: str, cwd: Path) -> str:
    """A test file named by its file name alone, found anywhere under `cwd/tests` (the tree's folders may move);
    a path or another argument as given."""
    if "/" in name or not (name.startswith("test_") and name.endswith(".py")):
        return name
    found = sorted((cwd / "tests").rglob(name))
    if len(found) != 1:
        raise Dsv4HalError(f"test file {name!r} found {len(found)} times under {cwd / 'tests'}",
                           remedy="run from the repository root (a source checkout holds the tests)")
    return str(found[0].relative_to(cwd))


def _fill(arg: str, values: dict[str, str]) -> str:
    for key, value in values.items():
        arg = arg.replace("{" + key + "}", value)
    return arg


def _memcheck(text: str) -> dict[str, Any]:
    m = re.search(r"ERROR SUMMARY: (\d+) error", text)
    first = [line for line in text.splitlines() if line.startswith("=========") and "Invalid" in line]
    return {"errors": int(m.group(1)) if m else None, "first_errors": first[:10]}


def _last_json_line(text: str) -> Any:
    for line in reversed(text.splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                return None
    return None


def _run(argv: list[str], env: dict[str, str], cwd: Path, timeout_s: float, log: Path) -> tuple[int | None, float]:
    """(exit code or None on timeout, seconds). The command and its children run in a process group of their own
    (setsid), so that a timeout ends all of them."""
    t0 = time.monotonic()
    with log.open("w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=cwd, env=env, start_new_session=True)
        try:
            rc: int | None = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            rc = None
            for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, None)):
                try:
                    os.killpg(proc.pid, sig)
                    proc.wait(timeout=wait)
                    break
                except subprocess.TimeoutExpired:
                    continue
                except ProcessLookupError:
                    break
    return rc, time.monotonic() - t0


def run_suite(suite: Suite, card_dir: Path, header: dict[str, Any], *, cwd: Path,
              timeout_s: float | None = None) -> dict[str, Any]:
    """Run one suite and write `card_dir/<name>.json`; returns what was written."""
    card_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f"dsv4hal-{suite.name}-") as tmp:
        report, log, xml = Path(tmp) / "report.json", Path(tmp) / "output.txt", Path(tmp) / "junit.xml"
        values = {"python": sys.executable, "json": str(report), "dir": str(card_dir), "name": suite.name}
        command = [resolve_test_file(a, cwd) for a in suite.command]
        argv = [_fill(a, values) for a in command] + (["--junitxml", str(xml)] if suite.junit else [])
        shown = shlex.join([_fill(a, {**values, "python": "python3", "json": "REPORT.json"}) for a in command])
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **{k: _fill(v, values) for k, v in suite.env.items()}}
        record: dict[str, Any] = {
            "suite": suite.name, "measures": suite.measures, "command": shown,
            "env_vars": {k: _fill(v, {**values, "json": "REPORT.json"}) for k, v in suite.env.items()},
            "reproduce": f"dsv4hal run {suite.name}", "environment": header}
        san = sanitizer_path() if suite.sanitizer else None
        if suite.sanitizer and san is None:
            record.update(status="unavailable", exit_code=None, seconds=0.0, output_tail=[],
                          why="no compute-sanitizer in this CUDA toolkit (PATH, /usr/local/cuda*/bin)", result={})
            write_json(card_dir / f"{suite.name}.json", record)
            return record
        if san is not None:
            argv = [san, *SANITIZER, *argv]
            record["command"] = shlex.join(["compute-sanitizer", *SANITIZER]) + " " + shown
        rc, seconds = _run(argv, env, cwd, timeout_s or suite.timeout_s, log)
        text = log.read_text(errors="replace")
        result: dict[str, Any] = {}
        if report.exists():
            try:
                loaded = json.loads(report.read_text())
                result = loaded if isinstance(loaded, dict) else {"report": loaded}
            except ValueError as exc:
                result = {"unreadable_report": str(exc)}
        if suite.stdout_json:
            printed = _last_json_line(text)
            if printed is not None:
                result["report"] = printed
        if suite.junit and xml.exists():
            result["tests"] = junit_cases(xml)
        if san is not None:
            result["memcheck"] = _memcheck(text)
    status = "timeout" if rc is None else "passed" if rc == 0 else "failed"
    record.update(status=status, exit_code=rc, seconds=round(seconds, 1), limit_s=timeout_s or suite.timeout_s,
                  output_tail=text.splitlines()[-TAIL_LINES:], result=result)
    write_json(card_dir / f"{suite.name}.json", record)
    return record


def run_suites(suites: Sequence[Suite], out_dir: Path, card: str | None, *, cwd: Path,
               environment: Callable[[Path], dict[str, Any]],
               progress: Callable[[str], None] = print, limit_s: int | None = None) -> list[dict[str, Any]]:
    """Run the suites in order into `out_dir/<card>/`; the card is the environment's unless given. `limit_s` caps
    each suite's own time limit."""
    header = environment(cwd)
    card_dir = out_dir / (card or header["card"])
    records = []
    for suite in suites:
        limit = suite.timeout_s if limit_s is None else min(limit_s, suite.timeout_s)
        progress(f"{suite.name}: running (limit {limit} s)")
        rec = run_suite(suite, card_dir, header, cwd=cwd, timeout_s=limit)
        progress(f"{suite.name}: {rec['status']} in {rec['seconds']} s -> {card_dir / (suite.name + '.json')}")
        records.append(rec)
    return records
