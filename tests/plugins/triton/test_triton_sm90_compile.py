"""Triton kernels compiled for sm_90 here, without a GPU (dsv4hal.kernels.triton.sm90_compile_check, in a process
without the interpreter): the interpreter CI runs the kernels in accepts code the compiler refuses (a constexpr
assigned in a static_range loop passed every interpreter test and failed on the H200), and fuses nothing. Covered:
the compressor with its Hadamard transform, indexer_q_prep with its butterfly, the FP8 MoE's quantizers (the SwiGLU
pass exact and approximate, the scatter from tokens), the swapped MXFP4 MoE kernels at one token, and that
indexer_q_prep's launch leaves no FMA contraction (its bits are the reference's)."""

from __future__ import annotations

import json
from collections import Counter

import pytest

pytest.importorskip("triton")

from conftest import run_py  # noqa: E402


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    done = run_py("from dsv4hal.kernels.triton.sm90_compile_check import checks; import json\n"
                  "for r in checks(): print(json.dumps(r))", env={"TRITON_INTERPRET": "0"})
    if done.returncode:
        if "backend" in done.stderr.lower() or "ptxas" in done.stderr.lower():
            pytest.skip(f"no sm_90 compiler here: {done.stderr[-300:]}")
        raise AssertionError(done.stderr[-2000:])
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def test_every_kernel_compiles(rows: list[dict]) -> None:
    """Every kernel setting the check names compiles for SM90 to a non-empty cubin."""
    settings = Counter(r["kernel"] for r in rows)
    assert settings == {"indexer_q_prep": 4, "compress (hadamard)": 3, "moe_quant (swiglu)": 2,
                        "moe_quant (scatter from tokens)": 1, "moe_align (scan)": 1, "fp8_linear": 4,
                        "sparse_attention": 3, "mx_gate_up_swapped": 1, "mx_down_swapped": 1}, settings
    for r in rows:
        assert "error" not in r and r["cubin_bytes"] > 0, r


def test_indexer_q_prep_keeps_its_products_apart(rows: list[dict]) -> None:
    """indexer_q_prep compiles without FMA contraction unless fp fusion is on."""
    q = [r for r in rows if r["kernel"] == "indexer_q_prep"]
    assert all(r["ptx_fma"] == 0 for r in q if not r["fp_fusion"])  # as the launch compiles it
    assert all(r["ptx_fma"] > 0 for r in q if r["fp_fusion"])  # the check can fail: fusion would contract RoPE


def test_fp8_linear_quantizes_exactly_and_pipelines_its_weight(rows: list[dict]) -> None:
    """fp8_linear's x quantization divides with div.rn only (the reference's codes, not the approximate div.full),
    its weight tiles come by 16-byte cp.async (pipelined), and 64-row tiles run wgmma, 16-row ones mma.sync."""
    linear = [r for r in rows if r["kernel"] == "fp8_linear"]
    assert len(linear) == 4
    for r in linear:
        assert r["div.rn.f32"] > 0 and r["div.full.f32"] == 0, r
        assert r["cp.async.cg.shared.global"] > 0, r
        assert (r["wgmma.mma_async"] > 0) == (r["block_m"] == 64) and (r["mma.sync"] > 0) == (r["block_m"] == 16), r


def test_sparse_attention_dequantizes_in_bf16(rows: list[dict]) -> None:
    """The attention kernel's keys are scaled by bf16 products (half the registers of fp32 ones), and 64-head
    programs run wgmma, 16-head ones mma.sync."""
    attention = [r for r in rows if r["kernel"] == "sparse_attention"]
    assert len(attention) == 3
    for r in attention:
        assert r["mul.bf16x2"] > 0, r
        assert (r["wgmma.mma_async"] > 0) == (r["block_h"] == 64) and (r["mma.sync"] > 0) == (r["block_h"] == 16), r
