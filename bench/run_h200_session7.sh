#!/usr/bin/env bash
# The H200 plan after the fifth session (2026-12-01): results straight into the call's output folder ($R=$OUT).
#   R=$OUT bash bench/run_h200_session7.sh topk   # the sampled top-k's GPU tests (range=True included), then its
#                                                 # launch sweep pass by pass (samples, tile, bisection from the
#                                                 # common high bits, filter chunk): bench/tune_triton.py --ops topk
#   R=$OUT bash bench/run_h200_session7.sh lock   # the 11 ops the committed lock does not cover, tuned strict into a
#                                                 # copy of it (--update: same machine and libraries as that lock)
#   R=$OUT bash bench/run_h200_session7.sh final  # MoE kernel by kernel (bench/profile_moe.py), compress and indexer
#                                                 # benches, host cost of a bound call, the demo
set -uo pipefail
part=${1:?topk, lock or final}
source bench/h200_env.sh
D="python3 -m dsv4hal"
REST=pack_store,dequant_gather,sparse_attention_decode,sparse_attention_prefill,compress,compress_decode,indexer_logits
REST=$REST,indexer_store,moe_route,mhc_head,build_attention_metadata
if [[ $part == topk ]]; then
  {
    stamp "GPU tests: the sampled top-k"
    timeout 150 python3 -m pytest -q -p no:cacheprovider -p no:warnings tests/test_triton_sampled_topk.py 2>&1 | tail -4
    stamp "the sampled top-k's sweep, pass by pass"
    timeout 200 python3 bench/tune_triton.py --json "$R/tune-triton-topk.json" --ops topk 2>&1 | cut -c1-600 | tail -8
  } 2>&1 | tee "$R/log-topk7.txt"
elif [[ $part == lock ]]; then
  {
    stamp "the lock: the ops it does not cover, strict"
    cp bench/results/h200/cuda_sm90.lock.json "$R/cuda_sm90.lock.json"
    DSV4HAL_STRICT=1 timeout 420 $D tune --platform cuda_sm90 --ops $REST --update --out "$R/cuda_sm90.lock.json" \
      --markdown "$R/tune-cuda_sm90.md" > "$R/tune-cuda_sm90.log" 2>&1
    echo "rc=$?"; grep "^\[tune\|^wrote\|rror" "$R/tune-cuda_sm90.log" | cut -c1-300
  } 2>&1 | tee "$R/log-lock7.txt"
else
  {
    stamp "MoE kernel by kernel (the FP8 psum at T=4096, triton_kernels and Marlin)"
    timeout 120 python3 bench/profile_moe.py --json "$R/profile-moe.json" 2>&1 | tail -40
    stamp "compress prefill and indexer logits against their goals (copy share; a direct DeepGEMM call)"
    timeout 90 $D bench compress,indexer --quick --json "$R/bench-compress-indexer.json" 2>&1 | grep -v Warning | tail -16
    stamp "host cost"
    timeout 60 $D bench attention --quick --json "$R/bench-attention-host.json" 2>&1 | grep -v Warning | tail -6
    stamp "demo"
    timeout 110 $D demo --size flash --batch 64 --context 32768 --steps 8 --fill random \
      --json "$R/demo-flash.json" --plot "$R/demo-flash.png" 2>&1 | tail -18
  } 2>&1 | tee "$R/log-final7.txt"
fi
