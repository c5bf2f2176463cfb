#!/usr/bin/env bash
# The H200 plan of the eighth session (2026-12-01): results straight into the call's output folder ($R=$OUT); at
# most 8 files come back from a call, so logs stay in /tmp and their tails go to the part's log.
#   R=$OUT bash bench/run_h200_session9.sh topk   # the sampled top-k with sampling fused into the filter (sweep; the
#                                                 # option was removed after this call, as it was slower);
#                                                 # the demo (its graph path after the capture-warm-up change)
#   R=$OUT bash bench/run_h200_session9.sh radix  # the K-th key by radix select against the bisection: sampled and
#                                                 # row top-k (bench/tune_triton.py --ops topk); their GPU tests
#   R=$OUT bash bench/run_h200_session9.sh radix2 # the same after the radix search's fix (a constexpr reassigned:
#                                                 # GPU compile only); Marlin's kernels at T = 1 and 8, profiled.
#                                                 # The radix option was measured slower and removed after this
#                                                 # call: its configs are gone from bench/tune_triton.py
#   R=$OUT bash bench/run_h200_session9.sh demo   # the prefill compress op's host time by part; the demo after the
#                                                 # harness's fused norms and in-place RoPE, eager and compiled
#   R=$OUT bash bench/run_h200_session9.sh compress # compress given num_groups: GPU tests, conformance (eager and
#                                                 # graph), the kernel's launch settings swept, the compress bench
#   R=$OUT bash bench/run_h200_session9.sh final  # after the compressor's in-kernel planning and new launch settings:
#                                                 # its GPU tests, conformance, host parts, bench; the demo, eager and
#                                                 # compiled
#   R=$OUT bash bench/run_h200_session9.sh gemv   # a plain Triton MXFP4 GEMV for few-token experts beside Marlin
#                                                 # (bench/proto_mxfp4_gemv.py); the demo in strict mode
#   R=$OUT bash bench/run_h200_session9.sh verify # after the fused top-k's removal and compress's new argument: GPU
#                                                 # tests of the sampled top-k, the custom ops and the demo;
#                                                 # indexer_topk conformance
#   R=$OUT bash bench/run_h200_session9.sh demotests # tests/test_demo.py on the GPU (after the CPU platform's view of
#                                                 # a GPU host and the graph demo's --steps check)
set -uo pipefail
part=${1:?topk, radix, radix2, demo, compress, final, gemv, verify or demotests}
source bench/h200_env.sh
compressor_checks() {  # PROFILE_ARGS...: the compressor's GPU tests, its conformance, its host parts, its bench
  stamp "GPU tests of the compressor (num_groups included)"
  timeout 200 python3 -m pytest -q -p no:cacheprovider -p no:warnings tests/test_triton_compress.py \
    > /tmp/pytest-compress.log 2>&1
  echo "rc=$?"; grep -E "FAILED|ERROR|passed|failed" /tmp/pytest-compress.log | tail -8 | cut -c1-300
  stamp "conformance: compress and compress_decode (eager and graph)"
  timeout 200 $D conformance --ops compress,compress_decode --quiet --json "$R/conformance-cuda_sm90-compress.json" \
    > /tmp/conf-compress.log 2>&1
  echo "rc=$?"; tail -3 /tmp/conf-compress.log | cut -c1-300
  stamp "the prefill compress op's host time by part (bench/profile_compress.py $*)"
  timeout 240 python3 bench/profile_compress.py "$@" > /tmp/profile-compress.txt 2>&1
  echo "rc=$?"; grep "^c[14]" /tmp/profile-compress.txt | cut -c1-2000
  stamp "compress bench"
  timeout 120 $D bench compress --quick --json "$R/bench-compress.json" > /tmp/bench-compress.log 2>&1
  echo "rc=$?"; grep -v Warning /tmp/bench-compress.log | tail -12 | cut -c1-400
}
if [[ $part == topk ]]; then
  {
    stamp "the sampled top-k with sampling fused into the filter (bench/tune_triton.py --ops topk)"
    timeout 200 python3 bench/tune_triton.py --json "$R/tune-triton-topk-fused.json" --ops topk > /tmp/tune-topk.log 2>&1
    echo "rc=$?"; topk_rows "$R/tune-triton-topk-fused.json"
    stamp "demo"
    demo_flash 150 demo-flash
  } 2>&1 | tee "$R/log-topk9.txt"
