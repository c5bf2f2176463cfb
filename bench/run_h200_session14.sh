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
if [[ $part == mx ]]; then  # (the same steps ran for three designs; only the kernels changed between the calls)
  { decode_tests 120 mx "decode or swapped"; mx_sweep 330 sweep-mx-moe-decode-ptx 30; } 2>&1 | tee "$R/log-mx14.txt"
fi
if [[ $part == mx2 ]]; then
  { decode_tests 120 mx2 "decode or swapped"; mx_sweep 200 sweep-mx-moe-decode 12 --grid final
    conform_fused_moe 200 conformance-cuda_sm90-moe-triton-swapped
  } 2>&1 | tee "$R/log-mx2-14.txt"
fi
if [[ $part == final ]]; then
  { decode_tests 120 final "decode or swapped"; mx_sweep 200 sweep-mx-moe-decode-final 12 --grid final
    conform_fused_moe 200 conformance-cuda_sm90-moe-triton-swapped; bench_moe_quick 240; } 2>&1 | tee "$R/log-final14.txt"
fi
if [[ $part == m8 ]]; then
  { decode_tests 120 m8 "decode or swapped"; mx_sweep 300 sweep-mx-moe-decode-m8 12 --grid m8 --tokens 1,2,4,8,16,64
  } 2>&1 | tee "$R/log-m8-14.txt"
fi
if [[ $part == last ]]; then
  { decode_tests 60 last "decode or swapped"
    conform_fused_moe 150 conformance-cuda_sm90-moe-triton-swapped; bench_moe_quick 200; } 2>&1 | tee "$R/log-last14.txt"
fi
if [[ $part == fma ]]; then
  { decode_tests 90 fma "decode or swapped or shapes_off"
    mx_sweep 120 sweep-mx-moe-decode-fma 6 --grid default --tokens 1,8,64; } 2>&1 | tee "$R/log-fma14.txt"
fi
