"""dsv4hal.kernels.moe_align: routes grouped by expert in blocks (vLLM's moe_align_block_size contract, shared by
the Triton fused MoE, Marlin and DeepGEMM paths), against a Python oracle."""

from __future__ import annotations

import pytest
import torch
from conftest import TRITON_DEVICE

from dsv4hal.kernels.aligned_routes import route_blocks, route_capacity
from dsv4hal.kernels.moe_align import align_routes


def _oracle(ids: list[list[int]], e: int, bs: int):  # noqa: ANN202
    numel = sum(len(r) for r in ids)
    k = len(ids[0]) if ids else 0
    per = {x: [t * k + j for t, row in enumerate(ids) for j, v in enumerate(row) if v == x] for x in range(e)}
    sorted_ids, experts = [], []
    for x in range(e):
        seg = per[x] + [numel] * ((-len(per[x])) % bs)
        sorted_ids += seg
        experts += [x] * (len(seg) // bs)
    return sorted_ids, experts, len(sorted_ids)


@pytest.mark.parametrize("t,k,e,bs", [(1, 6, 16, 8), (5, 6, 16, 16), (40, 6, 8, 16), (3, 2, 4, 64), (64, 6, 256, 8),
                                      (2, 1, 1, 16)])
def test_align_tokens_to_experts(t: int, k: int, e: int, bs: int) -> None:
    """align_routes groups routes into expert blocks padded to the block size."""
    gen = torch.Generator().manual_seed(t * 131 + e)
    ids = torch.randint(0, e, (t, k), generator=gen, dtype=torch.int32)
    r = align_routes(ids, e, bs)
    sorted_ids, expert_ids, total = r.sorted_routes, r.block_expert, r.num_padded
    cap = route_blocks(t * k, e, bs) * bs
    assert sorted_ids.dtype == expert_ids.dtype == total.dtype == r.expert_end.dtype == torch.int32
    assert sorted_ids.shape == (cap,) and expert_ids.shape == (cap // bs,) and total.shape == (1,)
    assert r.expert_end.shape == (e,)
    want_sorted, want_experts, want_total = _oracle(ids.tolist(), e, bs)
    n = int(total)
    assert n == want_total and n % bs == 0 and n <= cap
    assert sorted_ids[:n].tolist() == want_sorted  # ascending inside each expert
    assert (sorted_ids[n:] == t * k).all()
    assert expert_ids[: n // bs].tolist() == want_experts and (expert_ids[n // bs:] == -1).all()
    real = sorted_ids[sorted_ids < t * k]
    assert sorted(real.tolist()) == list(range(t * k))  # every (token, slot) exactly once
    for b in range(n // bs):  # every block holds routes of its expert only
        blk = sorted_ids[b * bs:(b + 1) * bs]
        blk = blk[blk < t * k].long()
        assert (ids.flatten()[blk] == expert_ids[b]).all()


def test_align_drops_invalid_ids() -> None:
    """align_routes drops -1 and out-of-range expert ids."""
    ids = torch.tensor([[0, -1], [3, 1], [-1, 0]], dtype=torch.int32)
    r = align_routes(ids, 2, 4)
    sorted_ids, expert_ids, total = r.sorted_routes, r.block_expert, r.num_padded  # id 3 >= E is dropped too
    assert int(total) == 8
    assert sorted_ids[:8].tolist() == [0, 5, 6, 6, 3, 6, 6, 6] and (sorted_ids[8:] == 6).all()
    assert expert_ids.tolist()[:2] == [0, 1] and (expert_ids[2:] == -1).all()


def test_capacity_matches_vllm_allocation() -> None:
    """route_capacity matches vLLM's allocation formula."""
    assert route_capacity(6, 256, 8) == 48  # numel < E: min(numel * bs, numel + E*(bs-1))
    assert route_capacity(384, 256, 16) == 384 + 256 * 15


def test_blocks_group_routes_by_expert_stably() -> None:
    """Each block holds one expert's routes in token order."""
    gen = torch.Generator().manual_seed(5)
    t, k, e, bm = 9, 3, 5, 4
    ids = torch.randint(-1, e, (t, k), generator=gen, dtype=torch.int32)
    ids[0] = torch.tensor([3, 3, -1], dtype=torch.int32)
    r = align_routes(ids, e, bm)
    sorted_pairs, block_expert = r.sorted_routes, r.block_expert
    nb = route_blocks(t * k, e, bm)
    assert sorted_pairs.shape == (nb * bm,) and block_expert.shape == (nb,)
    flat = ids.reshape(-1)
    seen = []
    for b in range(nb):
        rows = sorted_pairs[b * bm:(b + 1) * bm]
        real = rows[rows < t * k]
        if int(block_expert[b]) < 0:
            assert real.numel() == 0
            continue
        assert real.numel() > 0 and bool((flat[real.long()] == block_expert[b]).all())
        assert torch.equal(real, real.sort().values)  # stable: pair order kept within an expert
        seen += real.tolist()
    assert sorted(seen) == (flat >= 0).nonzero().squeeze(1).tolist()  # each valid pair exactly once
    used = block_expert[block_expert >= 0]
    assert torch.equal(used, used.sort().values)


def test_row_of_route_inverts_sorted_routes() -> None:
    """row_of_route maps each valid route back to its sorted row."""
    gen = torch.Generator().manual_seed(11)
    t, k, e, bs = 7, 6, 9, 8
    ids = torch.randint(-1, e + 2, (t, k), generator=gen, dtype=torch.int32)
    r = align_routes(ids, e, bs)
    flat = ids.reshape(-1)
    valid = (flat >= 0) & (flat < e)
    rows = r.sorted_routes.numel()
    assert bool((r.row_of_route[~valid] == rows).all())
    assert torch.equal(r.sorted_routes[r.row_of_route[valid]].long(), valid.nonzero().squeeze(1))


def test_combine_routes_sums_weighted_rows_and_skips_dropped() -> None:
    """combine_routes sums weighted rows and never reads a dropped route's row."""
    from dsv4hal.kernels.triton.moe_combine import combine_routes

    gen = torch.Generator().manual_seed(2)
    y = torch.randn(10, 1500, generator=gen).bfloat16()  # H over one 1024 block: two column blocks, masked tail
    y[9] = float("nan")  # a never-written row: must not leak through a dropped route
    rows = torch.tensor([[0, 9, 3], [9, 9, 9], [2, 2, 5]])
    w = torch.rand(3, 3, generator=gen)
    out = combine_routes(y.to(TRITON_DEVICE), rows.to(TRITON_DEVICE), w.to(TRITON_DEVICE), 9).cpu()
    want = torch.zeros(3, 1500, dtype=torch.float64)
    for t in range(3):
        for j in range(3):
            if rows[t, j] < 9:
                want[t] += w[t, j].double() * y[rows[t, j]].double()
    assert out.dtype == torch.bfloat16 and bool(torch.isfinite(out).all())
    assert torch.allclose(out.double(), want, rtol=1e-2, atol=1e-2) and bool((out[1] == 0).all())
    unweighted = combine_routes(y.to(TRITON_DEVICE), rows.to(TRITON_DEVICE), None, 9).cpu()
    assert torch.allclose(unweighted[2].double(), (2 * y[2].double() + y[5].double()), rtol=1e-2, atol=1e-2)


def _check_expert_ends(ids: torch.Tensor, e: int, bs: int, impl: str) -> None:
    """expert_end (DeepGEMM's psum layout) against the routes: expert x starts at the aligned end of expert x - 1
    (0 for the first), holds exactly its routes, in ascending order, and ends unaligned after the last of them."""
    r = align_routes(ids.to(TRITON_DEVICE) if impl == "triton" else ids, e, bs, impl=impl)  # type: ignore[arg-type]
    flat = ids.reshape(-1).long().cpu()
    numel = flat.numel()
    ends = r.expert_end.cpu()
    assert ends.dtype == torch.int32 and ends.shape == (e,) and ends.is_contiguous()
    sorted_routes, row_of_route = r.sorted_routes.cpu(), r.row_of_route.cpu()
    start = 0
    for x in range(e):
        end = int(ends[x])
        mine = (flat == x).nonzero().squeeze(1)
        assert start % bs == 0 and end - start == mine.numel()  # start aligned; end = start + count
        assert torch.equal(sorted_routes[start:end].long(), mine)  # exactly its routes, ascending
        aligned = -(-end // bs) * bs
        assert bool((sorted_routes[end:aligned] == numel).all())  # then padding up to the next start
        assert bool(((row_of_route[mine] >= start) & (row_of_route[mine] < end)).all())
        assert bool((r.block_expert.cpu()[start // bs:aligned // bs] == x).all())
        start = aligned  # align(expert_end[x], block) == start of expert x + 1
    assert start == int(r.num_padded)


@pytest.mark.parametrize("impl", ["torch", "triton"])
@pytest.mark.parametrize("t,k,e,bs", [(1, 6, 16, 8), (3, 6, 256, 128), (40, 6, 8, 16), (64, 4, 5, 128),
                                      (300, 3, 6, 128), (9, 2, 4, 1), (7, 3, 5, 3)])
def test_expert_end_is_the_psum_layout(impl: str, t: int, k: int, e: int, bs: int) -> None:
    """expert_end is the prefix sum of padded expert rows, in torch and Triton."""
    if impl == "triton":
        pytest.importorskip("triton")
    gen = torch.Generator().manual_seed(t * 17 + e)
    ids = torch.randint(-1, e + 2, (t, k), generator=gen, dtype=torch.int32)  # dropped ids on both sides
    ids[ids == min(2, e - 1)] = -1  # an empty expert between non-empty ones
    _check_expert_ends(ids, e, bs, impl)


@pytest.mark.parametrize("impl", ["torch", "triton"])
def test_expert_end_when_nothing_is_routed(impl: str) -> None:
    """expert_end is all zeros when no route is valid."""
    if impl == "triton":
        pytest.importorskip("triton")
    for ids in (torch.zeros(0, 6, dtype=torch.int32), torch.full((4, 2), -1, dtype=torch.int32)):
        r = align_routes(ids.to(TRITON_DEVICE) if impl == "triton" else ids, 8, 16, impl=impl)  # type: ignore[arg-type]
        assert r.expert_end.tolist() == [0] * 8
