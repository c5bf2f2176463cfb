"""`dsv4hal demo --tp N` on gloo processes: attention runs tensor-parallel with padded heads, rank 0's JSON reports
the step and the tp_all_reduce time, and each step matches the single-rank model. Every run is bounded (run_cli's
subprocess timeout; the process group's collective timeout)."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import run_cli

TINY = ("--batch", "1", "--context", "8", "--steps", "2")


def test_demo_tp_two_ranks_report_step_and_all_reduce_time_and_match_one_rank(tmp_path: Path) -> None:
    """--tp 2 on the CPU: each rank runs 32 query heads padded to the ops' 64, three layers all-reduce their output
    projection a step, rank 0's JSON has tp 2, the step and tp_all_reduce times, and every step's output equals the
    single-rank model's (fp32 reduce: the same bits at two ranks)."""
    out = tmp_path / "tp.json"
    r = run_cli("demo", "--tp", "2", *TINY, "--compare-cpu", "--json", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    res = json.loads(out.read_text())
    assert res["tp"] == 2 and res["group_backend"] == "gloo" and res["step_us"] > 0 and res["finite"]
    assert res["tp_all_reduce_us"] > 0 and res["calls_per_step"]["tp_all_reduce"] == 3
    assert res["tp_backend"] == "torch_all_reduce"
    assert res["heads"]["per_rank"] == 32 and res["heads"]["padded"] == 64
    assert res["check"]["ok"] and res["check"]["steps_compared"] >= 2 and res["check"]["worst_rel_error"] == 0.0
    assert "tp_all_reduce" in r.stdout and "outputs against the single-rank model" in r.stdout


def test_demo_tp_refuses_a_world_size_not_dividing_the_heads_and_ep_together() -> None:
    """--tp 3 (not a divisor of the output groups) and --tp with --ep are typed errors naming the remedy."""
    r = run_cli("demo", "--tp", "3", *TINY)
    assert r.returncode == 2 and "multiples of 3" in r.stderr and "Remedy" in r.stderr
    r = run_cli("demo", "--tp", "2", "--ep", "2", *TINY)
    assert r.returncode == 2 and "--ep" in r.stderr
