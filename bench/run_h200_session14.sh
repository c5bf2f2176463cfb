#!/usr/bin/env bash
# The H200 plan of the thirteenth session (2026-12-01): results straight into the call's output folder ($R=$OUT); at
# most 8 files come back from a call, so logs stay in /tmp and their tails go to the part's log.
#   R=$OUT bash bench/run_h200_session14.sh mx     # MXFP4 decode MoE: the fused MoE's swapped kernels (first with
#                                                  # tl.dot_scaled, then PTX decode) in tile settings beside Marlin
#                                                  # and triton_kernels (sweep_mx_moe_decode.py); GPU tests
#   R=$OUT bash bench/run_h200_session14.sh mx2    # the swapped kernels as the decode default: the decode tests with
#                                                  # their messages, the default and its neighbours, conformance of
#                                                  # moe_experts with triton_fused_moe forced (eager and graph)
#   R=$OUT bash bench/run_h200_session14.sh final  # the default at block_k 256: decode tests, the default beside
#                                                  # block_m 8 and others (sweep), conformance (triton_fused_moe
#                                                  # forced), dsv4hal bench moe --quick
#   R=$OUT bash bench/run_h200_session14.sh m8     # blocks of 8 routes: tile settings at T = 1 .. 64; decode tests
#   R=$OUT bash bench/run_h200_session14.sh last   # the final defaults (blocks of 8; e2m1's sign in bits): decode
#                                                  # tests, conformance (triton_fused_moe forced), bench moe --quick
#   R=$OUT bash bench/run_h200_session14.sh fma    # the PTX's products as fma with -0 (sm_80+; the same SASS on
#                                                  # sm_90a): decode tests, the row-kernel fallback, the default timed
set -uo pipefail
part=${1:?mx, mx2, final, m8, last or fma}
source bench/h200_env.sh
if [[ $part == mx ]]; then
  {
    stamp "GPU tests: the PTX decode, the swapped kernels"
    gpu_tests 120 mx tests/test_triton_mx_decode.py tests/test_triton_moe.py -k "decode or swapped"
    stamp "MXFP4 decode MoE: swapped kernels, tile settings, beside Marlin and triton_kernels"
    timeout 330 python3 bench/sweep_mx_moe_decode.py --json "$R/sweep-mx-moe-decode-ptx.json" > /tmp/sweep-mx.log 2>&1
    echo "rc=$?"; grep -v Warn /tmp/sweep-mx.log | tail -30 | cut -c1-900
  } 2>&1 | tee "$R/log-mx14.txt"
fi
if [[ $part == mx2 ]]; then
  {
    stamp "GPU tests: the PTX and plain decode, the swapped kernels"
    gpu_tests 120 mx2 tests/test_triton_mx_decode.py tests/test_triton_moe.py -k "decode or swapped"
    grep -E "^E  " /tmp/pytest-mx2.log | head -12 | cut -c1-600
    stamp "MXFP4 decode MoE: the swapped default and its neighbours, beside Marlin and triton_kernels"
    timeout 200 python3 bench/sweep_mx_moe_decode.py --grid final --json "$R/sweep-mx-moe-decode.json" \
      > /tmp/sweep-mx2.log 2>&1
    echo "rc=$?"; grep -v Warn /tmp/sweep-mx2.log | tail -12 | cut -c1-900
    stamp "conformance: moe_experts with triton_fused_moe forced (no full-size V4-Pro), eager and graph"
    DSV4HAL_KERNELS=moe_experts=triton_fused_moe timeout 200 $D conformance --platform cuda_sm90 --ops moe_experts \
      --cases '^(?!pro-(mxfp4|fp8_block)-)' --json "$R/conformance-cuda_sm90-moe-triton-swapped.json" --quiet \
      > /tmp/conf-moe2.log 2>&1
    echo "rc=$?"; tail -3 /tmp/conf-moe2.log | cut -c1-300
  } 2>&1 | tee "$R/log-mx2-14.txt"
