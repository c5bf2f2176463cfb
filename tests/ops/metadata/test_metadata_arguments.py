"""build_attention_metadata with bad tables: a strided out, an empty full_to_swa, bad ids of pages in use (a typed
error when checked, bounded reads and the reference's rows when not), -1 entries past a row's pages."""

from __future__ import annotations

import dataclasses

import op_args
import pytest
import torch
from op_args import DEV, I32_MIN

from dsv4hal.errors import InvalidArgumentError
from dsv4hal.kernels.triton import attention_metadata as tri_meta
from dsv4hal.reference import attention_metadata as ref_meta

pytest.importorskip("triton")


def test_row_strided_page_table_is_taken(reference_unchecked) -> None:  # noqa: ANN001
    """Only the last dimension of the page table must be dense: build_attention_metadata takes its row stride."""
    out = reference_unchecked.ops.build_attention_metadata(
        **{**op_args.meta(), "page_table": op_args.strided(op_args.meta()["page_table"], 0)})
    assert torch.equal(out.swa_indices, ref_meta.build_attention_metadata(**op_args.meta()).swa_indices)


def test_metadata_out_must_be_contiguous(reference_unchecked) -> None:  # noqa: ANN001
    """A strided out tensor passed to build_attention_metadata is refused by its field name."""
    args = op_args.meta()
    out = ref_meta.build_attention_metadata(**args)
    out.swa_indices = op_args.strided(out.swa_indices, 0)
    with pytest.raises(InvalidArgumentError, match="out.swa_indices"):
        reference_unchecked.ops.build_attention_metadata(**args, out=out)


def test_metadata_empty_full_to_swa(triton_checked, reference_checked) -> None:  # noqa: ANN001
    """An empty full_to_swa table is refused by name before any kernel reads it."""
    args = {**op_args.meta(), "full_to_swa": torch.zeros(0, dtype=torch.int32, device=DEV)}
    for p in (reference_checked, triton_checked):  # refused before the Triton kernel reads the empty table
        with pytest.raises(InvalidArgumentError) as e:
            p.ops.build_attention_metadata(**args)
        assert e.value.argument == "full_to_swa"
    # unchecked: no read outside the (empty) table; the window entries are -1, as the reference says
    got, want = tri_meta.build_attention_metadata(**args), ref_meta.build_attention_metadata(**args)
    for f in dataclasses.fields(want):
        assert torch.equal(getattr(got, f.name), getattr(want, f.name)), f.name
    assert bool((got.swa_indices == -1).all())


@pytest.mark.parametrize(("row", "col", "value"), [(1, 1, -1), (1, 1, -7), (2, 2, I32_MIN), (2, 2, 3)])
def test_metadata_bad_page_ids(reference_checked, triton_checked, row, col, value) -> None:  # noqa: ANN001
    """Bad ids of pages in use (negative, past full_to_swa): a typed error when checked, the reference's rows if not."""
    args = op_args.meta()
    args["page_table"][row, col] = value
    for p in (reference_checked, triton_checked):
        with pytest.raises(InvalidArgumentError) as e:
            p.ops.build_attention_metadata(**args)
        assert e.value.argument in ("page_table", "full_to_swa")
    got, want = tri_meta.build_attention_metadata(**args), ref_meta.build_attention_metadata(**args)
    for f in dataclasses.fields(want):  # unchecked: bounded reads, and both say the same
        assert torch.equal(getattr(got, f.name), getattr(want, f.name)), f.name


def test_metadata_unused_table_entries_may_be_minus_one(reference_checked) -> None:  # noqa: ANN001
    """Checked build_attention_metadata accepts -1 in page-table entries past a row's pages."""
    args = op_args.meta(2)  # positions 5 and 300: pages 0 and 0..1 are used; page 2 is not
    args["page_table"][:, 2] = -1
    reference_checked.ops.build_attention_metadata(**args)
