"""Compile Triton kernels for sm_90 on any machine, GPU or not (Triton's frontend, its NVIDIA passes and ptxas), and
report what the PTX holds: the interpreter that runs the kernels in CI accepts code the compiler refuses (a constexpr
assigned in a static_range loop passed every interpreter test and failed to compile on the H200) and fuses nothing.

    TRITON_INTERPRET=0 python3 -m dsv4hal.kernels.triton.sm90_compile_check   # one JSON line a kernel setting

Must run with TRITON_INTERPRET unset or 0 (interpreted kernels cannot be compiled). Used by
tests/plugins/triton/test_triton_sm90_compile.py."""

from __future__ import annotations

import json

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

SM90 = GPUTarget("cuda", 90, 32)


def compile_sm90(fn: object, types: dict[str, str], constexprs: dict[str, object], **options: object) -> dict:
    """{"ptx_fma": number of fp32 FMAs, "cubin_bytes"} of fn compiled for sm_90, or {"error": ...}."""
    sig = {**types, **{k: "constexpr" for k in constexprs}}
    try:
        k = triton.compile(ASTSource(fn, sig, constexprs=constexprs), target=SM90, options=options)
    except Exception as exc:  # reported, not raised: the caller asserts on it with the message
        return {"error": f"{type(exc).__name__}: {str(exc)[-600:]}"}
    return {"ptx_fma": k.asm["ptx"].count("fma.rn.f32"), "cubin_bytes": len(k.asm["cubin"])}


def checks() -> list[dict]:
    from dsv4hal.kernels.triton import compress
    from dsv4hal.kernels.triton.indexer_q_prep import BLOCK_H, _q_prep_kernel

    out = []
    q_types = {"q_ptr": "*bf16", "w_ptr": "*fp32", "stride_w": "i32", "cos_ptr": "*fp32", "stride_cos": "i32",
               "sin_ptr": "*fp32", "stride_sin": "i32", "max_pos": "i32", "pos_ptr": "*i32", "q8_ptr": "*u8",
               "w_out_ptr": "*fp32", "fp8_max": "fp32", "fold": "fp32"}
    for fnuz in (False, True):
        for fusion in (False, True):
            const = {"BLOCK_H": BLOCK_H, "FNUZ": fnuz, "HW": not fnuz}
            out.append({"kernel": "indexer_q_prep", "fnuz": fnuz, "fp_fusion": fusion,
                        **compile_sm90(_q_prep_kernel, q_types, const, num_warps=2, enable_fp_fusion=fusion)})
    c_types = {"ks_ptr": "*fp32", "stride_ks": "i32", "ring_ptr": "*fp32", "ring_len": "i32", "n_slots": "i32",
               "cu_ptr": "*i32", "n_req": "i32", "slots_ptr": "*i32", "pos_ptr": "*i32", "ape_ptr": "*fp32",
               "w_ptr": "*fp32", "cos_ptr": "*fp32", "sin_ptr": "*fp32", "stride_rope": "i32", "max_pos": "i32",
               "out_ptr": "*fp32", "eps": "fp32"}
    for ratio, decode in ((4, True), (4, False), (128, False)):
        window, block_r, warps, stages = compress._config(ratio, 128, decode)
        const = {"RATIO": ratio, "WINDOW": window, "HD": 128, "COFF": 2 if ratio == 4 else 1, "DECODE": decode,
                 "HADAMARD": True, "BLOCK_R": block_r, "BLOCK_B": 256, "STAGES": stages}
        out.append({"kernel": "compress (hadamard)", "ratio": ratio, "decode": decode,
                    **compile_sm90(compress._compress_kernel, c_types, const, num_warps=warps)})
    from dsv4hal.kernels.triton import moe_quant

    m_types = {"src_ptr": "*bf16", "stride_src": "i32", "sorted_ptr": "*i32", "q_ptr": "*u8", "sf_ptr": "*fp32",
               "stride_sf_g": "i32", "layout_ptr": "*i32", "block_expert_ptr": "*i32", "rows": "i32",
               "num_routes": "i32", "top_k": "i32", "K": "i32", "align": "i32", "limit": "fp32"}
    for fast in (False, True):  # the FP8 MoE's SwiGLU pass, torch's roundings and the approximate form
        const = {"BLOCK_R": 4, "BLOCK_G": 4, "GATHER": False, "SWIGLU": True, "CLAMP": True, "POW2": False,
                 "LAYOUT": False, "HW_FP8": True, "STAGES": moe_quant.DENSE_STAGES, "DIRECT": False, "FAST": fast}
        out.append({"kernel": "moe_quant (swiglu)", "fast": fast,
                    **compile_sm90(moe_quant._quant_rows_kernel, m_types, const, num_warps=4)})
    s_types = {"x_ptr": "*bf16", "stride_x": "i32", "row_of_route_ptr": "*i64", "q_ptr": "*u8", "sf_ptr": "*fp32",
               "stride_sf_g": "i32", "tokens": "i32", "rows": "i32", "top_k": "i32", "K": "i32"}
    const = {"BLOCK_T": 1, "BLOCK_G": moe_quant.SCATTER_GROUPS, "HW_FP8": True, "STAGES": 1}  # the default launch
    out.append({"kernel": "moe_quant (scatter from tokens)",
                **compile_sm90(moe_quant._quant_scatter_kernel, s_types, const, num_warps=4)})
    from dsv4hal.kernels.triton import moe_align

    const = {"BLOCK_E": 256, "NCP": moe_align.MAX_PROGRAMS, "SE": moe_align.SCAN_ELEMENTS // moe_align.MAX_PROGRAMS}
    out.append({"kernel": "moe_align (scan)",  # E = 256 over the most programs: T = 4096's launch
                **compile_sm90(moe_align._scan_kernel, {"hist_ptr": "*i32", "NC": "i32"}, const, num_warps=4)})
    return out


if __name__ == "__main__":
    for row in checks():
        print(json.dumps(row))
