#!/usr/bin/env bash
# The H200 plan of the tenth session (2026-12-01): results straight into the call's output folder ($R=$OUT); at
# most 8 files come back from a call, so logs stay in /tmp and their tails go to the part's log.
#   R=$OUT bash bench/run_h200_session11.sh one    # mHC's gated ops in one launch (grid barriers): GPU tests, the
#                                                  # one-launch bench (bench/bench_mhc_one_launch.py), mHC
#                                                  # conformance; last session's unrun change: decode_step
#                                                  # conformance inside a declared step
#   R=$OUT bash bench/run_h200_session11.sh prof   # where the one-launch kernel's time goes: kernel durations per
#                                                  # phase and path, a grid barrier alone (profile_mhc_phases.py)
#   R=$OUT bash bench/run_h200_session11.sh sweep  # the Sinkhorn's forms in mHC's apply (sweep_mhc_apply.py); the
#                                                  # top-k with its fallback inside the select pass, passes and a
#                                                  # forced fallback (tune_triton.py --ops topk)
#   R=$OUT bash bench/run_h200_session11.sh topk   # the top-k with the chunked fallback inside its select launch:
#                                                  # GPU tests, passes and forced fallback (tune_triton.py), the
#                                                  # bound op (dsv4hal bench topk), conformance
#   R=$OUT bash bench/run_h200_session11.sh demo   # GPU tests (the top-k's, which timed out in topk; the demo's),
#                                                  # the yardstick demo
#   R=$OUT bash bench/run_h200_session11.sh moe    # the triton_kernels MoE path with dsv4hal's combine and no
#                                                  # memset launch: GPU tests, conformance (forced), the demo
set -uo pipefail
part=${1:?one, prof, sweep, topk, demo or moe}
source bench/h200_env.sh
if [[ $part == one ]]; then
  {
    stamp "GPU tests: mHC (Triton, DeepGEMM)"
    gpu_tests 120 one tests/test_triton_mhc.py tests/test_deepgemm_mhc.py
    stamp "mHC in one launch (bench/bench_mhc_one_launch.py)"
    timeout 200 python3 bench/bench_mhc_one_launch.py --json "$R/bench-mhc-one-launch.json" > /tmp/one.log 2>&1
    echo "rc=$?"; grep -v Warn /tmp/one.log | tail -34 | cut -c1-400
    stamp "conformance: the mHC ops (eager and graph) with the one-launch kernels"
    timeout 130 $D conformance --ops mhc_pre,mhc_post,mhc_post_pre,mhc_head --quiet \
      --json "$R/conformance-cuda_sm90-mhc-one-launch.json" > /tmp/conf-mhc.log 2>&1
    echo "rc=$?"; tail -4 /tmp/conf-mhc.log | cut -c1-300
    stamp "conformance: decode_step inside platform.decode_step() (dsv4hal's FlashMLA plan)"
    timeout 120 $D conformance --ops decode_step --quiet --json "$R/conformance-cuda_sm90-decode-step.json" \
      > /tmp/conf-step.log 2>&1
    echo "rc=$?"; tail -4 /tmp/conf-step.log | cut -c1-300
  } 2>&1 | tee "$R/log-one11.txt"
fi
if [[ $part == prof ]]; then
  {
    stamp "mHC: kernel durations per phase and path, grid barriers alone (bench/profile_mhc_phases.py)"
    timeout 300 python3 bench/profile_mhc_phases.py --json "$R/profile-mhc-phases.json" > /tmp/prof.log 2>&1
    echo "rc=$?"; grep -v Warn /tmp/prof.log | tail -40 | cut -c1-600
  } 2>&1 | tee "$R/log-prof11.txt"
fi
if [[ $part == sweep ]]; then
  {
    stamp "GPU tests: the sampled top-k (fallback in the select pass), mHC"
    gpu_tests 100 sweep tests/test_triton_sampled_topk.py tests/test_triton_mhc.py
    stamp "mHC apply: the Sinkhorn's forms (bench/sweep_mhc_apply.py)"
    timeout 100 python3 bench/sweep_mhc_apply.py --json "$R/sweep-mhc-apply-sinkhorn.json" > /tmp/sweep-mhc.log 2>&1
    echo "rc=$?"; grep -v Warn /tmp/sweep-mhc.log | cut -c1-260 | tail -40
    stamp "top-k: passes, the fallback forced (bench/tune_triton.py --ops topk)"
    timeout 260 python3 bench/tune_triton.py --json "$R/tune-triton-topk-fallback.json" --ops topk \
      > /tmp/tune-topk.log 2>&1
    echo "rc=$?"; topk_rows "$R/tune-triton-topk-fallback.json"; grep -E "Error|error" /tmp/tune-topk.log | tail -5
  } 2>&1 | tee "$R/log-sweep11.txt"
fi
if [[ $part == topk ]]; then
  {
    stamp "GPU tests: the sampled top-k (the chunked fallback inside its select launch), the chunked top-k"
    gpu_tests 110 topk tests/test_triton_sampled_topk.py tests/test_triton_chunked_topk.py
    stamp "top-k: passes, select warps, the fallback forced (bench/tune_triton.py --ops topk)"
    timeout 170 python3 bench/tune_triton.py --json "$R/tune-triton-topk-fallback.json" --ops topk \
      > /tmp/tune-topk.log 2>&1
    echo "rc=$?"; topk_rows "$R/tune-triton-topk-fallback.json"; grep -E "Error|error" /tmp/tune-topk.log | tail -5
    stamp "top-k: the bound op (dsv4hal bench topk)"
    timeout 90 $D bench topk --json "$R/bench-topk.json" --plot "$R/bench-topk.png" > /tmp/bench-topk.log 2>&1
    echo "rc=$?"; grep -v Warning /tmp/bench-topk.log | tail -16 | cut -c1-300
    stamp "conformance: indexer_topk (eager and graph)"
    timeout 120 $D conformance --ops indexer_topk --quiet --json "$R/conformance-cuda_sm90-topk.json" \
      > /tmp/conf-topk.log 2>&1
    echo "rc=$?"; tail -3 /tmp/conf-topk.log | cut -c1-300
  } 2>&1 | tee "$R/log-topk11.txt"
fi
if [[ $part == demo ]]; then
  {
    stamp "GPU tests: the sampled top-k, the chunked top-k"
    gpu_tests 170 topk tests/test_triton_sampled_topk.py tests/test_triton_chunked_topk.py
    stamp "GPU tests: the demo"
    gpu_tests 120 demo tests/test_demo.py
    stamp "demo (the yardstick)"
    demo_flash 200 demo-flash
  } 2>&1 | tee "$R/log-demo11.txt"
fi
if [[ $part == moe ]]; then
  {
    stamp "GPU tests: the triton_kernels MoE binding, the MoE glue kernels"
    gpu_tests 100 moe tests/test_oai_triton_moe.py tests/test_triton_moe_glue.py
    stamp "conformance: moe_experts through triton_kernels (forced), eager and graph"
    DSV4HAL_KERNELS=moe_experts=triton_kernels_mxfp4_sm90 timeout 150 $D conformance --platform cuda_sm90 \
      --ops moe_experts --json "$R/conformance-cuda_sm90-moe-triton-combine.json" --quiet > /tmp/conf-moe.log 2>&1
    echo "rc=$?"; tail -2 /tmp/conf-moe.log | cut -c1-300
    stamp "demo (the yardstick)"
    demo_flash 160 demo-flash
  } 2>&1 | tee "$R/log-moe11.txt"
fi
