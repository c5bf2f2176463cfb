#!/usr/bin/env bash
# The H200 plan of the fourteenth session (2026-12-01): results straight into the call's output folder ($R=$OUT); at
# most 8 files come back from a call, so logs stay in /tmp and their tails go to the part's log.
#   R=$OUT bash bench/run_h200_session15.sh decode  # layout triton-moe-v2 (MXFP4 element bits reordered, one
#                                                   # multiply): decode tests, tile settings beside Marlin and
#                                                   # triton_kernels at T = 1 .. 64, conformance (triton_fused_moe
#                                                   # forced, eager and graph)
#   R=$OUT bash bench/run_h200_session15.sh demo    # (triton_fused_moe now selected for <= 64 tokens) decode tests
#                                                   # with the row kernels, conformance; the yardstick demo as
#                                                   # selected, then with moe_experts forced to triton_kernels (the
#                                                   # former choice); dsv4hal bench moe --quick; the decode call
#                                                   # kernel by kernel (profile_mx_moe_decode.py, into the log)
#   R=$OUT bash bench/run_h200_session15.sh profile # the MXFP4 decode call kernel by kernel at T = 1, 8, 64
#   R=$OUT bash bench/run_h200_session15.sh align   # the route alignment: one program or two launches, 6-512 routes
#   R=$OUT bash bench/run_h200_session15.sh final   # (one program aligns up to 128 routes) the alignment's tests, the
#                                                   # demo as selected and with triton_kernels forced, the profile
#   R=$OUT bash bench/run_h200_session15.sh split   # (ran at ca224bf) gate and up rows paired, the down kernel's K
#                                                   # split (since removed): decode tests, the settings beside the
#                                                   # libraries at T = 1 .. 64
#   R=$OUT bash bench/run_h200_session15.sh launch  # (ran at e90747d) y zeroed in the gate-up kernel, x split in
#                                                   # its registers: decode tests, the default beside x split by a
#                                                   # copy and neighbours (grid v2b, since removed), conformance,
#                                                   # bench moe --quick (the row kernels read split activations),
#                                                   # the yardstick demo
set -uo pipefail
part=${1:?decode, demo, launch, profile, align, final or split}
source bench/h200_env.sh
if [[ $part == decode ]]; then
  { decode_tests 150 decode "decode or swapped or shapes_off or above_128"
    mx_sweep 300 sweep-mx-moe-decode-v2 14 --grid v2 --tokens 1,2,4,8,16,64
    conform_fused_moe 130 conformance-cuda_sm90-moe-triton-v2
  } 2>&1 | tee "$R/log-decode15.txt"
fi
if [[ $part == demo ]]; then
  { decode_tests 100 demo "decode or swapped or shapes_off or above_128"
    conform_fused_moe 130 conformance-cuda_sm90-moe-triton-v2
    stamp "demo (as selected)"; demo_flash 150 demo-flash
    stamp "demo, moe_experts forced to triton_kernels (the former choice)"
    DSV4HAL_KERNELS=moe_experts=triton_kernels_mxfp4_sm90 demo_flash 150 demo-flash-oai-moe
    bench_moe_quick 230
  } 2>&1 | tee "$R/log-demo15.txt"
fi
if [[ $part == launch ]]; then
  { decode_tests 100 launch "decode or swapped or shapes_off or above_128"
    mx_sweep 220 sweep-mx-moe-decode-v2b 14 --grid v2b --tokens 1,2,4,8,16,64
    conform_fused_moe 130 conformance-cuda_sm90-moe-triton-v2
    bench_moe_quick 200
    stamp "demo (as selected)"; demo_flash 150 demo-flash
  } 2>&1 | tee "$R/log-launch15.txt"
fi
if [[ $part == profile ]]; then
  { stamp "the MXFP4 decode call kernel by kernel"
    timeout 120 python3 bench/profile_mx_moe_decode.py --tokens 1,8,64 --json "$R/profile-mx-moe-decode.json" \
      > /tmp/prof.log 2>&1
    echo "rc=$?"; grep -v Warn /tmp/prof.log | tail -6 | cut -c1-1500
  } 2>&1 | tee "$R/log-profile15.txt"
fi
if [[ $part == align ]]; then
  { stamp "the route alignment: one program or two launches"
    timeout 120 python3 bench/sweep_moe_align.py --json "$R/sweep-moe-align.json" > /tmp/align.log 2>&1
    echo "rc=$?"; grep -v Warn /tmp/align.log | tail -8 | cut -c1-600
    gpu_tests 60 align tests/test_triton_moe_align.py
  } 2>&1 | tee "$R/log-align15.txt"
fi
if [[ $part == final ]]; then
  { gpu_tests 60 align tests/test_triton_moe_align.py
    decode_tests 100 final "decode or swapped or shapes_off or above_128"
    stamp "demo (as selected)"; demo_flash 150 demo-flash
    stamp "demo, moe_experts forced to triton_kernels (the former choice)"
    DSV4HAL_KERNELS=moe_experts=triton_kernels_mxfp4_sm90 demo_flash 150 demo-flash-oai-moe
    stamp "the MXFP4 decode call kernel by kernel"
    timeout 120 python3 bench/profile_mx_moe_decode.py --tokens 1,8,64 --json "$R/profile-mx-moe-decode.json" \
      > /tmp/prof.log 2>&1
    echo "rc=$?"; grep -v Warn /tmp/prof.log | tail -6 | cut -c1-1500
  } 2>&1 | tee "$R/log-final15.txt"
fi
if [[ $part == split ]]; then
  { decode_tests 100 split "decode or swapped or shapes_off or above_128 or paired"
    mx_sweep 200 sweep-mx-moe-decode-v3 14 --grid v3 --tokens 1,2,4,8,16,64
  } 2>&1 | tee "$R/log-split15.txt"
fi
