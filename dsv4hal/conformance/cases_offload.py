"""Conformance catalog of `offload_fetch` (contract in dsv4hal.ops.offload).

The oracle is the pool as a reader sees it, independent of which slot a policy picks: before the call, page p
reads from its working slot when resident (dirty slots hold bytes the host does not have yet) and from the host
otherwise. After the call that logical pool must be unchanged, every selected entry must remap to a slot whose page
holds exactly the selected page's bytes at the same offset, and -1 must stay -1. The state starts partly resident
(some selected pages hit, some slots dirty, some empty), so loads, evictions and write-backs all run. Byte-exact.
"""

from __future__ import annotations

import torch

from dsv4hal.conformance.types import CaseSpec, Fixture, Tolerance
from dsv4hal.formats.offload_state import OffloadState
from dsv4hal.formats.v4_cache import PAGE_SIZE_BY_RATIO, V4PagedCache, page_bytes

OP = "offload_fetch"
TOLERANCES = {OP: Tolerance(0.0, 0.0, "bit-exact: pages are copied, never computed (max_error counts differing "
                                      "bytes and misplaced entries)")}


def _case(name: str, pages: int, working: int, tokens: int, width: int, selected: int, resident: int,
          ratio: int = 4, write: bool = False, dtype: str = "int32", gpu_only: bool = False) -> CaseSpec:
    params = {"pages": pages, "working": working, "tokens": tokens, "width": width, "selected": selected,
              "resident": resident, "write": write, "dtype": dtype}
    return CaseSpec(op=OP, name=name, params=params, compress_ratio=ratio, gpu_only=gpu_only)


CASES: list[CaseSpec] = [
    _case("cold_w8", 32, 8, 2, 64, 6, 0),
    _case("warm_w8", 32, 8, 2, 64, 7, 8),
    _case("partly_resident_w16", 64, 16, 4, 128, 12, 10),
    _case("write_w8", 32, 8, 4, 1, 4, 8, write=True, dtype="int64"),
    _case("c128_w32", 128, 32, 2, 64, 20, 30, ratio=128),
    # a decode step at batch 8 over 128K-token requests: 512 top-k slots each, a working set of a quarter
    _case("decode_b8_quarter", 4096, 1024, 8, 512, 900, 1024, gpu_only=True),
]


def _state(pages: int, working: int, resident: int, dirty_every: int, gen: torch.Generator) -> OffloadState:
    state = OffloadState.empty(pages, working)
    chosen = torch.randperm(pages, generator=gen)[:resident]
    slots = torch.randperm(working, generator=gen)[:resident]
    state.page_map[chosen] = slots.int()
    state.slot_page[slots] = chosen.int()
    state.last_use[slots] = torch.randint(0, 50, (resident,), generator=gen)
    state.loaded_at[slots] = torch.randint(0, 50, (resident,), generator=gen)
    state.dirty[slots[::dirty_every]] = 1
    state.step.fill_(50)
    return state


def _logical(host: torch.Tensor, working: torch.Tensor, page_map: torch.Tensor) -> torch.Tensor:
    """The pool a reader sees: resident pages from their slot, the others from the host."""
    pm = page_map.cpu().long()
    return torch.where((pm >= 0)[:, None], working.cpu()[pm.clamp(min=0)], host.cpu())


def _indices(p: dict, page_size: int, gen: torch.Generator) -> torch.Tensor:
    pages = torch.randperm(p["pages"], generator=gen)[:p["selected"]]
    n = p["tokens"] * p["width"]
    pick = pages[torch.randint(0, pages.numel(), (n,), generator=gen)]
    k = min(n, pages.numel())
    pick[:k] = pages[:k]  # every chosen page is selected at least once
    idx = pick * page_size + torch.randint(0, page_size, (n,), generator=gen)
    idx = torch.where(torch.rand(n, generator=gen) < 0.1, -1, idx)
    return idx.view(p["tokens"], p["width"]).to(getattr(torch, p["dtype"]))


def compare_fetch(got: tuple, expected: tuple) -> tuple[float, bool, str]:
    """got (logical pool after, remapped, working bytes); expected (logical pool before, indices, page size)."""
    pool_after, remapped, working = got
    pool_before, indices, page_size = expected
    changed = int((pool_after != pool_before).sum())
    idx, out = indices.cpu().reshape(-1).long(), remapped.cpu().reshape(-1).long()
    valid = idx >= 0
    misplaced = int(((out >= 0) != valid).sum()) + int(((out % page_size) != (idx % page_size))[valid].sum())
    src_pages = pool_before[(idx[valid] // page_size)]
    dst_pages = working.cpu()[(out[valid].clamp(min=0) // page_size)]
    wrong = int((src_pages != dst_pages).sum())
    err = changed + misplaced + wrong
    if err == 0:
        return 0.0, True, ""
    return float(err), False, (f"{changed} bytes of the pool as read changed, {misplaced} entries misplaced, "
                               f"{wrong} bytes of selected pages differ from the pool's")


def build(spec: CaseSpec, device: torch.device, gen: torch.Generator) -> Fixture:
    p = spec.params
    page_size = PAGE_SIZE_BY_RATIO[spec.compress_ratio or 4]
    nbytes = page_bytes(page_size)
    host = torch.randint(0, 256, (p["pages"], nbytes), generator=gen, dtype=torch.uint8)
    working = torch.randint(0, 256, (p["working"], nbytes), generator=gen, dtype=torch.uint8)
    state = _state(p["pages"], p["working"], p["resident"], 3, gen)
    clean = (state.slot_page >= 0) & (state.dirty == 0)  # a clean resident slot holds its host page's bytes
    working[clean] = host[state.slot_page[clean].long()]
    pool_before = _logical(host, working, state.page_map)
    indices = _indices(p, page_size, gen)
    if device.type == "cuda":
        host = host.pin_memory()
    state_dev = OffloadState(*(getattr(state, f).to(device) for f in ("page_map", "slot_page", "last_use",
                                                                       "loaded_at", "dirty", "step", "stats")))
    args = {"indices": indices.to(device), "host": V4PagedCache(host, page_size),
            "working": V4PagedCache(working.to(device), page_size), "state": state_dev,
            "scores": state_dev.last_use.clone(), "write": p["write"]}

    def extract(ret: torch.Tensor, a: dict) -> tuple:
        wk = a["working"].data
        return _logical(a["host"].data, wk, a["state"].page_map), ret, wk

    return Fixture(args=args, expected=(pool_before, indices, page_size), extract=extract, compare=compare_fetch,
                   tolerance=TOLERANCES[OP])
