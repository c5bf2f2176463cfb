#!/usr/bin/env bash
# The H200 plan of the twelfth session (2026-12-01): results straight into the call's output folder ($R=$OUT); at
# most 8 files come back from a call, so logs stay in /tmp and their tails go to the part's log.
#   R=$OUT bash bench/run_h200_session13.sh one    # top-k: the k-th key searches two bits a reduction, the lean
#                                                  # filter storing the scores' bits (tune_triton.py --ops topk);
#                                                  # mHC's apply launch with post and the Sinkhorn in a program of
#                                                  # their own (sweep_mhc_apply.py); GPU tests of both
#   R=$OUT bash bench/run_h200_session13.sh fbp    # top-k: the select launch's fallback programs a row, the sample
#                                                  # positions by a shift; GPU tests (top-k, mHC with comb apart)
#   R=$OUT bash bench/run_h200_session13.sh two    # the new defaults: conformance (indexer_topk, mHC), dsv4hal
#                                                  # bench topk and mhc, the yardstick demo
#   R=$OUT bash bench/run_h200_session13.sh three  # mHC conformance (apply with comb apart), dsv4hal bench topk
#                                                  # again; top-k: the select's half tile, the filter's chunks
#   R=$OUT bash bench/run_h200_session13.sh half   # the half tile as default: dsv4hal bench topk, indexer_topk
#                                                  # conformance, the sampled top-k's GPU tests
set -uo pipefail
part=${1:?one, fbp, two, three or half}
source bench/h200_env.sh
if [[ $part == one ]]; then
  {
    stamp "top-k: bits a reduction, lean filter with the scores' bits (bench/tune_triton.py --ops topk)"
    tune_topk 200 tune-triton-topk-bits
    stamp "mHC apply: post and the Sinkhorn apart or in d block 0, warps, d block (bench/sweep_mhc_apply.py)"
    timeout 140 python3 bench/sweep_mhc_apply.py --json "$R/sweep-mhc-apply-apart.json" > /tmp/sweep-mhc.log 2>&1
    echo "rc=$?"; grep -v Warn /tmp/sweep-mhc.log | grep -E '"iters": 20|whole' | python3 -c '
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    print({k: (round(v, 2) if isinstance(v, float) else v) for k, v in r.items() if k not in ("splits",)})' | tail -140
    stamp "GPU tests: the row and sampled top-k, the Triton mHC kernels"
    gpu_tests 130 one tests/test_triton_row_topk.py tests/test_triton_sampled_topk.py tests/test_triton_mhc.py
  } 2>&1 | tee "$R/log-one13.txt"
fi
if [[ $part == fbp ]]; then
  {
    stamp "top-k: fallback programs a row, sample positions by a shift (bench/tune_triton.py --ops topk)"
    tune_topk 200 tune-triton-topk-fbp
    stamp "GPU tests: the row and sampled top-k, the Triton mHC kernels"
    gpu_tests 300 fbp tests/test_triton_sampled_topk.py tests/test_triton_mhc.py tests/test_triton_row_topk.py
  } 2>&1 | tee "$R/log-fbp13.txt"
fi
if [[ $part == two ]]; then
  {
    stamp "conformance: indexer_topk, eager and graph"
    conform 110 conformance-cuda_sm90-topk-shift indexer_topk
    stamp "conformance: mHC, eager and graph"
    conform 110 conformance-cuda_sm90-mhc-apart mhc_pre,mhc_post,mhc_post_pre,mhc_head
    stamp "top-k: the bound op (dsv4hal bench topk)"
    bench_op 90 topk
    stamp "mHC: dsv4hal bench mhc --quick"
    timeout 90 $D bench mhc --quick --json "$R/bench-mhc.json" --plot "$R/bench-mhc.png" > /tmp/bench-mhc.log 2>&1
    echo "rc=$?"; grep -v Warning /tmp/bench-mhc.log | tail -16 | cut -c1-300
    stamp "demo (the yardstick)"
    demo_flash 150 demo-flash
  } 2>&1 | tee "$R/log-two13.txt"
fi
if [[ $part == three ]]; then
  {
    stamp "conformance: mHC, eager and graph"
    conform 270 conformance-cuda_sm90-mhc-apart mhc_pre,mhc_post,mhc_post_pre,mhc_head
    stamp "top-k: the bound op (dsv4hal bench topk), a second run"
    bench_op 90 topk
    stamp "top-k: the select's half tile, the filter's chunk of several blocks (bench/tune_triton.py --ops topk)"
    tune_topk 110 tune-triton-topk-half
  } 2>&1 | tee "$R/log-three13.txt"
fi
if [[ $part == half ]]; then
  {
    stamp "top-k: the bound op (dsv4hal bench topk), the select's half tile the default"
    bench_op 90 topk
    stamp "conformance: indexer_topk, eager and graph"
    conform 80 conformance-cuda_sm90-topk-half indexer_topk
    stamp "GPU tests: the sampled top-k"
    gpu_tests 100 half tests/test_triton_sampled_topk.py
  } 2>&1 | tee "$R/log-half13.txt"
fi
