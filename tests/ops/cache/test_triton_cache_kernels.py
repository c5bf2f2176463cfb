"""The portable Triton kernels, run through the platform with a forced override (under the interpreter on
CPU machines, natively on a GPU) and checked on the conformance catalog against the reference."""

from __future__ import annotations

import pytest
import torch

import dsv4hal
from dsv4hal.conformance.runner import load_catalog, run_cell

pytest.importorskip("triton")

FORCED = {"pack_store": "triton_pack_store", "dequant_gather": "triton_dequant_gather",
          "indexer_topk": "triton_radix_topk", "sparse_attention_decode": "triton_sparse_decode",
          "sparse_attention_prefill": "triton_sparse_prefill",
          "build_attention_metadata": "triton_attention_metadata", "moe_route": "triton_moe_route"}
# attention under the interpreter is slow: a subset covering each ratio, both FP8 flavours and the edges
ATTENTION_SUBSET = {"swa/extend-prefix-within-window", "swa/decode-multi-request", "c4/decode-beyond-topk",
                    "c128/extend-prefix128", "edge/sink+inf", "edge/empty-rows", "edge/all-indices-invalid",
                    "edge/h128-topk1024", "fnuz/converted-c4-decode", "fnuz/native-c4-decode"}


def _small(spec) -> bool:  # noqa: ANN001
    if spec.op.startswith("sparse_attention") and not torch.cuda.is_available():
        return spec.name in ATTENTION_SUBSET
    return not spec.gpu_only and "1000" not in spec.name


@pytest.fixture(scope="module")
def platform():  # noqa: ANN201
    with dsv4hal.overrides(kernels=FORCED):
        p = dsv4hal.select_platform()
    assert p.explain("pack_store").chosen.name == "triton_pack_store"
    return p


CATALOG = [(s, b) for s, b in load_catalog(FORCED) if _small(s)]


@pytest.mark.parametrize(("spec", "build"), CATALOG, ids=[f"{s.op}:{s.name}" for s, _ in CATALOG])
def test_triton_cache_kernels_match_reference(platform, spec, build) -> None:  # noqa: ANN001
    """The Triton cache kernels pass every pack_store and dequant_gather catalog case."""
    cell = run_cell(platform, spec, build, "eager")
    assert cell.implementation == FORCED[spec.op]
    assert cell.status == "pass", cell.detail


def test_triton_not_chosen_on_cpu_without_override() -> None:
    """On a CPU machine triton_pack_store is a candidate but not chosen."""
    p = dsv4hal.select_platform()
    if p.info.is_gpu:
        pytest.skip("GPU machine")
    d = p.explain("pack_store")
    assert d.chosen.name == "torch_reference"
    assert any(c.name == "triton_pack_store" for c in d.candidates)


def test_pack_store_is_graph_safe_shape() -> None:
    """No allocation in pack_store: it returns None and writes in place."""
    from dsv4hal.formats.v4_cache import V4PagedCache
    from dsv4hal.kernels.triton.v4_cache_kernels import pack_store

    cache = V4PagedCache.empty(1, 64)
    assert pack_store(torch.zeros(0, 512, dtype=torch.bfloat16), torch.zeros(0, dtype=torch.int64), cache) is None
    assert int(cache.data.sum()) == 0
