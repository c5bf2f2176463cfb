"""Bad expert-parallel input raises a typed error on every rank of the group, never a hang."""

from __future__ import annotations

from typing import Any

import torch
from conftest import collective_error

from dsv4hal.distributed.spawn import run_ranks

E, H, K = 8, 128, 6


def _errors_worker(rank: int, world: int) -> dict[str, str]:
    import torch.distributed as dist

    import dsv4hal
    from dsv4hal.distributed import ExpertMap, ExpertParallel

    cpu, g = dsv4hal.select_platform("cpu"), dist.group.WORLD

    def build(**kw: Any) -> ExpertParallel:
        args = {"num_experts": E, "hidden": H, "top_k": K, "group": g, "max_tokens_per_rank": 8, "platform": cpu}
        return ExpertParallel(**{**args, **kw})

    out = {"world": collective_error(lambda: build(world_size=4 if rank == 1 else 2))}
    holes = torch.tensor([[0], [1], [2], [-1], [4], [5], [6], [7]], dtype=torch.int32)
    out["map"] = collective_error(lambda: build(expert_map=ExpertMap(holes, 8)))
    out["config"] = collective_error(lambda: build(hidden=256 if rank == 1 else H))
    ep = build()
    t = 9 if rank == 0 else 2
    x = torch.randn(t, H).to(torch.bfloat16)
    ids, w = torch.randint(0, E, (t, K), dtype=torch.int32), torch.rand(t, K)
    out["too_many"] = collective_error(lambda: ep.dispatch(x, ids, w, decode=True))
    d = ep.dispatch(x[:2], ids[:2], w[:2], decode=True)  # the group is still in step after a refused call
    out["after"] = str(tuple(ep.combine(torch.zeros(d.handle.out_rows, H, dtype=torch.bfloat16), d.handle).shape))
    return out


def test_ep_bad_inputs_raise_expert_parallel_error_on_every_rank() -> None:
    """A world size other than the group's, an expert map missing a logical expert, a config that differs between
    ranks, and a batch over max_tokens_per_rank on one rank each raise ExpertParallelError (with a remedy) on both
    ranks, naming the ranks at fault; the group stays usable afterwards."""
    results = run_ranks(_errors_worker, 2, timeout_s=15, join_timeout_s=120)
    assert all(s == "ok" for s, _ in results.values()), results
    for rank in (0, 1):
        got = results[rank][1]
        assert got["world"].startswith("ExpertParallelError [1] True"), got["world"]
        assert "world size 4" in got["world"]
        assert got["map"].startswith("ExpertParallelError [0, 1] True") and "no physical slot" in got["map"]
        assert got["config"].startswith("ExpertParallelError [1] True") and "hidden" in got["config"]
        assert got["too_many"].startswith("ExpertParallelError [0] True") and "9 tokens" in got["too_many"]
        assert got["after"] == "(2, 128)"


def _late_worker(rank: int, world: int) -> str:
    import time

    import dsv4hal
    from dsv4hal.distributed import ExpertParallel

    if rank == 1:  # never joins the setup agreement within the group's timeout
        time.sleep(8)
        return "slept"
    return collective_error(lambda: ExpertParallel(num_experts=E, hidden=H, top_k=K,
                                                   group=torch.distributed.group.WORLD,
                                                   platform=dsv4hal.select_platform("cpu")))


def test_ep_rank_that_never_joins_times_out_into_typed_error() -> None:
    """A rank that does not join the collective makes the others raise ExpertParallelError once the process group's
    timeout passes, rather than wait forever."""
    results = run_ranks(_late_worker, 2, timeout_s=3, join_timeout_s=60)
    assert results[0][0] == "ok" and "timed out" in results[0][1], results[0]
