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


def compile_sm90(fn: object, types: dict[str, str], constexprs: dict[str, object], aligned: tuple[str, ...] = (),
                 count: tuple[str, ...] = (), **options: object) -> dict:
    """{"ptx_fma": number of fp32 FMAs, "cubin_bytes", and for each PTX fragment in `count` its occurrences} of fn
    compiled for sm_90, or {"error": ...}. `aligned`: the arguments a launch sees divisible by 16 (pointers' and
    ints' values), as Triton specializes them, so accesses vectorize as they would at run time."""
    sig = {**types, **{k: "constexpr" for k in constexprs}}
    names = list(sig)
    attrs = {(names.index(a),): [["tt.divisibility", 16]] for a in aligned}
    try:
        k = triton.compile(ASTSource(fn, sig, constexprs=constexprs, attrs=attrs), target=SM90, options=options)
    except Exception as exc:  # reported, not raised: the caller asserts on it with the message
        return {"error": f"{type(exc).__name__}: {str(exc)[-600:]}"}
    ptx = k.asm["ptx"]
    return {"ptx_fma": ptx.count("fma.rn.f32"), "cubin_bytes": len(k.asm["cubin"]), **{c: ptx.count(c) for c in count}}


LINEAR_COUNTS = ("div.rn.f32", "div.full.f32", "cp.async.cg.shared.global", "wgmma.mma_async", "mma.sync")


def _fp8_linear_checks() -> list[dict]:
    """fp8_linear's kernel (fp8_grouped_linear's too) at a decode tile (16 rows: fp16 MMAs) and a 64-row one (wgmma),
    e4m3fn's FP8 dot and e4m3fnuz's decoded operands; its x quantization's divisions are IEEE (div.rn, no div.full),
    and the weight arrives by 16-byte asynchronous copies (pipelined)."""
    import triton.language as tl

    from dsv4hal.kernels.triton import fp8_linear

    types = {"x_ptr": "*bf16", "stride_xt": "i32", "stride_xg": "i32", "w_ptr": "*u8", "stride_wg": "i32",
             "stride_wn": "i32", "s_ptr": "*fp32", "stride_sg": "i32", "stride_sn": "i32", "stride_sk": "i32",
             "out_ptr": "*bf16", "T": "i32", "G": "i32", "N": "i32", "KB": "i32", "blocks_per_split": "i32"}
    out = []
    for block_m in (16, 64):
        for fnuz in (False, True):
            const = {"BLOCK_M": block_m, "BLOCK_N": fp8_linear.BLOCK, "FNUZ": fnuz, "HW_FP8": not fnuz,
                     "NATIVE": not fnuz, "DOT": tl.float16, "SPLIT": False, "STAGES": fp8_linear.STAGES}
            out.append({"kernel": "fp8_linear", "block_m": block_m, "fnuz": fnuz,
                        **compile_sm90(fp8_linear._fp8_linear_kernel, types, const, num_warps=4, count=LINEAR_COUNTS,
                                       aligned=("x_ptr", "stride_xt", "stride_xg", "w_ptr", "stride_wg",
                                                "stride_wn", "s_ptr", "out_ptr"))})
    return out


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
               "num_routes": "i32", "top_k": "i32", "K": "i32", "align": "i32", "limit": "fp32",
               "groups_per_program": "i32", "row_groups": "i32", "group_stride": "i32"}
    for fast in (False, True):  # the FP8 MoE's SwiGLU pass, torch's roundings and the approximate form
        const = {"BLOCK_R": 4, "BLOCK_G": 4, "GATHER": False, "SWIGLU": True, "CLAMP": True, "POW2": False,
                 "LAYOUT": False, "HW_FP8": True, "STAGES": moe_quant.DENSE_STAGES, "DIRECT": False, "FAST": fast,
                 "EXACT": False}
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
    return out + _fp8_linear_checks() + _sparse_attention_checks() + _mx_swapped_checks()


ATTENTION_COUNTS = ("mul.bf16x2", "wgmma.mma_async", "mma.sync")