fi
if [[ $part == radix || $part == radix2 ]]; then
  {
    stamp "GPU tests of the row and sampled top-k (radix select included)"
    timeout 200 python3 -m pytest -q -p no:cacheprovider -p no:warnings tests/test_triton_row_topk.py \
      tests/test_triton_sampled_topk.py > /tmp/pytest-topk.log 2>&1
    echo "rc=$?"; grep -E "FAILED|ERROR|passed|failed" /tmp/pytest-topk.log | tail -12 | cut -c1-300
    stamp "the K-th key by radix select or bisection (bench/tune_triton.py --ops topk)"
    timeout 240 python3 bench/tune_triton.py --json "$R/tune-triton-topk-radix.json" --ops topk > /tmp/tune-topk.log 2>&1
    echo "rc=$?"; topk_rows "$R/tune-triton-topk-radix.json"
  } 2>&1 | tee "$R/log-radix9.txt"
fi
if [[ $part == radix2 ]]; then
  {
    stamp "Marlin MXFP4 at T = 1 and 8, kernel by kernel (bench/profile_moe.py)"
    timeout 150 python3 bench/profile_moe.py --json "$R/profile-moe-decode.json" \
      --runs mxfp4:marlin_mxfp4_sm90:1,mxfp4:marlin_mxfp4_sm90:8,mxfp4:triton_kernels_mxfp4_sm90:8 > /tmp/prof.log 2>&1
    echo "rc=$?"; grep -v Warn /tmp/prof.log | tail -30 | cut -c1-200
  } 2>&1 | tee "$R/log-profile9.txt"
fi
if [[ $part == demo ]]; then
  {
    stamp "the prefill compress op by part (bench/profile_compress.py)"
    timeout 120 python3 bench/profile_compress.py > "$R/profile-compress.txt" 2>&1
    echo "rc=$?"; grep -v Warn "$R/profile-compress.txt" | grep "^c[14]" | cut -c1-300
    demo_eager_and_compiled
  } 2>&1 | tee "$R/log-demo9.txt"
fi
if [[ $part == compress ]]; then
  {
    compressor_checks --sweep
    cp /tmp/profile-compress.txt "$R/profile-compress-sweep.txt"
  } 2>&1 | tee "$R/log-compress9.txt"
fi
if [[ $part == final ]]; then
  {
    compressor_checks
    demo_eager_and_compiled
  } 2>&1 | tee "$R/log-final9.txt"
fi
if [[ $part == gemv ]]; then
  {
    stamp "a plain Triton MXFP4 GEMV beside Marlin at T = 1, 2, 4, 8 (bench/proto_mxfp4_gemv.py)"
    timeout 300 python3 bench/proto_mxfp4_gemv.py --json "$R/proto-mxfp4-gemv.json" > /tmp/gemv.log 2>&1
    echo "rc=$?"; grep -v Warn /tmp/gemv.log | tail -8 | cut -c1-400
    stamp "demo, strict (DSV4HAL_STRICT=1: a PyTorch reference op is refused on the GPU)"
    export DSV4HAL_STRICT=1
    demo_flash 150 demo-flash-strict
    unset DSV4HAL_STRICT
  } 2>&1 | tee "$R/log-gemv9.txt"
fi
if [[ $part == verify ]]; then
  {
    stamp "GPU tests: the sampled top-k, the custom ops (compress given num_groups), the demo"
    timeout 300 python3 -m pytest -q -p no:cacheprovider -p no:warnings tests/test_triton_sampled_topk.py \
      tests/test_custom_ops.py tests/test_demo.py > /tmp/pytest-verify.log 2>&1
    echo "rc=$?"; grep -E "FAILED|ERROR|passed|failed" /tmp/pytest-verify.log | tail -8 | cut -c1-300
    stamp "conformance: indexer_topk (eager and graph)"
    timeout 200 $D conformance --ops indexer_topk --quiet --json "$R/conformance-cuda_sm90-topk-session8.json" \
      > /tmp/conf-topk.log 2>&1
    echo "rc=$?"; tail -3 /tmp/conf-topk.log | cut -c1-300
  } 2>&1 | tee "$R/log-verify9.txt"
fi
if [[ $part == demotests ]]; then
  {
    stamp "GPU tests: the demo"
    timeout 150 python3 -m pytest -q -p no:cacheprovider -p no:warnings tests/test_demo.py tests/test_selection.py \
      > /tmp/pytest-demo.log 2>&1
    echo "rc=$?"; grep -E "FAILED|ERROR|passed|failed|Error" /tmp/pytest-demo.log | tail -12 | cut -c1-400
  } 2>&1 | tee "$R/log-demotests9.txt"
fi
