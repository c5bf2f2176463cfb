"""The engine-shaped demo on the CPU: it runs end to end on the public API, and the same program with
dsv4hal's Triton kernels forced (under the interpreter) agrees with the all-reference run."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from conftest import run_cli

import dsv4hal
from dsv4hal.demo import Tape, replay, run_demo

TRITON = {"pack_store": "triton_pack_store", "indexer_topk": "triton_radix_topk",
          "build_attention_metadata": "triton_attention_metadata", "sparse_attention_decode": "triton_sparse_decode"}


@pytest.mark.slow
def test_demo_runs_and_reports() -> None:
    """The demo decodes finite outputs and counts each op's calls per step."""
    res = run_demo(dsv4hal.select_platform("cpu"), batch=2, context=300, steps=2)
    assert len(res["outputs"]) == 3 and all(torch.isfinite(o).all() for o in res["outputs"])
    assert res["decode_tokens_per_s"] > 0
    calls = res["decode_calls"]
    # per decode step: metadata once, per layer the attention and the MoE; mHC: a pre, 5 fused boundaries, a post
    assert calls["build_attention_metadata"] == 2 and calls["sparse_attention_decode"] == 6
    assert calls["moe_experts"] == 6 and calls["indexer_topk"] == 2
    assert calls["mhc_pre"] == 2 and calls["mhc_post_pre"] == 10 and calls["mhc_post"] == 2
    assert res["strict"] is False
    with dsv4hal.overrides(strict=True):  # the run says it was strict (on a GPU, no reference op could be bound)
        assert run_demo(dsv4hal.select_platform("cpu"), batch=1, context=8, steps=1)["strict"] is True


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                    reason="replays the CPU platform's calls (CPU tensors) through the Triton kernels: the "
                    "interpreter's job; on a GPU the conformance catalog runs them natively")
def test_demo_ops_replayed_with_triton_kernels_match_the_reference() -> None:
    """Every op call of the reference run, replayed with the Triton kernels on the program's own inputs.
    (End-to-end outputs are not compared: a last-bit difference can flip an MoE routing choice.)"""
    ref_platform = dsv4hal.select_platform("cpu")
    tape = Tape(ref_platform.ops)
    run_demo(ref_platform, batch=2, context=20, steps=1, tape=tape)
    with dsv4hal.overrides(kernels=TRITON):
        fast = dsv4hal.select_platform("cpu")
    assert {op: fast.explain(op).chosen.name for op in TRITON} == TRITON
    worst = replay(tape, fast)
    assert {"sparse_attention_decode", "indexer_topk", "build_attention_metadata"} <= set(worst)
    assert worst["build_attention_metadata"] == 0.0 and worst["indexer_topk"] == 0.0


def test_demo_cli_json(tmp_path) -> None:  # noqa: ANN001
    """dsv4hal demo --json writes per-op times and the run's figures."""
    out = tmp_path / "demo.json"
    # two steps: on a GPU the graph mode's first step is the eager warm-up, and the second the timed replay
    r = run_cli("demo", "--batch", "1", "--context", "8", "--steps", "2", "--json", str(out))
    assert r.returncode == 0, r.stderr
    data = json.loads(out.read_text())
    # per-op times: eager mode times each call in the step; graph mode each op alone (its first, eager step)
    per_op = data["ops_alone_us"] if "graph_step_us" in data else data["decode_breakdown_s"]
    assert data["decode_tokens_per_s"] > 0 and per_op["sparse_attention_decode"] > 0


@pytest.mark.slow
def test_demo_cli_compile(tmp_path) -> None:  # noqa: ANN001
    """`--compile BACKEND` reaches run_demo and the JSON says which backend compiled the step."""
    out = tmp_path / "demo.json"
    r = run_cli("demo", "--batch", "1", "--context", "8", "--steps", "2", "--compile", "aot_eager", "--json", str(out))
    assert r.returncode == 0, r.stderr
    data = json.loads(out.read_text())
    assert data["compile_backend"] == "aot_eager" and data["finite"] and data["decode_tokens_per_s"] > 0


