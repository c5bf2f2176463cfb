"""L2 prefetch hints for Triton kernels on NVIDIA GPUs (PTX `prefetch.global.L2::evict_last`): a kernel asks L2 for
lines it will read later, holding no registers for them. Only for kernels compiled for NVIDIA (not the interpreter,
not ROCm): callers gate it by a constexpr."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def prefetch_l2(ptrs):
    """Ask L2 for the lines at ptrs (any shape) and to keep them (evict_last): a hint that writes nothing and never
    faults; every address must still lie inside the caller's buffers."""
    tl.inline_asm_elementwise("prefetch.global.L2::evict_last [$1];\n\tmov.u32 $0, 0;", "=r,l", [ptrs],
                              dtype=tl.int32, is_pure=False, pack=1)
