"""tp_all_reduce over gloo processes: the sum, the fused-in-sequence mHC post, DP-attention padding to the largest
rank, backend selection, and bad input raising TensorParallelError on every rank. Every collective is bounded by
the process group's timeout and the join by run_ranks'."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from conftest import collective_error

import dsv4hal
from dsv4hal.distributed.spawn import ok_results, run_ranks
from dsv4hal.errors import UnsupportedCaseError

H = 32


def _rows(rank: int, t: int = 3) -> torch.Tensor:
    return (torch.randn(t, H, generator=torch.Generator().manual_seed(rank)) * 2).to(torch.float32)


def _sum_worker(rank: int, world: int) -> dict[str, Any]:
    import torch.distributed as dist

    from dsv4hal.distributed.tp import pad_to_largest_rank

    cpu = dsv4hal.select_platform("cpu")
    tp = cpu.tensor_parallel(dist.group.WORLD, hidden=H, dtype="fp32")
    total = tp.all_reduce(_rows(rank).contiguous())
    g = torch.Generator().manual_seed(9)  # the same residual stream and mixing on every rank
    x = torch.randn(3, 4, H, generator=g).bfloat16()
    post, comb = torch.rand(3, 4, generator=g), torch.rand(3, 4, 4, generator=g)
    mixed = tp.all_reduce_mhc_post(_rows(rank), x, post, comb)
    return {"backend": tp.decision.chosen.name, "total": total, "mixed": mixed, "x": x, "post": post, "comb": comb,
            "largest": pad_to_largest_rank(3 if rank == 0 else 7, dist.group.WORLD)}


def test_tp_all_reduce_sums_every_rank_and_mhc_post_follows_on_two_gloo_ranks() -> None:
    """Two gloo ranks get the sum of both ranks' rows from torch_all_reduce; all_reduce_mhc_post equals mhc_post of
    that sum rounded once; pad_to_largest_rank returns the largest rank's token count on both."""
    ranks = ok_results(run_ranks(_sum_worker, 2, timeout_s=15, join_timeout_s=120))
    want = sum(_rows(r) for r in range(2))
    mhc_post = dsv4hal.select_platform("cpu").ops.mhc_post
    for res in ranks:
        assert res["backend"] == "torch_all_reduce" and res["largest"] == 7
        assert torch.allclose(res["total"], want, rtol=0, atol=1e-6)
        expected = mhc_post(want.bfloat16(), res["x"], res["post"], res["comb"])
        assert torch.equal(res["mixed"], expected)


def _errors_worker(rank: int, world: int) -> dict[str, str]:
    import torch.distributed as dist

    cpu, g = dsv4hal.select_platform("cpu"), dist.group.WORLD
    out = {"world": collective_error(lambda: cpu.tensor_parallel(g, hidden=H, world_size=4 if rank == 1 else 2)),
           "config": collective_error(lambda: cpu.tensor_parallel(g, hidden=2 * H if rank == 1 else H))}
    tp = cpu.tensor_parallel(g, hidden=H, max_tokens=4)
    out["shape"] = collective_error(lambda: tp.all_reduce(torch.zeros(3 if rank == 0 else 2, H, dtype=torch.bfloat16)))
    out["too_many"] = collective_error(lambda: tp.all_reduce(torch.zeros(5, H, dtype=torch.bfloat16)))
    out["after"] = str(tp.all_reduce(torch.ones(2, H, dtype=torch.bfloat16))[0, 0].item())  # the group stays in step
    return out


def test_tp_bad_inputs_raise_tensor_parallel_error_on_every_rank() -> None:
    """A world size other than the group's, a hidden size that differs between ranks, a tensor whose shape differs
    from rank 0's, and more rows than max_tokens each raise TensorParallelError (with a remedy) on both
    ranks, naming the ranks at fault; the group stays usable afterwards."""
    ranks = ok_results(run_ranks(_errors_worker, 2, timeout_s=15, join_timeout_s=120))
    for got in ranks:
        assert got["world"].startswith("TensorParallelError [1] True") and "world size 4" in got["world"]
        assert got["config"].startswith("TensorParallelError [1] True") and "hidden" in got["config"]
        assert got["shape"].startswith("TensorParallelError [1] True") and "rows" in got["shape"]
        assert got["too_many"].startswith("TensorParallelError [0, 1] True") and "5 rows" in got["too_many"]
        assert got["after"] == "2.0"


def test_tp_all_reduce_backends_are_chosen_and_refused_with_reasons() -> None:
    """One rank takes the loop-back (the tensor itself); a gloo group takes torch_all_reduce; symmetric memory is
    refused on the CPU with its reason, and forcing it is a typed error."""
    cpu = dsv4hal.select_platform("cpu")
    tp = cpu.tensor_parallel(hidden=H)
    x = torch.ones(2, H, dtype=torch.bfloat16)
    assert tp.decision.chosen.name == "loopback" and tp.all_reduce(x) is x
    d = cpu.decide_collective("tp_all_reduce", {"world_size": 2})
    assert d.chosen.name == "torch_all_reduce"
    symm = next(c for c in d.candidates if c.name == "torch_symm_mem")
    assert symm.status == "rejected" and any("NCCL group and CUDA tensors" in r for r in symm.reasons)
    with pytest.raises(UnsupportedCaseError):
        cpu.decide_collective("tp_all_reduce", {"world_size": 2}, forced="torch_symm_mem")
