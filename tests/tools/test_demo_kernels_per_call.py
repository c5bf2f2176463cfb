"""`dsv4hal demo --kernels-per-call`: each recorded call of the named ops through every kernel that takes its case,
output checked against the recording before it is timed; ops that write their arguments and names that are no op
are refused with a typed error."""

from __future__ import annotations

import os

import pytest
import torch
from conftest import run_cli

import dsv4hal
from dsv4hal.demo import Tape, run_demo
from dsv4hal.demo.kernels_per_call import check_ops, kernels_per_call
from dsv4hal.errors import Dsv4HalError


def _recorded_step() -> tuple[dsv4hal.Platform, Tape]:
    platform = dsv4hal.select_platform("cpu")
    tape = Tape(platform.ops)
    run_demo(platform, batch=2, context=20, steps=1, tape=tape)
    return platform, tape


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                    reason="the Triton decode on CPU tensors is the interpreter's job")
def test_each_call_runs_every_kernel_that_takes_it() -> None:
    """Each attention call of the step gets a row: the chosen kernel and the Triton one, both within the replay
    tolerance of the recorded output, timed by the given timer; the fastest is the smallest time."""
    platform, tape = _recorded_step()
    recorded = [c for c in tape.calls if c[0] == "sparse_attention_decode"]
    ticks = iter(range(100, 0, -1))  # each timed kernel gets a smaller time than the one before
    timed: list[object] = []

    def timer(fn):  # noqa: ANN001, ANN202
        timed.append(fn())
        return float(next(ticks))

    rows = kernels_per_call(platform, tape.calls, ["sparse_attention_decode"], timer)
    assert recorded and [r["call"] for r in rows] == list(range(len(recorded)))  # one row a call
    assert len(timed) == 2 * len(rows) and all(isinstance(out, tuple) for out in timed)
    for row, (_, args, kwargs, _) in zip(rows, recorded, strict=True):
        assert row["chosen"] == "torch_reference"
        assert row["case"] == dict(platform.ops.sparse_attention_decode.case_of(*args, **kwargs))
        assert set(row["us"]) == {"torch_reference", "triton_sparse_decode"} and row["wrong"] == {}
        assert row["max_error"]["torch_reference"] == 0.0  # the chosen kernel again: the recorded output
        assert 0.0 <= row["max_error"]["triton_sparse_decode"] < 2e-2
        assert row["fastest"] == min(row["us"], key=row["us"].get) == "triton_sparse_decode"


@pytest.mark.slow
def test_a_kernel_whose_output_differs_is_reported_not_timed() -> None:
    """A recorded output that no kernel gives back: every kernel lands in `wrong` with its error, none is timed."""
    platform, tape = _recorded_step()
    bent = [(n, a, k, (torch.full_like(out[0], 1e3), out[1]) if n == "sparse_attention_decode" else out)
            for n, a, k, out in tape.calls]
    rows = kernels_per_call(platform, bent, ["sparse_attention_decode"], lambda fn: pytest.fail("timed"))
    assert rows and all(r["us"] == {} and r["fastest"] is None and "torch_reference" in r["wrong"] for r in rows)
    assert all("max error" in msg for r in rows for msg in r["wrong"].values())


def test_ops_that_write_their_arguments_or_are_unknown_are_refused() -> None:
    """pack_store writes its cache, compress_decode its ring: their recorded calls cannot run again unchanged."""
    platform = dsv4hal.select_platform("cpu")
    check_ops(platform, ["sparse_attention_decode", "indexer_logits"])
    for name, says in (("pack_store", r"writes its argument\(s\) cache"), ("compress_decode", "state"),
                       ("no_such_op", "is not an op")):
        with pytest.raises(Dsv4HalError, match=says) as info:
            check_ops(platform, [name])
        assert info.value.remedy
    with pytest.raises(Dsv4HalError):  # checked before any call runs
        kernels_per_call(platform, [("pack_store", (), {}, torch.zeros(1))], ["pack_store"], lambda fn: 0.0)


def test_the_cli_needs_graph_mode_and_op_names() -> None:
    """On the CPU (no graph mode) the option is a typed error with a remedy; an empty list is a usage error."""
    r = run_cli("demo", "--batch", "1", "--context", "8", "--steps", "2", "--kernels-per-call",
                "sparse_attention_decode")
    assert r.returncode != 0 and "needs graph mode" in r.stderr and "Remedy" in r.stderr
    r = run_cli("demo", "--kernels-per-call", ",")
    assert r.returncode == 2 and "op names separated by commas" in r.stderr
