"""indexer_logits on SM100 through DeepGEMM's paged MQA logits: the Hopper plugin's binding
(dsv4hal_cuda_sm90.deepgemm_indexer), called rather than copied. DeepGEMM 891d57b dispatches the same
`fp8_paged_mqa_logits` entry to its SM100 kernel with the same host checks (csrc/apis/attention.hpp): FP8 q
e4m3fn, 32/64 heads, fused cache [blocks, block_kv, 1, D+4] SoA per block, 2-D context lengths.

What SM100 adds and why it is not used here: block_kv 32 (dsv4hal's indexer pages are 64); the FP4 indexer
(`fp8_fp4_paged_mqa_logits` with q scales and a 68-byte cache row of D/2 packed nibbles + UE8M0 scales), which is
another cache format than the 132-byte FP8 rows of this contract; bf16 logits (`logits_dtype`), while the
contract returns fp32. The output is DeepGEMM's own buffer (row stride aligned to 256 entries = 1024 bytes), so
its stride alignment needs nothing from the caller. Not run here (no Blackwell GPU)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from dsv4hal_cuda_sm90 import deepgemm_indexer as hopper

if TYPE_CHECKING:
    from dsv4hal.hardware import PlatformInfo
    from dsv4hal.registry import Registry

NAME = "deepgemm_paged_mqa_logits_sm100"
BLOCK_KVS = (32, 64)  # SM100 fp8_paged_mqa_logits: block_kv == 32 or 64

indexer_logits = hopper.indexer_logits  # same marshalling; DeepGEMM picks the SM100 kernel from the device


def supports(case: Mapping[str, object], info: PlatformInfo) -> list[str]:
    return hopper.supports(case, info, arch="SM100", block_kvs=BLOCK_KVS)


def register_deepgemm_indexer(registry: Registry) -> None:
    from dsv4hal.registry import KernelImpl

    registry.add_kernel(KernelImpl(
        op="indexer_logits", name=NAME, target="dsv4hal_cuda_sm100.deepgemm_indexer:indexer_logits",
        platforms=("cuda_sm100",), priority=300, tier="vendor", requires=(hopper.LIBRARY, "triton"),
        supports=supports, layout="indexer-132-e4m3fn",
        description="DeepGEMM fp8_paged_mqa_logits (SM100 kernel) over a zero-copy view of the 132-byte cache "
                    "(next_n 1), Triton -inf tail"))
