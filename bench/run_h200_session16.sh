#!/usr/bin/env bash
# The H200 plan of the fifteenth session (2026-12-01): results straight into the call's output folder ($R=$OUT); at
# most 8 files come back from a call, so logs stay in /tmp and their tails go to the part's log.
# Saved as ab-mx-moe-decode-runs8.json (ab, first call), -runs16.json (ab), -fused-all.json (final) and
# ab-mx-moe-decode.json (last) in bench/results/h200; the module files under .kernels/ab are git-ignored copies:
# 8fbc8b0's fused_moe.py, and the runs-16 one is commit 0ff4e91's.
#   R=$OUT bash bench/run_h200_session16.sh moe    # layout triton-moe-v3 (no activation split), one token without
#                                                  # alignment, the down kernel's last program casting: decode tests
#                                                  # (graph replays of the fused cast), the default beside each
#                                                  # change undone and the libraries at T = 1 .. 64, the call kernel
#                                                  # by kernel, conformance (triton_fused_moe forced, eager and graph)
#   R=$OUT bash bench/run_h200_session16.sh tiles  # the decode tests again (the fused cast's replays compared within
#                                                  # one bf16 step: the atomics' order varies), the down kernel's own
#                                                  # tiles at T = 1 .. 64, the yardstick demo as selected
#   R=$OUT bash bench/run_h200_session16.sh ab     # (layout v3 with runs of 16) the decode tests; this tree's
#                                                  # decode against 8fbc8b0's module file (.kernels/ab/
#                                                  # fused_moe_old.py, layout v2), the first v3 (runs of 8, the
#                                                  # tiles call's tree) and Marlin, in turns; conformance
#                                                  # (ran first with the runs-8 tree, --old 8fbc8b0's file only)
#   R=$OUT bash bench/run_h200_session16.sh final  # (layout v2 again, with one token unaligned and the fused cast)
#                                                  # the decode tests; A/B against 8fbc8b0's file and the runs-16 v3
#                                                  # (the ab call's tree); conformance; the yardstick demo
#   R=$OUT bash bench/run_h200_session16.sh last   # (defaults: the cast fused for one token only, the down kernel's
#                                                  # 128-row tiles for 2 .. 16 tokens) the decode tests; A/B against
#                                                  # 8fbc8b0's file, each default undone; the call kernel by kernel;
#                                                  # conformance; the yardstick demo; dsv4hal bench moe --quick
#   R=$OUT bash bench/run_h200_session16.sh yard   # the yardstick demo as selected, then with 8fbc8b0's fused_moe.py
#                                                  # copied over this tree's (the session's before, same machine)
#   R=$OUT bash bench/run_h200_session16.sh demo   # the yardstick demo as selected; dsv4hal bench moe --quick
set -uo pipefail
part=${1:?moe, tiles, ab, final, last, yard or demo}
source bench/h200_env.sh
if [[ $part == moe ]]; then
  { decode_tests 150 moe "decode or swapped or shapes_off or above_128 or paired or one_token or fused_cast"
    mx_sweep 200 sweep-mx-moe-decode-v4 14 --grid v4 --tokens 1,2,4,8,16,64
    profile_decode 100
    conform_fused_moe 130 conformance-cuda_sm90-moe-triton-v3
  } 2>&1 | tee "$R/log-moe16.txt"
fi
if [[ $part == tiles ]]; then
  { decode_tests 150 tiles "decode or swapped or shapes_off or above_128 or paired or one_token or fused_cast or down"
    mx_sweep 250 sweep-mx-moe-decode-v5 8 --grid v5 --tokens 1,2,8,16,64
    stamp "demo (as selected)"; demo_flash 150 demo-flash
  } 2>&1 | tee "$R/log-tiles16.txt"
fi
if [[ $part == ab ]]; then
  { decode_tests 150 ab "decode or swapped or shapes_off or above_128 or paired or one_token or fused_cast or down"
    ab_decode 300 ab-mx-moe-decode --old v2=.kernels/ab/fused_moe_old.py --old runs8=.kernels/ab/fused_moe_runs8.py \
      --tokens 1,2,4,8,16,64
    conform_fused_moe 130 conformance-cuda_sm90-moe-triton-v3
  } 2>&1 | tee "$R/log-ab16.txt"
fi
if [[ $part == final ]]; then
  { decode_tests 150 final "decode or swapped or shapes_off or above_128 or paired or one_token or fused_cast or down"
    ab_decode 300 ab-mx-moe-decode-final --old v2=.kernels/ab/fused_moe_old.py \
      --old runs16=.kernels/ab/fused_moe_runs16.py --tokens 1,2,4,8,16,64
    conform_fused_moe 130 conformance-cuda_sm90-moe-triton-v2
    stamp "demo (as selected)"; demo_flash 150 demo-flash
  } 2>&1 | tee "$R/log-final16.txt"
fi
if [[ $part == last ]]; then
  { decode_tests 150 last "decode or swapped or shapes_off or above_128 or paired or one_token or fused_cast or down"
    ab_decode 300 ab-mx-moe-decode-last --old v2=.kernels/ab/fused_moe_old.py --tokens 1,2,4,8,16,32,64
    profile_decode 100
    conform_fused_moe 130 conformance-cuda_sm90-moe-triton-v2
    stamp "demo (as selected)"; demo_flash 150 demo-flash
    bench_moe_quick 150
  } 2>&1 | tee "$R/log-last16.txt"
fi
if [[ $part == yard ]]; then
  { stamp "demo (as selected)"; demo_flash 150 demo-flash
    stamp "demo with 8fbc8b0's fused_moe.py (before this session)"
    cp .kernels/ab/fused_moe_old.py dsv4hal/kernels/triton/fused_moe.py
    demo_flash 150 demo-flash-8fbc8b0
  } 2>&1 | tee "$R/log-yard16.txt"
fi
if [[ $part == demo ]]; then
  { stamp "demo (as selected)"; demo_flash 150 demo-flash
    bench_moe_quick 230
  } 2>&1 | tee "$R/log-demo16.txt"
fi
