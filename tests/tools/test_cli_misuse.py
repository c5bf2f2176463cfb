"""The CLI refuses nonsense with a non-zero exit and a one-paragraph message, never a traceback; it checks outputs
before long runs, shows progress, answers --version and --help, and logs decisions through `logging`.
Most cases run main() in-process (cheap); Ctrl-C is a real SIGINT to a subprocess."""

from __future__ import annotations

import argparse
import ast
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT

import dsv4hal
from dsv4hal import cli


def _run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    try:
        rc = cli.main(list(args))
    except SystemExit as exc:  # argparse usage errors, --help, --version
        rc = exc.code if isinstance(exc.code, int) else 1
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return rc, out, err


@pytest.mark.parametrize(("args", "needle"), [
    (("conformance", "--ops", "nosuchop", "--quiet"), "unknown op(s) 'nosuchop'"),
    (("conformance", "--ops", "", "--quiet"), "unknown op"),
    (("conformance", "--ops", "indexer_topk", "--cases", "zzz-no-such-case", "--quiet"), "no conformance case matches"),
    (("conformance", "--cases", "[", "--quiet"), "is not a regular expression"),
    (("explain", "sparse_attention_decode", "--case", "bogus=1"), "'bogus' is not a case feature"),
    (("explain", "sparse_attention_decode", "--case", "h_q=abc"), "h_q takes 64, 128"),
    (("explain", "sparse_attention_decode", "--case", "h_q=-5"), "h_q takes 64, 128"),
    (("explain", "sparse_attention_decode", "--case", "fp8=e5m2"), "fp8 takes e4m3fn, e4m3fnuz"),
    (("explain", "indexer_topk", "--case", "k=-1"), "non-negative integer"),
    (("explain", "indexer_topk", "--case", "page_transform=maybe"), "true or false"),
    (("explain", "indexer_topk", "--case", "k"), "is not key=value"),
    (("explain", "sparse_attention_decode", "--case", "tokens=few"), "tokens takes single, batch, wide"),
    (("explain", "moe_experts", "--case", "tokens=single"), "tokens takes few, decode, prefill"),
    (("explain", "sparse_attention_decode", "--case", "extra_class=Short"), "extra_class takes short, long, None"),
    (("explain", "sparse_attention_prefill", "--case", "width=None"), "its calls always have a width"),
    (("explain", "moe_route", "--case", "tokens=None"), "its calls always have a tokens"),
    (("info", "--library", "flash_mla"), "--library only applies to a simulated machine"),
    (("bench", "nosuch"), "unknown benchmark 'nosuch'"),
    (("demo", "--batch", "0"), "less than 1"),
    (("demo", "--batch", "-1"), "less than 1"),
    (("demo", "--context", "0"), "less than 1"),
    (("demo", "--steps", "x"), "is not an integer"),
])
def test_misuse_exits_2_with_a_message(capsys: pytest.CaptureFixture[str], args: tuple[str, ...],
                                       needle: str) -> None:
    """Each CLI misuse exits 2 with a short message naming the problem, not a traceback."""
    rc, _, err = _run(capsys, *args)
    assert rc == 2, err
    assert needle in err
    assert len(err.strip().splitlines()) <= 8  # a message, not a dump


def test_valid_case_values_are_accepted(capsys: pytest.CaptureFixture[str]) -> None:
    """explain accepts valid --case values, including keys of an op's alternate case."""
    rc, out, err = _run(capsys, "explain", "sparse_attention_decode", "--case", "h_q=128", "--case", "fp8=e4m3fnuz",
                        "--case", "compress_ratio=0")
    assert rc == 0, err
    assert "h_q=128" in out and "e4m3fnuz" in out
    rc, out, err = _run(capsys, "explain", "moe_experts", "--case", "format=fp8_block", "--case", "fp8=e4m3fn")
    assert rc == 0 and "format=fp8_block, fp8=e4m3fn" in out, err  # a key of the op's alternate case
    rc, out, err = _run(capsys, "explain", "sparse_attention_decode", "--case", "compress_ratio=0", "--case",
                        "extra_page_size=None", "--case", "extra_width=None", "--case", "extra_class=None")
    assert rc == 0 and "extra_class=None, extra_page_size=None, extra_width=None" in out, err  # an SWA-only layer
    for op, tokens in (("sparse_attention_decode", "single"), ("moe_experts", "few"), ("moe_route", "prefill")):
        rc, out, err = _run(capsys, "explain", op, "--case", f"tokens={tokens}")  # each op's own token classes
        assert rc == 0 and f"tokens={tokens}" in out, err


