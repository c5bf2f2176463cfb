"""The decode step's kernel attribution (dsv4hal.demo.step_profile): replayed launches take the op of the eager
launch of the same name and rank; the rest is outside the ops; totals add up."""

from __future__ import annotations

import math

import torch
from hypothesis import given
from hypothesis import strategies as st

from dsv4hal.demo.step_profile import OP_RANGE, RangeTimer, _range_at, attribute, label_launches, summarise

NAMES = ("gemm", "copy", "_sparse_attn_kernel", "layer_norm")
OPS = (None, "pack_store", "sparse_attention_decode")


def test_replay_launches_take_the_op_of_the_eager_launch_of_the_same_name_and_rank():
    """The i-th replayed launch of a name gets the i-th eager label of that name, whatever the other names do."""
    labels = [("copy", None), ("gemm", None), ("copy", "pack_store"),
              ("_sparse_attn_kernel", "sparse_attention_decode"), ("copy", None)]
    replay = [("gemm", 5.0), ("copy", 1.0), ("copy", 2.0), ("_sparse_attn_kernel", 40.0), ("copy", 3.0)]
    assert attribute(replay, labels) == [None, None, "pack_store", "sparse_attention_decode", None]


def test_launches_the_eager_step_did_not_make_count_outside_the_ops():
    """A name the eager step never launched (a compiled step's fused kernel), or launched fewer times, is outside."""
    labels = [("copy", "pack_store")]
    replay = [("copy", 1.0), ("copy", 1.0), ("triton_poi_fused_add_0", 2.0)]
    assert attribute(replay, labels) == ["pack_store", None, None]


@given(st.lists(st.tuples(st.sampled_from(NAMES), st.floats(0.0, 100.0)), max_size=40),
       st.lists(st.tuples(st.sampled_from(NAMES), st.sampled_from(OPS)), max_size=40))
def test_summary_splits_the_replay_time_between_the_ops_and_the_rest(replay, labels):
    """In-op time plus outside time is the replay's kernel time; launches likewise; the outside list's names are
    exactly the names of unattributed launches."""
    ops = attribute(replay, labels)
    s = summarise(replay, ops)
    in_us = sum(v["us"] for v in s["in_ops"].values())
    total = sum(t for _, t in replay)
    assert math.isclose(in_us + s["outside_ops"]["us"], total, abs_tol=0.01 * (len(replay) + 1))
    assert sum(v["launches"] for v in s["in_ops"].values()) + s["outside_ops"]["launches"] == len(replay)
    outside = {n for (n, _), op in zip(replay, ops) if op is None}
    assert {k["kernel"] for k in s["outside_ops"]["top"]} == outside
    assert set(s["in_ops"]) == {op for op in ops if op is not None}


def test_summary_without_attribution_lists_kernels_only():
    """With no eager labels the summary is the per-kernel totals alone (no in_ops / outside_ops keys)."""
    s = summarise([("gemm", 2.0), ("gemm", 3.0), ("copy", 1.0)])
    assert s["kernels_us"] == 6.0 and s["kernel_launches"] == 3
    assert s["top"][0] == {"kernel": "gemm", "calls": 2, "us": 5.0}
    assert "in_ops" not in s and "outside_ops" not in s


def test_host_time_maps_to_the_op_range_that_holds_it():
    """A launch inside an op's host range is that op's; between or after ranges it is no op's."""
    ranges = [(10.0, 20.0, "mhc_pre"), (30.0, 31.0, "pack_store")]
    assert _range_at(ranges, 10.0) == "mhc_pre"
    assert _range_at(ranges, 19.5) == "mhc_pre"
    assert _range_at(ranges, 25.0) is None
    assert _range_at(ranges, 30.5) == "pack_store"
    assert _range_at(ranges, 5.0) is None and _range_at(ranges, 40.0) is None


def test_range_timer_names_each_op_call_in_the_profile():
    """On the CPU the RangeTimer's ranges appear in a profile under the op's name."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with RangeTimer()("pack_store"):
            torch.ones(4).add_(1)
    assert any(e.name == OP_RANGE + "pack_store" for e in prof.events())


def test_each_kernel_takes_the_op_whose_range_holds_its_launch_call():
    """A kernel is labelled by the launch call with its correlation id (a Triton launch has no torch op around it):
    inside an op's host range it is that op's; a call outside every range, or no matching call, labels it None."""
    ranges = [(10.0, 20.0, "moe_experts"), (30.0, 40.0, "pack_store")]
    launched_at = {7: 12.0, 8: 25.0, 9: 31.0}
    kernels = [("_mx_gate_up_swapped", 7), ("nvjet_gemm", 8), ("_pack_store_kernel", 9), ("orphan", 99)]
    assert label_launches(kernels, launched_at, ranges) == [
        ("_mx_gate_up_swapped", "moe_experts"), ("nvjet_gemm", None), ("_pack_store_kernel", "pack_store"),
        ("orphan", None)]
