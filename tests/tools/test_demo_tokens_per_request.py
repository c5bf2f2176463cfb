"""`dsv4hal demo --tokens-per-request N`: MTP verify steps of N query tokens per request through every op."""

from __future__ import annotations

import json

import torch
from conftest import run_cli

import dsv4hal
from dsv4hal.demo import run_demo


def test_demo_cli_tokens_per_request_json(tmp_path) -> None:  # noqa: ANN001
    """--tokens-per-request 2 runs on the CPU and its JSON carries tokens_per_request; each chain token runs its own
    compress_decode (three compressors: C4 main and indexer, C128)."""
    out = tmp_path / "demo.json"
    r = run_cli("demo", "--batch", "1", "--context", "8", "--steps", "2", "--tokens-per-request", "2", "--no-graph",
                "--json", str(out))
    assert r.returncode == 0, r.stderr
    data = json.loads(out.read_text())
    assert data["tokens_per_request"] == 2 and data["finite"] and data["decode_tokens_per_s"] > 0
    assert data["decode_calls"]["compress_decode"] == 2 * 2 * 3
    assert data["decode_calls"]["sparse_attention_decode"] == 2 * 3


def test_demo_verify_step_has_a_row_per_query_token() -> None:
    """A step of four tokens per request returns batch * 4 rows, all finite; the default stays one token."""
    cpu = dsv4hal.select_platform("cpu")
    res = run_demo(cpu, batch=2, context=8, steps=1, tokens_per_request=4)
    assert res["tokens_per_request"] == 4 and res["outputs"][-1].shape[0] == 8
    assert all(bool(torch.isfinite(t).all()) for t in res["layer_outputs"][-1])
    assert run_demo(cpu, batch=1, context=8, steps=1)["tokens_per_request"] == 1
