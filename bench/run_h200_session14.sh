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
decode_tests() {  # TIMEOUT NAME KEXPR: the decode and swapped-kernel GPU tests, their assertion messages
  stamp "GPU tests: the PTX and plain decode, the swapped kernels ($3)"
  gpu_tests "$1" "$2" tests/test_triton_mx_decode.py tests/test_triton_moe.py -k "$3"
  grep -E "^E  " "/tmp/pytest-$2.log" | head -12 | cut -c1-600
}
sweep() {  # TIMEOUT NAME TAIL ARGS...: bench/sweep_mx_moe_decode.py into $R/NAME.json, the log's last TAIL lines
  local limit=$1 name=$2 lines=$3
  shift 3
  stamp "MXFP4 decode MoE ($*) beside Marlin and triton_kernels"
  timeout "$limit" python3 bench/sweep_mx_moe_decode.py "$@" --json "$R/$name.json" > "/tmp/$name.log" 2>&1
  echo "rc=$?"; grep -v Warn "/tmp/$name.log" | tail -"$lines" | cut -c1-1200
}
conform_fused_moe() {  # TIMEOUT: moe_experts conformance with triton_fused_moe forced, eager and graph
  stamp "conformance: moe_experts with triton_fused_moe forced (no full-size V4-Pro), eager and graph"
  DSV4HAL_KERNELS=moe_experts=triton_fused_moe timeout "$1" $D conformance --platform cuda_sm90 --ops moe_experts \
    --cases '^(?!pro-(mxfp4|fp8_block)-)' --json "$R/conformance-cuda_sm90-moe-triton-swapped.json" --quiet \
    > /tmp/conf-moe.log 2>&1
  echo "rc=$?"; tail -3 /tmp/conf-moe.log | cut -c1-300
}
bench_moe_quick() {  # TIMEOUT: dsv4hal bench moe --quick into $R/bench-moe-quick.json/png
  stamp "MoE: dsv4hal bench moe --quick"
  timeout "$1" $D bench moe --quick --json "$R/bench-moe-quick.json" --plot "$R/bench-moe-quick.png" \
    > /tmp/bench-moe.log 2>&1
  echo "rc=$?"; grep -v Warn /tmp/bench-moe.log | tail -12 | cut -c1-400
}
if [[ $part == mx ]]; then  # (the same steps ran for three designs; only the kernels changed between the calls)
  { decode_tests 120 mx "decode or swapped"; sweep 330 sweep-mx-moe-decode-ptx 30; } 2>&1 | tee "$R/log-mx14.txt"
fi
if [[ $part == mx2 ]]; then
  { decode_tests 120 mx2 "decode or swapped"; sweep 200 sweep-mx-moe-decode 12 --grid final; conform_fused_moe 200
  } 2>&1 | tee "$R/log-mx2-14.txt"
fi
if [[ $part == final ]]; then
  { decode_tests 120 final "decode or swapped"; sweep 200 sweep-mx-moe-decode-final 12 --grid final
    conform_fused_moe 200; bench_moe_quick 240; } 2>&1 | tee "$R/log-final14.txt"
fi
if [[ $part == m8 ]]; then
  { decode_tests 120 m8 "decode or swapped"; sweep 300 sweep-mx-moe-decode-m8 12 --grid m8 --tokens 1,2,4,8,16,64
  } 2>&1 | tee "$R/log-m8-14.txt"
fi
if [[ $part == last ]]; then
  { decode_tests 60 last "decode or swapped"; conform_fused_moe 150; bench_moe_quick 200; } 2>&1 | tee "$R/log-last14.txt"
fi
if [[ $part == fma ]]; then
  { decode_tests 90 fma "decode or swapped or shapes_off"
    sweep 120 sweep-mx-moe-decode-fma 6 --grid default --tokens 1,8,64; } 2>&1 | tee "$R/log-fma14.txt"
fi
