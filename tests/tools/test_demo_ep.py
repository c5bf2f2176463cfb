"""`dsv4hal demo --ep N` on gloo processes: the layers run expert-parallel, rank 0's JSON reports the step and the
dispatch/combine times, every MoE layer matches single-rank moe_experts, and one rank matches the model bit for bit.
Every run is bounded (run_cli's subprocess timeout; the process group's collective timeout)."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import run_cli

from dsv4hal.demo.ep import run_ep_demo

TINY = ("--batch", "1", "--context", "8", "--steps", "2")


def test_demo_ep_two_ranks_report_step_and_dispatch_combine_times(tmp_path: Path) -> None:
    """--ep 2 on the CPU: each rank holds half the experts, three layers dispatch and combine a step, rank 0's JSON
    has ep 2, the step time and ep_dispatch / ep_combine among the per-op times, and --compare-cpu passes."""
    out = tmp_path / "ep.json"
    r = run_cli("demo", "--ep", "2", *TINY, "--compare-cpu", "--json", str(out))
    assert r.returncode == 0, r.stdout + r.stderr
    res = json.loads(out.read_text())
    assert res["ep"] == 2 and res["group_backend"] == "gloo" and res["step_us"] > 0 and res["finite"]
    assert res["ops_us"]["ep_dispatch"] > 0 and res["ops_us"]["ep_combine"] > 0 and res["ops_us"]["moe_experts"] > 0
    assert res["calls_per_step"]["ep_dispatch"] == 3 and res["calls_per_step"]["ep_combine"] == 3
    assert res["ep_backends"] == {"prefill": "torch_all_to_all", "decode": "torch_all_to_all"}
    assert [r["local_experts"] for r in res["ranks"]] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert res["check"]["ok"] and res["check"]["moe_calls_per_rank"] == 9, res["check"]
    assert "ep_dispatch" in r.stdout and "MoE layers against single-rank moe_experts" in r.stdout


def test_demo_ep_four_ranks_follow_the_backend_override(tmp_path: Path) -> None:
    """DSV4HAL_KERNELS=expert_parallel=torch_all_gather reaches every rank: four ranks run the all-gather fallback
    and their MoE layers still match single-rank moe_experts."""
    out = tmp_path / "ep4.json"
    r = run_cli("demo", "--ep", "4", "--batch", "1", "--context", "8", "--steps", "1", "--compare-cpu", "--json",
                str(out), env={"DSV4HAL_KERNELS": "expert_parallel=torch_all_gather"})
    assert r.returncode == 0, r.stdout + r.stderr
    res = json.loads(out.read_text())
    assert res["ep_backends"] == {"prefill": "torch_all_gather", "decode": "torch_all_gather"}
    assert res["check"]["ok"], res["check"]


def test_demo_ep_one_rank_equals_the_single_rank_model_bit_for_bit() -> None:
    """One rank (the loop-back) gives the single-rank model's outputs exactly, prefill and decode steps included."""
    res = run_ep_demo(1, batch=2, context=12, steps=2, tokens_per_request=2, check=True, timeout_s=60,
                      join_timeout_s=120)
    assert res["ep_backends"] == {"prefill": "loopback", "decode": "loopback"}
    assert res["check"]["ok"] and res["check"]["worst_rel_error"] == 0.0
    assert res["check"]["model_outputs_rel_error"] == 0.0


def test_demo_ep_refuses_bad_world_sizes_and_graph_mode() -> None:
    """A world size that does not divide the experts, and --graph with --ep, are typed errors naming the remedy."""
    r = run_cli("demo", "--ep", "3", *TINY)
    assert r.returncode == 2 and "not a multiple of 3" in r.stderr and "Remedy" in r.stderr
    r = run_cli("demo", "--ep", "2", "--graph", *TINY)
    assert r.returncode == 2 and "--graph" in r.stderr