def _sparse_attention_checks() -> list[dict]:
    """The sparse attention kernel (split-K, a C4 extra list) at 64 heads a program (wgmma) with the output in one
    program or split over two, and at 16 (mma.sync): the keys are dequantized by bf16 products."""
    from dsv4hal.kernels.triton import sparse_attention

    types = {"q_ptr": "*bf16", "sink_ptr": "*fp32", "out_ptr": "*bf16", "lse_ptr": "*fp32", "part_o_ptr": "*fp32",
             "part_ml_ptr": "*fp32", "a_ptr": "*u8", "a_idx_ptr": "*i32", "a_len_ptr": "*i32", "a_page_bytes": "i64",
             "a_stride_idx": "i32", "W_A": "i32", "b_ptr": "*u8", "b_idx_ptr": "*i32", "b_len_ptr": "*i32",
             "b_page_bytes": "i64", "b_stride_idx": "i32", "W_B": "i32", "H": "i32", "n_kv": "i32", "n_kv_b": "i32",
             "qk_scale": "fp32", "keys_per_split": "i32"}
    aligned = (*(n for n in types if n.endswith("_ptr")), "a_page_bytes", "b_page_bytes", "H")
    out = []
    for block_h, warps, dv_split in ((64, 8, 1), (64, 8, 2), (16, 4, 1)):
        const = {"P_A": 256, "P_B": 64, "FP8": True, "FNUZ": False, "HAS_B": True, "BLOCK_H": block_h, "BK": 32,
                 "DIRECT": False, "DOT_F32": False, "DV_SPLIT": dv_split}
        out.append({"kernel": "sparse_attention", "block_h": block_h, "dv_split": dv_split,
                    **compile_sm90(sparse_attention._sparse_attn_kernel, types, const, aligned=aligned,
                                   count=ATTENTION_COUNTS, num_warps=warps, num_stages=2)})
    return out


def _mx_swapped_checks() -> list[dict]:
    """The swapped MXFP4 MoE kernels as one token launches them (x read as it is, a block a route, gate and up rows
    paired, the down kernel casting its tiles)."""
    from dsv4hal.kernels.triton import fused_moe_swapped as sw

    tiles = {"BLOCK_M": 8, "BLOCK_N": 64, "BLOCK_K": 256, "EVEN_N": True, "ASM": True, "NARROW": False,
             "DIRECT": True, "DOT_F32": False}
    shared = {"sorted_ptr": "*i32", "block_expert_ptr": "*i32", "num_pairs": "i32", "top_k": "i32", "E": "i32"}
    strides = {"stride_we": "i64", "stride_wn": "i32", "stride_se": "i64", "stride_sn": "i32"}
    up_types = {"x_ptr": "*bf16", "w_ptr": "*i16", "s_ptr": "*u8", "h_ptr": "*bf16", "y_ptr": "*fp32", **shared,
                "H": "i32", "I": "i32", "y_numel": "i32", **strides, "limit": "fp32"}
    down_types = {"h_ptr": "*bf16", "w_ptr": "*i16", "s_ptr": "*u8", "y_ptr": "*fp32", "out_ptr": "*bf16",
                  "count_ptr": "*i32", "tw_ptr": "*fp32", **shared, "T": "i32", "H": "i32", "I": "i32", **strides}
    aligned = ("x_ptr", "w_ptr", "s_ptr", "h_ptr", "y_ptr", "out_ptr", "H", "I", "stride_wn", "stride_sn")
    return [
        {"kernel": "mx_gate_up_swapped",
         **compile_sm90(sw._mx_gate_up_swapped, up_types, {"CLAMP": True, **tiles, "PAIR": True, "X_SPLIT": False},
                        num_warps=4, num_stages=3, aligned=tuple(a for a in aligned if a in up_types))},
        {"kernel": "mx_down_swapped",
         **compile_sm90(sw._mx_down_swapped, down_types, {**tiles, "FUSE_CAST": True}, num_warps=4, num_stages=3,
                        aligned=tuple(a for a in aligned if a in down_types))}]


if __name__ == "__main__":
    for row in checks():
        print(json.dumps(row))
