#!/usr/bin/env bash
# The H200 plan of the twentieth session (2026-12-04): results straight into the call's output folder ($R=$OUT); at
# most 8 files come back from a call, so logs stay in /tmp and their tails go to the part's log.
#   R=$OUT bash bench/run_h200_session21.sh fast     # the FP8 MoE's SwiGLU pass with approximate exp and division:
#                                                    # GPU tests of the quantizers (a NaN carried as FP8's NaN), the
#                                                    # pass both ways on GEMM1's output and the whole call
#                                                    # (bench/sweep_moe_quant.py --fast-swiglu), moe_experts'
#                                                    # conformance (auto; DeepGEMM's per-row layout forced; the
#                                                    # nan-token cases through every implementation, forced)
#   R=$OUT bash bench/run_h200_session21.sh bench    # dsv4hal bench moe --quick, the yardstick demo
#   R=$OUT bash bench/run_h200_session21.sh bench2   # GPU tests of the quantizers and triton_kernels' binding,
#                                                    # its conformance (SwiGLU with NaN), the scatter over tiles,
#                                                    # dsv4hal bench moe --quick, the yardstick demo
#   R=$OUT bash bench/run_h200_session21.sh final    # the whole conformance catalog (nan-token cases in it) as three
#                                                    # reports side by side, a 1-minute soak, bench moe --quick
#   R=$OUT bash bench/run_h200_session21.sh soak2    # a 2-minute soak
set -uo pipefail
part=${1:?fast, bench, bench2, final or soak2}
source bench/h200_env.sh
if [[ $part == fast ]]; then
  { stamp "GPU tests: the FP8 quantizers (fast SwiGLU, NaN codes), the FP8 codec, the DeepGEMM glue"
    gpu_tests 150 fast tests/test_moe_quant_rows.py tests/test_fp8_codec.py tests/test_deepgemm_moe.py
    grep -E "^E  " /tmp/pytest-fast.log | head -8 | cut -c1-600
    stamp "FP8 MoE at T = 4096: the SwiGLU pass exact against fast, the gather launches, the call both ways"
    timeout 200 python3 bench/sweep_moe_quant.py --fast-swiglu --tokens 4096 --json "$R/sweep-moe-fast-swiglu.json" \
      > /tmp/fast.log 2>&1
    echo "rc=$?"; grep -v Warn /tmp/fast.log | tail -25 | cut -c1-400
    stamp "conformance: moe_experts (auto selection), eager and graph"
    conform 200 conformance-cuda_sm90-moe-fast moe_experts
    stamp "conformance: moe_experts through DeepGEMM's per-row layout (forced), fp8_block and nan-token cases"
    DSV4HAL_KERNELS=moe_experts=deepgemm_fp8_sm90 timeout 100 $D conformance --platform cuda_sm90 --ops moe_experts \
      --cases 'fp8_block|nan-token' --json "$R/conformance-cuda_sm90-moe-deepgemm_fp8_sm90-fast.json" --quiet \
      > /tmp/conf-rowlayout.log 2>&1
    echo "rc=$?"; tail -2 /tmp/conf-rowlayout.log | cut -c1-300
    for impl in $(python3 -c "import dsv4hal
p = dsv4hal.select_platform()
print(' '.join(k.name for k in p.registry.kernels_for('moe_experts') if k.name.endswith(('_sm90', '_moe'))))" 2>/dev/null); do
      stamp "nan-token cases through $impl (forced)"
      DSV4HAL_KERNELS=moe_experts=$impl timeout 60 $D conformance --platform cuda_sm90 --ops moe_experts \
        --cases 'nan-token' > /tmp/conf-nan-$impl.log 2>&1
      echo "rc=$?"; grep -E "fail|NaN rows" /tmp/conf-nan-$impl.log | head -4 | cut -c1-300; tail -1 /tmp/conf-nan-$impl.log
    done
  } 2>&1 | tee "$R/log-fast21.txt"
fi
if [[ $part == bench ]]; then
  { bench_moe_quick 260
    stamp "demo (as selected)"; demo_flash 150 demo-flash
  } 2>&1 | tee "$R/log-bench21.txt"
fi
if [[ $part == bench2 ]]; then
  { stamp "GPU tests: the FP8 quantizers (the scatter's launches), triton_kernels' binding"
    gpu_tests 120 bench2 tests/test_moe_quant_rows.py tests/test_oai_triton_moe.py
    grep -E "^E  " /tmp/pytest-bench2.log | head -8 | cut -c1-600
    stamp "conformance: moe_experts through triton_kernels_mxfp4_sm90 (forced; its SwiGLU now propagates NaN)"
    DSV4HAL_KERNELS=moe_experts=triton_kernels_mxfp4_sm90 timeout 100 $D conformance --platform cuda_sm90 \
      --ops moe_experts --cases 'mxfp4|nan-token' --json "$R/conformance-cuda_sm90-moe-triton_kernels-nan.json" \
      --quiet > /tmp/conf-tk.log 2>&1
    echo "rc=$?"; tail -2 /tmp/conf-tk.log | cut -c1-300
    stamp "the gather pass's scatter over tiles and warps (bench/sweep_moe_quant.py --scatter-grid)"
    timeout 60 python3 bench/sweep_moe_quant.py --scatter-grid --tokens 4096,256 \
      --json "$R/sweep-moe-scatter-grid.json" > /tmp/scatter.log 2>&1
    echo "rc=$?"; grep -v Warn /tmp/scatter.log | tail -24 | cut -c1-300
    bench_moe_quick 240
    stamp "demo (as selected)"; demo_flash 130 demo-flash
  } 2>&1 | tee "$R/log-bench21.txt"
fi
if [[ $part == final ]]; then
  { conform_all 300 conformance-cuda_sm90-final
    soak_1min 100
    bench_moe_quick 160
  } 2>&1 | tee "$R/log-final21.txt"
fi
if [[ $part == soak2 ]]; then
  { stamp "soak, 2 minutes (the final call's 1-minute soak failed its memory ceiling: more rounds)"
    timeout 170 $D soak --minutes 2 --json "$R/soak-2min.json" > /tmp/soak2.log 2>&1
    echo "rc=$?"; grep -v Warn /tmp/soak2.log | tail -5 | cut -c1-400
  } 2>&1 | tee "$R/log-soak21.txt"
fi
