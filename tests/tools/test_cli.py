"""dsv4hal info, explain and conformance from the command line: JSON output, simulated machines, forced platforms
and bad inputs as exit code 2 with a message, and where a kernel's priority comes from."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import run_cli

import dsv4hal


def test_cli_info_json_lists_platforms() -> None:
    """info --json lists every platform and marks the selected one."""
    r = run_cli("info", "--json", "--simulate", "cpu")  # (a CPU machine, also on a GPU one)
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    rows = {row["name"]: row for row in data["platforms"]}
    assert {"cpu", "cuda_sm90", "cuda_sm100", "rocm"} <= set(rows)
    assert rows["cpu"]["selected"] and rows["cpu"]["fits"]
    assert "NVIDIA GPU" in rows["cuda_sm90"]["reasons"][0]
    assert set(data["ops"]) == set(dsv4hal.OP_NAMES)
    assert all(d["candidates"] for d in data["ops"].values())


def test_cli_forced_platform_on_cpu_fails_with_reason() -> None:
    """Forcing a GPU platform on a CPU machine exits 2 with the reason."""
    r = run_cli("info", "--simulate", "cpu", env={"DSV4HAL_PLATFORM": "cuda_sm90"})
    assert r.returncode == 2
    assert "cuda_sm90" in r.stderr and "needs an NVIDIA GPU" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize(("arch", "platform"), [("gfx942", "rocm"), ("sm100", "cuda_sm100"), ("sm120", "cpu")])
def test_cli_info_simulated(arch: str, platform: str) -> None:
    """info --simulate ARCH selects that arch's platform."""
    r = run_cli("info", "--json", "--simulate", arch)
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["platform"] == platform and data["info"]["arch"] == arch


def test_cli_bad_inputs_are_typed() -> None:
    """Malformed env overrides, unknown ops and unknown arches exit 2 without a traceback."""
    r = run_cli("info", env={"DSV4HAL_KERNELS": "nonsense"})
    assert r.returncode == 2 and "malformed" in r.stderr and "Traceback" not in r.stderr
    r = run_cli("explain", "warp_drive")
    assert r.returncode == 2 and "valid ops" in r.stderr
    r = run_cli("info", "--simulate", "sm999")
    assert r.returncode == 2 and "unknown arch" in r.stderr


def test_cli_explain_json() -> None:
    """explain --json reports the chosen kernel, the case and the decision's source."""
    r = run_cli("explain", "indexer_topk", "--json", "--case", "k=1024", "--simulate", "cpu")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["chosen"] == "torch_reference" and d["case"]["k"] == 1024 and d["source"] == "auto"


def test_cli_conformance_writes_json_cells(tmp_path: Path) -> None:
    """conformance --json writes every cell with its fields, creating the directories."""
    out = tmp_path / "new" / "dir" / "report.json"
    r = run_cli("conformance", "--platform", "cpu", "--ops", "indexer_topk,build_attention_metadata", "--json",
                str(out), "--markdown", str(tmp_path / "report.md"), "--quiet")
    assert r.returncode == 0, r.stderr
    data = json.loads(out.read_text())
    keys = {"op", "implementation", "case", "mode", "compress_ratio", "platform", "status", "max_error", "tolerance"}
    assert data["cells"] and all(keys <= set(c) for c in data["cells"])
    ran = [c for c in data["cells"] if c["op"] == "indexer_topk" and c["status"] == "pass"]
    assert ran and all(c["tolerance"]["reason"] for c in ran)
    # the ops left out are counted, not listed
    assert not [c for c in data["cells"] if c["op"] == "moe_experts"]
    assert 0 < data["deselected"] <= data["summary"]["not-run"]


def test_info_says_where_a_case_conditional_priority_comes_from() -> None:
    """Marlin's priority for the default MoE case (class decode) is its priority_when entry, and info says so in the
    table and the JSON; a kernel at its own priority carries no note."""
    libs = ("--simulate", "sm90", "--library", "vllm_moe", "--library", "triton")
    r = run_cli("info", *libs)
    assert r.returncode == 0, r.stderr
    assert "(p95 for tokens=decode; 300 otherwise (H200: the portable triton_fused_moe is faster" in r.stdout
    r = run_cli("info", "--json", *libs)
    cands = {c["name"]: c for c in json.loads(r.stdout)["ops"]["moe_experts"]["candidates"]}
    from dsv4hal_cuda_sm90.kernels import MOE_DECODE_WHY

    assert cands["marlin_mxfp4_sm90"]["priority_note"] == f"for tokens=decode; 300 otherwise ({MOE_DECODE_WHY})"
    assert cands["triton_fused_moe"]["priority_note"] == ""
