"""FlashMLA's SM90 sparse-decode plan from one parallel Triton program (dsv4hal.kernels.flashmla_sched) against the
vendor's walk written out (serial_plan), which the H200 checks against sgl-flash-mla's own plan
(bench/check_flashmla_sched.py). Here, under the interpreter: random batches, lengths (zeros, full, ragged), widths
with and without extra keys, partition counts from 1 to more than the requests; and that the walk itself is a
schedule (every block of every request assigned once, num_splits counting the partitions that touch a request)."""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dsv4hal.kernels import flashmla_sched as fs

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available(),
                                reason="the Triton program runs under TRITON_INTERPRET=1 or on a GPU")
DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")


@st.composite
def cases(draw: st.DrawFn) -> tuple:
    b = draw(st.integers(1, 70))
    width = draw(st.sampled_from([64, 128, 512, 1000]))
    extra_width = draw(st.sampled_from([0, 0, 64, 512]))
    parts = draw(st.sampled_from([1, 3, 66, 132, 200]))
    length = st.one_of(st.just(0), st.just(width), st.integers(0, width))
    lengths = draw(st.one_of(st.none(), st.lists(length, min_size=b, max_size=b)))
    extra = None
    if extra_width:
        extra = draw(st.one_of(st.none(), st.lists(st.integers(0, extra_width), min_size=b, max_size=b)))
    return b, width, extra_width, parts, lengths, extra


def _i32(v: list[int] | None) -> torch.Tensor | None:
    return None if v is None else torch.tensor(v, dtype=torch.int32, device=DEV)


@settings(max_examples=40, deadline=None)
@given(cases())
def test_the_parallel_plan_is_the_walks(case: tuple) -> None:
    """The FlashMLA split plan built in parallel equals the serial walk."""
    b, width, extra_width, parts, lengths, extra = case
    rows, splits = fs.serial_plan(lengths if lengths is not None else [width] * b, width, extra, extra_width, parts)
    meta, nsplits, _, _ = fs.make_plan(b, parts, _i32(lengths), width, _i32(extra), extra_width, DEV)
    assert meta.shape == (parts, fs.META_INTS) and nsplits.shape == (b + 1,)
    assert meta[:, :7].tolist() == rows
    assert nsplits.tolist() == splits


@settings(max_examples=60, deadline=None)
@given(cases())
def test_the_walk_is_a_schedule(case: tuple) -> None:
    """Every block of every request lies in exactly one partition's range, and num_splits[r + 1] - num_splits[r]
    is the number of partitions whose range touches request r."""
    b, width, extra_width, parts, lengths, extra = case
    lengths = lengths if lengths is not None else [width] * b
    rows, splits = fs.serial_plan(lengths, width, extra, extra_width, parts)
    xs = extra if extra is not None else [extra_width] * b
    nb = [fs._blocks(fs._keys(lengths[r], extra_width, xs[r])) for r in range(b)]
    owner: dict[tuple[int, int], int] = {}
    touching = [0] * b
    for p, (br, er, bb, eb, _, _, _) in enumerate(rows):
        for r in range(br, min(er, b - 1) + 1):
            lo = bb if r == br else 0
            hi = eb if r == er else nb[r]
            if hi > lo:
                touching[r] += 1
            for blk in range(lo, hi):
                assert (r, blk) not in owner, f"block {blk} of request {r} in partitions {owner[(r, blk)]} and {p}"
                owner[(r, blk)] = p
    assert len(owner) == sum(nb)
    assert [splits[r + 1] - splits[r] for r in range(b)] == touching


@settings(max_examples=25, deadline=None)
@given(cases(), st.data())
def test_lengths_outside_the_widths_are_planned_and_returned_clamped(case: tuple, data: st.DataObject) -> None:
    """Lengths past the index rows or negative (garbage an unchecked call may hold) give the plan of the lengths
    clamped into [0, width], and the plan returns those clamped lengths for the decode to read."""
    b, width, extra_width, parts, _, _ = case
    wild = st.integers(-2**31, 2**31 - 1)
    lengths = data.draw(st.lists(wild, min_size=b, max_size=b))
    extra = data.draw(st.lists(wild, min_size=b, max_size=b)) if extra_width else None
    clamp = [min(max(v, 0), width) for v in lengths]
    xclamp = None if extra is None else [min(max(v, 0), extra_width) for v in extra]
    rows, splits = fs.serial_plan(clamp, width, xclamp, extra_width, parts)
    meta, nsplits, lens, xlens = fs.make_plan(b, parts, _i32(lengths), width, _i32(extra), extra_width, DEV)
    assert meta[:, :7].tolist() == rows and nsplits.tolist() == splits
    assert lens.tolist() == clamp
    assert (xlens is None and extra is None) or xlens.tolist() == xclamp


def test_the_plan_names_the_cases_it_leaves_to_the_op() -> None:
    """plan() makes nothing off a GPU (the op then plans itself); its bound on the line follows the widths."""
    q = torch.zeros(4, 64, 512)
    assert fs.plan(q, None, 128, None, 0) is None
    assert fs.line_bound(64, 128, 512) == 64 * (fs._blocks(128 + 512) + fs.OVERHEAD_SM90)
    assert fs.parts_sm90(132, 1, 64) == 132 and fs.parts_sm90(132, 1, 128) == 66 and fs.parts_sm90(1, 2, 128) == 1


@pytest.mark.parametrize(("b", "width", "extra_width", "parts", "here"), [
    (64, 128, 512, 132, True),  # V4-Flash decode at 64 requests: C4 (960 units)
    (64, 128, 1024, 132, True),  # C128 at 128K (1472 units)
    (128, 128, 512, 66, True),  # V4-Pro heads (128 a query), C4 (1920 units)
    (1, 128, 8192, 132, True),  # one request at 1M
    (64, 128, 8192, 132, False),  # C128 at 1M (8640 units): the op's own planner was faster there
    (1024, 128, 512, 132, False),  # C4 at 1024 requests (15360 units)
    (64, 128, 512, 512, False),  # more partitions than the program takes
])
def test_the_program_plans_the_lines_it_was_faster_on(b: int, width: int, extra_width: int, parts: int,
                                                      here: bool) -> None:
    """planned_here: the parallel program plans lines of up to LINE_MAX units (where it and the decode beat the op
    planning itself on the H100) and leaves longer ones, or too many partitions, to the op."""
    assert fs.planned_here(b, width, extra_width, parts) is here