fi
if [[ $part == final ]]; then
  {
    stamp "GPU tests: the PTX and plain decode, the swapped kernels"
    gpu_tests 120 final tests/test_triton_mx_decode.py tests/test_triton_moe.py -k "decode or swapped"
    grep -E "^E  " /tmp/pytest-final.log | head -12 | cut -c1-600
    stamp "MXFP4 decode MoE: the default (block_k 256) beside block_m 8 and others, Marlin and triton_kernels"
    timeout 200 python3 bench/sweep_mx_moe_decode.py --grid final --json "$R/sweep-mx-moe-decode-final.json" \
      > /tmp/sweep-mx3.log 2>&1
    echo "rc=$?"; grep -v Warn /tmp/sweep-mx3.log | tail -12 | cut -c1-900
    stamp "conformance: moe_experts with triton_fused_moe forced (no full-size V4-Pro), eager and graph"
    DSV4HAL_KERNELS=moe_experts=triton_fused_moe timeout 200 $D conformance --platform cuda_sm90 --ops moe_experts \
      --cases '^(?!pro-(mxfp4|fp8_block)-)' --json "$R/conformance-cuda_sm90-moe-triton-swapped.json" --quiet \
      > /tmp/conf-moe3.log 2>&1
    echo "rc=$?"; tail -3 /tmp/conf-moe3.log | cut -c1-300
    stamp "MoE: dsv4hal bench moe --quick"
    timeout 240 $D bench moe --quick --json "$R/bench-moe-quick.json" --plot "$R/bench-moe-quick.png" \
      > /tmp/bench-moe.log 2>&1
    echo "rc=$?"; grep -v Warn /tmp/bench-moe.log | tail -12 | cut -c1-400
  } 2>&1 | tee "$R/log-final14.txt"
fi
if [[ $part == m8 ]]; then
  {
    stamp "GPU tests: the PTX and plain decode, the swapped kernels"
    gpu_tests 120 m8 tests/test_triton_mx_decode.py tests/test_triton_moe.py -k "decode or swapped"
    grep -E "^E  " /tmp/pytest-m8.log | head -12 | cut -c1-600
    stamp "MXFP4 decode MoE: blocks of 8 routes, tile settings, beside Marlin and triton_kernels"
    timeout 300 python3 bench/sweep_mx_moe_decode.py --grid m8 --tokens 1,2,4,8,16,64 \
      --json "$R/sweep-mx-moe-decode-m8.json" > /tmp/sweep-m8.log 2>&1
    echo "rc=$?"; grep -v Warn /tmp/sweep-m8.log | tail -12 | cut -c1-1200
  } 2>&1 | tee "$R/log-m8-14.txt"
fi
if [[ $part == last ]]; then
  {
    stamp "GPU tests: the PTX and plain decode, the swapped kernels"
    gpu_tests 60 last tests/test_triton_mx_decode.py tests/test_triton_moe.py -k "decode or swapped"
    grep -E "^E  " /tmp/pytest-last.log | head -12 | cut -c1-600
    stamp "conformance: moe_experts with triton_fused_moe forced (no full-size V4-Pro), eager and graph"
    DSV4HAL_KERNELS=moe_experts=triton_fused_moe timeout 150 $D conformance --platform cuda_sm90 --ops moe_experts \
      --cases '^(?!pro-(mxfp4|fp8_block)-)' --json "$R/conformance-cuda_sm90-moe-triton-swapped.json" --quiet \
      > /tmp/conf-moe4.log 2>&1
    echo "rc=$?"; tail -3 /tmp/conf-moe4.log | cut -c1-300
    stamp "MoE: dsv4hal bench moe --quick"
    timeout 200 $D bench moe --quick --json "$R/bench-moe-quick.json" --plot "$R/bench-moe-quick.png" \
      > /tmp/bench-moe.log 2>&1
    echo "rc=$?"; grep -v Warn /tmp/bench-moe.log | tail -12 | cut -c1-400
  } 2>&1 | tee "$R/log-last14.txt"
fi
if [[ $part == fma ]]; then
  {
    stamp "GPU tests: the PTX and plain decode, the swapped kernels, the row-kernel fallback"
    gpu_tests 90 fma tests/test_triton_mx_decode.py tests/test_triton_moe.py -k "decode or swapped or shapes_off"
    grep -E "^E  " /tmp/pytest-fma.log | head -12 | cut -c1-600
    stamp "MXFP4 decode MoE: the default beside Marlin and triton_kernels"
    timeout 120 python3 bench/sweep_mx_moe_decode.py --grid default --tokens 1,8,64 \
      --json "$R/sweep-mx-moe-decode-fma.json" > /tmp/sweep-fma.log 2>&1
    echo "rc=$?"; grep -v Warn /tmp/sweep-fma.log | tail -6 | cut -c1-900
  } 2>&1 | tee "$R/log-fma14.txt"
fi
