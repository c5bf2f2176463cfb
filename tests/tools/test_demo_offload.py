"""`dsv4hal demo --offload-c4` on the CPU: the C4 pool offloaded to a working set gives the resident run's outputs
bit for bit, and the JSON says so with the fetch statistics."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import run_cli

import dsv4hal
from dsv4hal.demo import run_demo


@pytest.mark.slow
def test_demo_with_offloaded_c4_pool_gives_the_resident_outputs() -> None:
    """The decode outputs with the C4 pool offloaded equal the resident run's, and the stats count the fetches."""
    platform = dsv4hal.select_platform("cpu")
    resident = run_demo(platform, batch=2, context=300, steps=2)
    offloaded = run_demo(platform, batch=2, context=300, steps=2, offload_c4=0.25)
    assert resident["offload_c4"] is False and offloaded["offload_c4"] is True
    for a, b in zip(resident["outputs"], offloaded["outputs"], strict=True):
        assert torch.equal(a, b)
    stats = offloaded["offload"]
    assert stats["misses"] > 0 and stats["hits"] > 0 and stats["working_pages"] < stats["pool_pages"]
    assert offloaded["decode_calls"]["offload_fetch"] == 4  # a store and a read a step


def test_demo_cli_offload_c4_json(tmp_path) -> None:  # noqa: ANN001
    """dsv4hal demo --offload-c4 --json writes offload_c4: true and the pool's sizes and counters."""
    out = tmp_path / "demo.json"
    r = run_cli("demo", "--batch", "1", "--context", "8", "--steps", "2", "--offload-c4", "--json", str(out))
    assert r.returncode == 0, r.stderr
    res = json.loads(out.read_text())
    assert res["offload_c4"] is True and res["offload"]["requested_fraction"] == 0.25
    assert res["offload"]["bytes_in"] == res["offload"]["misses"] * 37440