def test_the_closed_case_sets_are_what_the_case_functions_return() -> None:
    """--case accepts exactly the values an op's case function can produce for a closed feature."""
    from dsv4hal.cli import case_choices
    from dsv4hal.ops.moe import DECODE_MAX_TOKENS, FEW_MAX_TOKENS, token_class
    from dsv4hal.ops.sparse_attention import decode_token_class

    assert set(case_choices("sparse_attention_decode", "tokens")) == {decode_token_class(t) for t in range(1, 130)}
    counts = range(1, 2 * DECODE_MAX_TOKENS)
    assert FEW_MAX_TOKENS < DECODE_MAX_TOKENS
    for op in ("moe_route", "moe_experts"):
        assert set(case_choices(op, "tokens")) == {token_class(t) for t in counts}


def test_outputs_are_checked_before_the_run(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Unwritable output paths are refused before a conformance run starts."""
    import dsv4hal.conformance.runner as runner

    def never(*a: object, **k: object) -> None:
        raise AssertionError("the run started before its outputs were checked")

    monkeypatch.setattr(runner, "run_conformance", never)
    blocker = tmp_path / "file"
    blocker.write_text("")
    rc, _, err = _run(capsys, "conformance", "--json", str(tmp_path), "--quiet")
    assert rc == 2 and "is a folder" in err
    rc, _, err = _run(capsys, "conformance", "--markdown", str(blocker / "sub" / "r.md"), "--quiet")
    assert rc == 2 and "cannot create the folder" in err
    rc, _, err = _run(capsys, "demo", "--json", str(tmp_path))
    assert rc == 2 and "is a folder" in err


def test_interrupt_is_one_line_and_exit_130(capsys: pytest.CaptureFixture[str],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A KeyboardInterrupt during a command prints one line and exits 130."""
    import dsv4hal.conformance.runner as runner

    def interrupted(*a: object, **k: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "run_conformance", interrupted)
    rc, out, err = _run(capsys, "conformance", "--quiet")
    assert rc == 130 and err.strip() == "dsv4hal conformance: interrupted"


def test_sigint_to_a_running_command() -> None:
    """SIGINT to a running dsv4hal demo exits 130 without a traceback."""
    proc = subprocess.Popen([sys.executable, "-m", "dsv4hal.cli", "demo", "--steps", "100"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(3)  # inside main's try: importing torch or prefilling
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and err.strip().splitlines()[-1] == "dsv4hal demo: interrupted"


def test_conformance_progress_has_a_fixed_total_and_decode_step_honours_cases(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Conformance progress counts toward a fixed total, and decode-step cells honour --cases."""
    import dsv4hal.conformance.decode_step as ds
    import dsv4hal.conformance.decode_step_verify as dv
    from dsv4hal.conformance.runner import Cell, run_conformance

    ran: list[tuple[int, ...]] = []
    ran_verify: list[tuple[tuple[int, int], ...]] = []

    def fake_cells(platform: object, seed: int = 0, ratios: tuple[int, ...] = ds.RATIOS) -> list[Cell]:
        ran.append(ratios)
        return [Cell("decode_step", "x", ds.case_name(r), m, r, "cpu", "pass") for r in ratios
                for m in ("eager", "graph")]

    def fake_verify(platform: object, seed: int = 0, cases: tuple[tuple[int, int], ...] = ()) -> list[Cell]:
        ran_verify.append(cases)
        return [Cell("decode_step", "x", dv.case_name(r, t, k), "verify", r, "cpu", "pass") for r, t in cases
                for k in ("eager", "graph")]

    monkeypatch.setattr(ds, "decode_step_cells", fake_cells)
    monkeypatch.setattr(dv, "verify_cells", fake_verify)
    seen: list[tuple[int, int]] = []
    report = run_conformance("cpu", ops=["indexer_topk", "decode_step"], cases="ratio128|k512/ties$",
                             progress=lambda i, n, c: seen.append((i, n)))
    assert ran == [(128,)] and ran_verify == [((128, 2),), ((128, 4),)]
    steps = [c for c in report.cells if c.op == "decode_step"]
    assert [c.case for c in steps if c.mode != "verify"] == [ds.case_name(128)] * 2
    assert [c.case for c in steps if c.mode == "verify"] == [dv.case_name(128, t, k) for t in (2, 4)
                                                            for k in ("eager", "graph")]
    assert seen and len({n for _, n in seen}) == 1 and seen[-1][0] == seen[-1][1]
    ran.clear()
    ran_verify.clear()
    run_conformance("cpu", ops=["indexer_topk", "decode_step"], cases="k512/ties$")
    assert ran == [] and ran_verify == []  # no decode_step case matches: none built


def test_plain_progress_lines_off_a_terminal(capsys: pytest.CaptureFixture[str]) -> None:
    """Off a terminal conformance progress is plain [i/total] lines ending at total/total."""
    rc, _, err = _run(capsys, "conformance", "--platform", "cpu", "--ops", "build_attention_metadata")
    assert rc == 0, err
    lines = [ln for ln in err.splitlines() if ln.startswith("[conformance ")]
    total = lines[0].split()[1].split("/")[1].rstrip("]")
    assert lines and all(ln.split()[1].endswith(f"/{total}]") for ln in lines)
    assert lines[-1].split()[1] == f"{total}/{total}]"


def test_version_help_and_case_keys(capsys: pytest.CaptureFixture[str]) -> None:
    """--version prints the version and explain --help lists every op and its case keys."""
    rc, out, _ = _run(capsys, "--version")
    assert rc == 0 and out.strip() == f"dsv4hal {dsv4hal.__version__}"
    rc, out, _ = _run(capsys, "explain", "--help")
    assert rc == 0
    for op in dsv4hal.OP_NAMES:
        assert op in out
    assert "h_q=64" in out and "fp8 in {e4m3fn, e4m3fnuz}" in out


def test_every_option_has_help_with_its_default() -> None:
    """Every CLI option has help text that states its default."""
    parser = cli.build_parser()
    subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    missing = []
    for name, sp in [("dsv4hal", parser), *subs.choices.items()]:
        for a in sp._actions:
            if isinstance(a, (argparse._HelpAction, argparse._VersionAction, argparse._SubParsersAction)):
                continue
            text = a.help or ""
            has_default = a.default not in (None, False, argparse.SUPPRESS) and a.option_strings
            if not text or (has_default and "default" not in text):
                missing.append(f"{name} {'/'.join(a.option_strings) or a.dest}")
    assert not missing, f"options without help (or without their default): {missing}"


def test_decisions_are_logged(capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture) -> None:
    """-vv logs the chosen platform and each op's chosen kernel."""
    with caplog.at_level(logging.DEBUG, logger="dsv4hal"):
        rc, _, _ = _run(capsys, "-vv", "info", "--platform", "cpu")  # (on a GPU machine too)
    assert rc == 0
    msgs = [r.getMessage() for r in caplog.records if r.name.startswith("dsv4hal")]
    assert any(m.startswith("platform cpu (") for m in msgs)
    assert any(m.startswith("sparse_attention_decode on cpu: torch_reference") for m in msgs)


def test_no_prints_in_library_code() -> None:
    """print() only in the CLI, the commands' main functions and the benchmark modules `dsv4hal bench` runs (their
    rows are its output); libraries log or return values."""
    bench_shared = {"common.py", "timing.py", "pools.py", "plot.py", "__init__.py"}
    bad = []
    for path in sorted((ROOT / "dsv4hal").rglob("*.py")):
        if path.name in ("cli.py", "progress.py") or ("bench" in path.parts and path.name not in bench_shared):
            continue
        tree = ast.parse(path.read_text())
        for fn in [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]:
            if fn.name == "main":
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "print":
                    bad.append(f"{path.relative_to(ROOT)}:{node.lineno} in {fn.name}")
    assert not sorted(set(bad)), bad


def test_module_runs_as_main() -> None:
    """python -m dsv4hal.cli runs and reports misuse as exit 2 without a traceback."""
    env = {**os.environ}
    r = subprocess.run([sys.executable, "-m", "dsv4hal.cli", "explain", "nosuchop"], capture_output=True, text=True,
                       cwd=ROOT, env=env, timeout=120)
    assert r.returncode == 2 and "valid ops" in r.stderr and "Traceback" not in r.stderr
