#!/usr/bin/env bash
# The H200 plan of the fifth session (2026-12-01): results straight into the call's output folder ($R=$OUT).
#   R=$OUT bash bench/run_h200_session6.sh moe    # the triton_kernels MoE forced again (graph replay fixed), the MoE
#                                                 # and mHC benches, moe_experts / mhc_pre / mhc_post_pre re-tuned
#   R=$OUT bash bench/run_h200_session6.sh topk   # GPU tests of the sampled top-k (and the gated chunked and radix
#                                                 # kernels it falls back to), top-k conformance, the top-k bench
#   R=$OUT bash bench/run_h200_session6.sh final  # the lock tuned again, every op (triton_kernels is a new library
#                                                 # on this machine, so --update is refused); the demo
#   R=$OUT bash bench/run_h200_session6.sh lock   # (final's whole tune ran past its 330 s) the ops changed this
#                                                 # session only, strict (the reference is not timed)
set -uo pipefail
part=${1:?moe, topk, final or lock}
source bench/h200_env.sh
D="python3 -m dsv4hal"
if [[ $part == moe ]]; then
  {
    stamp "conformance: the triton_kernels MoE forced (eager and graph)"
    DSV4HAL_KERNELS=moe_experts=triton_kernels_mxfp4_sm90 timeout 150 $D conformance --platform cuda_sm90 \
      --ops moe_experts --json "$R/conformance-cuda_sm90-moe-triton-kernels.json" --quiet | tail -2
    stamp "MoE and mHC benches"
    timeout 150 $D bench moe --json "$R/bench-moe.json" --plot "$R/bench-moe.png" 2>&1 | grep -v Warning | tail -30
    timeout 80 $D bench mhc --quick --json "$R/bench-mhc.json" 2>&1 | grep -v Warning | tail -12
    stamp "moe_experts, mhc_pre and mhc_post_pre re-tuned into the committed lock"
    cp bench/results/h200/cuda_sm90.lock.json "$R/cuda_sm90.lock.json"
    timeout 170 $D tune --platform cuda_sm90 --ops moe_experts,mhc_pre,mhc_post_pre --update \
      --out "$R/cuda_sm90.lock.json" --markdown "$R/tune-moe-mhc.md" 2>&1 | tail -12
  } 2>&1 | tee "$R/log-moe6.txt"
elif [[ $part == topk ]]; then
  {
    stamp "GPU tests: the sampled top-k, the chunked and row kernels, the MoE token classes"
    timeout 200 python3 -m pytest -q -p no:cacheprovider -p no:warnings tests/test_triton_sampled_topk.py \
      tests/test_triton_chunked_topk.py tests/test_triton_row_topk.py tests/test_oai_triton_moe.py 2>&1 | tail -8
    stamp "conformance: indexer_topk (auto selection), then the sampled top-k forced"
    timeout 60 $D conformance --platform cuda_sm90 --ops indexer_topk --json "$R/conformance-cuda_sm90-topk.json" \
      --quiet | tail -2
    DSV4HAL_KERNELS=indexer_topk=triton_sampled_topk timeout 60 $D conformance --platform cuda_sm90 \
      --ops indexer_topk --json "$R/conformance-cuda_sm90-topk-sampled.json" --quiet | tail -2
    stamp "top-k bench"
    timeout 110 $D bench topk --json "$R/bench-topk.json" --plot "$R/bench-topk.png" 2>&1 | grep -v Warning | tail -20
  } 2>&1 | tee "$R/log-topk6.txt"
elif [[ $part == lock ]]; then
  {
    stamp "the lock: the ops changed this session, strict"
    DSV4HAL_STRICT=1 timeout 200 $D tune --platform cuda_sm90 --ops indexer_topk,moe_experts,mhc_pre,mhc_post,mhc_post_pre \
      --out "$R/cuda_sm90.lock.json" --markdown "$R/tune-cuda_sm90.md" > "$R/tune-cuda_sm90.log" 2>&1
    echo "rc=$?"; grep "^\[tune\|^wrote\|rror" "$R/tune-cuda_sm90.log" | cut -c1-400
  } 2>&1 | tee "$R/log-lock6.txt"
else
  {
    stamp "the lock tuned again, every op"
    timeout 330 $D tune --platform cuda_sm90 --out "$R/cuda_sm90.lock.json" --markdown "$R/tune-cuda_sm90.md" \
      2>&1 | tail -40
    stamp "demo"
    timeout 110 $D demo --size flash --batch 64 --context 32768 --steps 8 --fill random \
      --json "$R/demo-flash.json" --plot "$R/demo-flash.png" 2>&1 | tail -18
  } 2>&1 | tee "$R/log-final6.txt"
fi
