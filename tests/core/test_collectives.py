"""Collective ops in the main registry: expert_parallel's backends forced by overrides, explained by the CLI with
DeepEP refused where the library is missing, listed by info, and a third-party plugin's backend taken by priority."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import plugin_module, registry_with, run_cli

import dsv4hal
from dsv4hal.distributed.backends import EP_OP
from dsv4hal.errors import BadOverrideError
from dsv4hal.override import from_env
from dsv4hal.registry import KernelImpl, Registry

TWO_RANKS = {"world_size": 2}


def test_kernels_override_forces_an_expert_parallel_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    """DSV4HAL_KERNELS=expert_parallel=torch_all_gather and overrides(kernels=...) make the platform choose that
    backend over the higher-priority all_to_all, with the override's source."""
    assert from_env({"DSV4HAL_KERNELS": f"{EP_OP}=torch_all_gather"}).kernels == {EP_OP: "torch_all_gather"}
    assert dsv4hal.select_platform("cpu").decide_collective(EP_OP, TWO_RANKS).chosen.name == "torch_all_to_all"
    monkeypatch.setenv("DSV4HAL_KERNELS", f"{EP_OP}=torch_all_gather")
    d = dsv4hal.select_platform("cpu").decide_collective(EP_OP, TWO_RANKS)
    assert (d.chosen.name, d.source) == ("torch_all_gather", "env")
    monkeypatch.delenv("DSV4HAL_KERNELS")
    with dsv4hal.overrides(kernels={EP_OP: "torch_all_gather"}):
        d = dsv4hal.select_platform("cpu").decide_collective(EP_OP, TWO_RANKS)
    assert (d.chosen.name, d.source) == ("torch_all_gather", "api")


def test_override_naming_no_registered_backend_is_refused_at_selection(monkeypatch: pytest.MonkeyPatch) -> None:
    """A collective op forced to a backend no plugin registered raises BadOverrideError listing the backends."""
    monkeypatch.setenv("DSV4HAL_KERNELS", f"{EP_OP}=nccl_magic")
    with pytest.raises(BadOverrideError, match="torch_all_to_all"):
        dsv4hal.select_platform("cpu")


def test_explain_expert_parallel_lists_deepep_refused_without_the_library() -> None:
    """`dsv4hal explain expert_parallel` on a simulated SM90 machine without deep_ep shows DeepEP rejected for the
    missing library, the case's features, and the torch all_to_all chosen."""
    r = run_cli("explain", EP_OP, "--simulate", "sm90", "--case", "world_size=4", "--case", "mode=decode",
                "--case", "layout=batched")
    assert r.returncode == 0, r.stderr
    assert "rejected deepep_sm90" in r.stdout and "missing deep_ep" in r.stdout
    assert "world_size=4" in r.stdout and "group_backend=nccl" in r.stdout and "mode=decode" in r.stdout
    assert "chosen   torch_all_to_all" in r.stdout
    bad = run_cli("explain", EP_OP, "--case", "layout=diagonal")
    assert bad.returncode == 2 and "standard, batched" in bad.stderr


def test_info_lists_the_collective_op_with_its_backends() -> None:
    """`dsv4hal info` prints expert_parallel's backends, and --json gives its decision for the default case."""
    r = run_cli("info")
    assert r.returncode == 0, r.stderr
    section = r.stdout[r.stdout.index("collective ops"):]
    assert "expert_parallel" in section and "* torch_all_to_all" in section and "- loopback" in section
    data = json.loads(run_cli("info", "--json").stdout)
    assert data["collectives"][EP_OP]["chosen"] == "torch_all_to_all"


def _third_party(registry: Registry) -> None:
    registry.add_kernel(KernelImpl(EP_OP, "fast_ep", "dsv4hal.distributed.backends.loopback:make", ("*",), 350,
                                   supports=lambda case, info: [], description="a third party's EP backend"))


def test_third_party_ep_backend_is_chosen_by_priority_and_built() -> None:
    """A plugin's expert_parallel backend at priority 350 wins over the loop-back (300) for one rank; the platform's
    ExpertParallel builds it and dispatch + combine run through it."""
    reg = registry_with(("fastep", plugin_module("fastep", _third_party)))
    p = dsv4hal.select_platform("cpu", registry=reg)
    d = p.decide_collective(EP_OP, {"world_size": 1})
    assert (d.chosen.name, d.chosen.plugin) == ("fast_ep", "fastep")
    assert next(c for c in d.candidates if c.name == "loopback").status == "eligible"
    ep = p.expert_parallel(None, num_experts=8, hidden=128, top_k=2, max_tokens_per_rank=4)
    assert ep.decide().chosen.name == "fast_ep"
    x = torch.randn(3, 128).to(torch.bfloat16)
    got = ep.dispatch(x, torch.tensor([[0, 5], [1, -1], [7, 2]], dtype=torch.int32), torch.full((3, 2), 0.5))
    assert got.x.shape == (3, 128) and torch.equal(got.counts, torch.tensor([1, 1, 1, 0, 0, 1, 0, 1],
                                                                            dtype=torch.int32))
    assert ep.combine(got.x, got.handle).shape == (3, 128)
