"""Small valid arguments for each op, on the device the tests run on, for tests that then break one argument
(strided, empty, a bad index), and the platforms they run on: the references or the portable Triton kernels forced,
so that a GPU machine makes the same comparisons as the CPU."""

from __future__ import annotations

import torch

import dsv4hal
from dsv4hal.formats.v4_cache import V4PagedCache
from dsv4hal.reference import pack_store as ref_cache

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")
I32_MIN = -(2**31)
REFERENCE = {op: "torch_reference" for op in dsv4hal.OP_NAMES}
TRITON = {"pack_store": "triton_pack_store", "dequant_gather": "triton_dequant_gather",
          "indexer_topk": "triton_radix_topk", "sparse_attention_decode": "triton_sparse_decode",
          "sparse_attention_prefill": "triton_sparse_prefill",
          "build_attention_metadata": "triton_attention_metadata"}


def forced(kernels: dict[str, str], checked: bool) -> dsv4hal.Platform:
    """The machine's platform with these kernels forced."""
    with dsv4hal.overrides(kernels=kernels):
        return dsv4hal.select_platform(checked=checked)


def cache(pages: int, page_size: int = 256, seed: int = 0) -> V4PagedCache:
    """A V4 cache with every slot written."""
    c = V4PagedCache.empty(pages, page_size, device=DEV)
    n = pages * page_size
    if n:
        g = torch.Generator().manual_seed(seed)
        ref_cache.pack_store(torch.randn(n, 512, generator=g).bfloat16().to(DEV), torch.arange(n, device=DEV), c)
    return c


def decode(t: int = 2, w: int = 64, pages: int = 1, extra: bool = False) -> dict:
    g = torch.Generator().manual_seed(1)
    args = dict(q=torch.randn(t, 64, 512, generator=g).bfloat16().to(DEV), swa_cache=cache(pages),
                swa_indices=torch.randint(0, max(pages * 256, 1), (t, w), generator=g, dtype=torch.int32).to(DEV),
                swa_lengths=torch.full((t,), w, dtype=torch.int32, device=DEV),
                sink=torch.randn(64, generator=g).to(DEV), softmax_scale=512**-0.5)
    if extra:
        args.update(extra_cache=cache(2, 64, seed=2),
                    extra_indices=torch.randint(0, 128, (t, 64), generator=g, dtype=torch.int32).to(DEV),
                    extra_lengths=torch.full((t,), 64, dtype=torch.int32, device=DEV))
    return args


def prefill(t: int = 2, w: int = 64, s: int = 100) -> dict:
    g = torch.Generator().manual_seed(3)
    return dict(q=torch.randn(t, 64, 512, generator=g).bfloat16().to(DEV),
                kv=torch.randn(s, 512, generator=g).bfloat16().to(DEV),
                indices=torch.randint(0, max(s, 1), (t, w), generator=g, dtype=torch.int32).to(DEV),
                lengths=torch.full((t,), w, dtype=torch.int32, device=DEV),
                sink=torch.randn(64, generator=g).to(DEV), softmax_scale=512**-0.5)


def topk(b: int = 2, s: int = 700) -> dict:
    g = torch.Generator().manual_seed(4)
    return dict(scores=torch.randn(b, s, generator=g).to(DEV),
                lengths=torch.full((b,), s, dtype=torch.int32, device=DEV), k=512,
                page_table=torch.randint(0, 64, (b, -(-s // 64)), generator=g, dtype=torch.int32).to(DEV),
                page_size=64)


def meta(t: int = 3) -> dict:
    return dict(positions=torch.tensor([5, 300, 700][:t], dtype=torch.int32, device=DEV),
                page_table=torch.tensor([[2, 0, 1]] * t, dtype=torch.int32, device=DEV).reshape(t, 3),
                full_to_swa=torch.arange(3 * 256, dtype=torch.int32, device=DEV) % 512)


def store(n: int = 4, pages: int = 1, page_size: int = 64) -> dict:
    return dict(k=torch.randn(n, 512).bfloat16().to(DEV), loc=torch.arange(n, device=DEV),
                cache=V4PagedCache.empty(pages, page_size, device=DEV))


def gather(pages: int = 1, n: int = 4) -> dict:
    return {"cache": cache(pages, 64), "loc": torch.arange(n, device=DEV)}


def strided(t: torch.Tensor, dim: int = 0) -> torch.Tensor:
    """Same values, every other element of a twice larger tensor along `dim`."""
    shape = list(t.shape)
    shape[dim] *= 2
    big = torch.zeros(shape, dtype=t.dtype, device=t.device)
    view = big.narrow(dim, 0, shape[dim]).unflatten(dim, (t.shape[dim], 2)).select(dim + 1, 0)
    view.copy_(t)
    return view


def with_entry(args: dict, name: str, value: int) -> dict:
    """args with element 1 of args[name] set to value (a copy)."""
    t = args[name].clone()
    t.view(-1)[1] = value
    return {**args, name: t}