def test_demo_random_fill_decodes_and_reports_every_layer() -> None:
    """A random-fill demo reports finite non-zero outputs for every layer."""
    res = run_demo(dsv4hal.select_platform("cpu"), batch=2, context=600, steps=1, fill="random")
    assert res["fill"] == "random" and res["prefill_s"] >= 0 and len(res["outputs"]) == 1
    (layers,) = res["layer_outputs"]
    assert len(layers) == 3 and all(bool(torch.isfinite(t).all()) and float(t.abs().max()) > 0 for t in layers)
    assert res["config"]["max_pages"] == 3  # 601 positions in 256-token pages


def test_demo_graph_mode_needs_a_replay_to_time() -> None:
    """--graph with --steps 1 would time no replay (the first step is the eager warm-up): a typed error. Checked
    before anything runs, so on any machine (without a GPU the CUDA-platform error comes first)."""
    r = run_cli("demo", "--graph", "--steps", "1", "--context", "8")
    assert r.returncode != 0 and ("--steps 1 in graph mode" in r.stderr or "--graph needs a CUDA platform" in r.stderr)
    assert "Traceback" not in r.stderr


def test_demo_graph_needs_a_gpu() -> None:
    """demo --graph on a CPU machine fails with a message saying it needs CUDA."""
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    r = run_cli("demo", "--platform", "cpu", "--graph", "--steps", "1", "--context", "8")
    assert r.returncode != 0 and "--graph needs a CUDA platform" in r.stderr


def test_floor_bytes_count_what_a_step_must_move() -> None:
    """floor_bytes counts at least the bytes a decode step's attention reads and its pack_store writes."""
    from dsv4hal.demo import DemoConfig, DemoModel, NullTimer, fill_random, floor_bytes

    platform = dsv4hal.select_platform("cpu")
    model = DemoModel(platform, DemoConfig(max_pages=2), 2)
    fill_random(model, 2, 300)
    tape = Tape(platform.ops)
    model.ops = tape
    model.forward(torch.randn(2, 256).bfloat16(), torch.arange(2), torch.full((2,), 300), NullTimer(), decode=True)
    floors = {}
    for name, args, kwargs, out in tape.calls:
        floors[name] = floors.get(name, 0) + floor_bytes(name, args, kwargs, out)
    # attention reads 584 bytes per index (SWA 128 + the extra indices of each row); pack_store writes 584 a row
    q, swa_idx = next((a[0], a[2]) for n, a, _, _ in tape.calls if n == "sparse_attention_decode")
    assert floors["sparse_attention_decode"] > 3 * swa_idx.numel() * 584
    assert floors["pack_store"] >= 2 * 584 and all(v > 0 for v in floors.values())


def test_breakdown_plot_draws_each_op_alone_beside_its_floor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The demo breakdown plot draws each op's time alone and its floor, slowest first, and the graph step beside the
    sum of the ops."""
    pytest.importorskip("matplotlib")
    from figures import bars, drawn, tick_labels

    from dsv4hal.demo import plot_breakdown

    alone = {"pack_store": 2.0, "sparse_attention_decode": 9.0, "moe_experts": 5.0}
    res = {"ops_alone_us": alone, "ops_floor_us": {n: v / 4 for n, v in alone.items()},
           "kernels": {"moe_experts": "triton_fused_moe"}, "sum_ops_alone_us": 16.0, "graph_step_us": 12.0,
           "graph_step_over_sum_ops": 0.75, "device": "cpu", "batch": 2, "context": 300,
           "config": {"hidden": 256, "experts": 8}}
    ops_ax, step_ax = drawn(monkeypatch, lambda out: plot_breakdown(res, out), tmp_path / "demo.png").axes
    assert bars(ops_ax) == {"op alone (CUDA graph)": [9.0, 5.0, 2.0], "bandwidth floor": [2.25, 1.25, 0.5]}
    assert tick_labels(ops_ax) == ["sparse_attention_decode\n", "moe_experts\ntriton_fused_moe", "pack_store\n"]
    assert [p.get_height() for p in step_ax.patches] == [16.0, 12.0]
    assert tick_labels(step_ax) == ["sum of ops alone", "graph step"] and "0.75" in step_ax.get_title()


def test_compiled_decode_step_is_one_graph_and_matches_eager() -> None:
    """`dsv4hal demo --compile`: the decode step compiles whole (every dsv4hal op one opaque custom op, no graph
    break), and with a backend that does not fuse (aot_eager) its outputs equal the eager step's bit for bit."""
    from torch._dynamo.utils import counters

    platform = dsv4hal.select_platform("cpu")
    eager = run_demo(platform, batch=2, context=40, steps=2)
    torch._dynamo.reset()
    counters.clear()
    compiled = run_demo(platform, batch=2, context=40, steps=2, compile_backend="aot_eager")
    assert compiled["compile_backend"] == "aot_eager" and compiled["decode_calls"] == {}  # no per-op timers
    assert counters["stats"]["unique_graphs"] == 1 and not counters["graph_break"]
    assert len(compiled["outputs"]) == len(eager["outputs"]) == 3
    for got, want in zip(compiled["outputs"], eager["outputs"]):
        assert torch.isfinite(got).all() and torch.equal(got, want)


def test_fp8_projections_run_through_the_fp8_linear_op_and_track_the_bf16_model() -> None:
    """With fp8_linears the five dense projections of each layer go through fp8_linear, wq_a and wkv fused into one
    (10 calls a decode step: three in each layer, the indexer's wq_b in the C4 one), wo_a through fp8_grouped_linear
    (one a layer), and the outputs stay near the bf16-projection model's (FP8 weights and activations perturb each
    projection by a few percent; a wrong layout or a swapped split of the fused output would not be near)."""
    from dataclasses import replace

    from dsv4hal.engine_model.config import DemoConfig

    platform = dsv4hal.select_platform("cpu")
    cfg = replace(DemoConfig(), q_lora=128)
    runs = {f: run_demo(platform, batch=2, context=300, steps=2, cfg=replace(cfg, fp8_linears=f)) for f in (0, 1)}
    calls = {f: runs[f]["decode_calls"] for f in (0, 1)}
    assert calls[1]["fp8_grouped_linear"] == 3 * 2 and "fp8_grouped_linear" not in calls[0]
    assert calls[1]["fp8_linear"] == 10 * 2 and "fp8_linear" not in calls[0]
    for bf16, fp8 in zip(runs[0]["outputs"], runs[1]["outputs"]):
        assert bool(torch.isfinite(fp8).all())
        assert float((fp8 - bf16).norm() / bf16.norm()) < 0.25


def test_each_op_range_holds_only_its_op_call() -> None:
    """The ranges the step's profile attributes kernels by (the timer around each op call) hold the op's call and
    nothing the engine computes for it: no torch op runs inside a range but outside the op."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from dsv4hal.demo import DemoConfig, DemoModel, fill_random

    platform = dsv4hal.select_platform("cpu")
    model = DemoModel(platform, DemoConfig(max_pages=2), 2)
    fill_random(model, 2, 300)
    state = {"range": None, "in_op": False}
    stray: list[tuple[str, str]] = []
    ranges: list[str] = []

    class Ops:  # the platform's ops, marking when one runs
        def __getattr__(self, name: str):  # noqa: ANN204
            op = getattr(platform.ops, name)

            def call(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
                state["in_op"] = True
                try:
                    return op(*args, **kwargs)
                finally:
                    state["in_op"] = False
            return call

    class Ranges:  # the timer: what runs inside each range
        def __call__(self, name: str):  # noqa: ANN204
            import contextlib

            @contextlib.contextmanager
            def held():  # noqa: ANN202
                state["range"] = name
                ranges.append(name)
                try:
                    yield
                finally:
                    state["range"] = None
            return held()

    class Stray(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
            if state["range"] is not None and not state["in_op"]:
                stray.append((state["range"], str(func)))
            return func(*args, **(kwargs or {}))

    model.ops = Ops()
    with Stray():
        model.forward(torch.randn(2, 256).bfloat16(), torch.arange(2), torch.full((2,), 300), Ranges(), decode=True)
    assert {"moe_route", "indexer_q_prep", "compress_decode", "pack_store", "indexer_store"} <= set(ranges), ranges
    assert stray == []
