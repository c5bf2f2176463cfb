#!/usr/bin/env bash
# The H200 plan of the sixth session (2026-12-01): results straight into the call's output folder ($R=$OUT).
#   R=$OUT bash bench/run_h200_session7.sh topk   # GPU tests of the row and sampled top-k, then their launch sweeps,
#                                                 # the sampled one pass by pass: bench/tune_triton.py --ops topk
#   R=$OUT bash bench/run_h200_session7.sh moe    # the MoE bench (T = 16 and 32 added: the Marlin/triton_kernels
#                                                 # crossover), MoE kernel by kernel (bench/profile_moe.py), host cost
#   R=$OUT bash bench/run_h200_session7.sh final  # the sampled top-k's GPU tests and sweep, the compress and indexer
#                                                 # benches, host cost, the demo
#   R=$OUT bash bench/run_h200_session7.sh lock   # the top-k bench (new defaults); moe_experts (the class few) and the
#                                                 # 11 ops the committed lock does not cover, tuned strict into a copy of
#                                                 # it (--update: same machine and libraries as that lock)
set -uo pipefail
part=${1:?topk, moe, final or lock}
source bench/h200_env.sh
D="python3 -m dsv4hal"
REST=pack_store,dequant_gather,sparse_attention_decode,sparse_attention_prefill,compress,compress_decode,indexer_logits
REST=$REST,indexer_store,moe_route,mhc_head,build_attention_metadata
if [[ $part == topk ]]; then
  {
    stamp "GPU tests: the row and sampled top-k"
    timeout 170 python3 -m pytest -q -p no:cacheprovider -p no:warnings tests/test_triton_sampled_topk.py \
      tests/test_triton_row_topk.py > "$R/pytest-topk.log" 2>&1; echo "rc=$?"; tail -4 "$R/pytest-topk.log"
    stamp "the row and sampled top-k's sweeps, the sampled pass by pass"
    timeout 330 python3 bench/tune_triton.py --json "$R/tune-triton-topk.json" --ops topk > "$R/tune-topk.log" 2>&1
    echo "rc=$?"; cut -c1-400 "$R/tune-topk.log" | tail -12
  } 2>&1 | tee "$R/log-topk7.txt"
elif [[ $part == moe ]]; then
  {
    stamp "MoE bench"
    timeout 260 $D bench moe --json "$R/bench-moe.json" --plot "$R/bench-moe.png" > "$R/bench-moe.log" 2>&1
    echo "rc=$?"; grep "^moe" "$R/bench-moe.log" | cut -c1-300
    stamp "MoE kernel by kernel (the FP8 psum at T=4096, triton_kernels and Marlin)"
    timeout 150 python3 bench/profile_moe.py --json "$R/profile-moe.json" > "$R/profile-moe.log" 2>&1
    echo "rc=$?"; tail -40 "$R/profile-moe.log" | cut -c1-200
    stamp "host cost (before)"
    timeout 90 $D bench attention --quick --json "$R/bench-attention-host-before.json" > "$R/host-before.log" 2>&1
    echo "rc=$?"; grep -v Warning "$R/host-before.log" | tail -8
  } 2>&1 | tee "$R/log-moe7.txt"
elif [[ $part == lock ]]; then
  {  # at most 8 files come back from a call: the logs stay in /tmp, their tails go to log-lock7.txt
    stamp "top-k bench (the sampled kernel's new defaults)"
    timeout 80 $D bench topk --json "$R/bench-topk.json" --plot "$R/bench-topk.png" > /tmp/bench-topk.log 2>&1
    echo "rc=$?"; grep -v Warning /tmp/bench-topk.log | tail -16 | cut -c1-300
    stamp "the lock: moe_experts again (the token class few), then the ops it does not cover, strict"
    cp bench/results/h200/cuda_sm90.lock.json "$R/cuda_sm90.lock.json"
    DSV4HAL_STRICT=1 timeout 150 $D tune --platform cuda_sm90 --ops moe_experts --update --out "$R/cuda_sm90.lock.json" \
      --markdown "$R/tune-cuda_sm90-moe.md" > /tmp/tune-moe.log 2>&1
    echo "rc=$?"; grep "^\[tune\|^wrote\|rror" /tmp/tune-moe.log | cut -c1-300
    DSV4HAL_STRICT=1 timeout 250 $D tune --platform cuda_sm90 --ops $REST --update --out "$R/cuda_sm90.lock.json" \
      --markdown "$R/tune-cuda_sm90.md" > /tmp/tune-rest.log 2>&1
    echo "rc=$?"; grep "^\[tune\|^wrote\|rror" /tmp/tune-rest.log | cut -c1-300
  } 2>&1 | tee "$R/log-lock7.txt"
else
  {
    stamp "GPU tests: the sampled top-k; its sweep"  # at most 8 files come back: logs in /tmp
    timeout 90 python3 -m pytest -q -p no:cacheprovider -p no:warnings tests/test_triton_sampled_topk.py \
      > /tmp/pytest-topk.log 2>&1; echo "rc=$?"; tail -3 /tmp/pytest-topk.log
    timeout 150 python3 bench/tune_triton.py --json "$R/tune-triton-topk.json" --ops topk > /tmp/tune-topk.log 2>&1
    echo "rc=$?"; cut -c1-300 /tmp/tune-topk.log | tail -8
    stamp "compress prefill and indexer logits against their goals (copy share; a direct DeepGEMM call)"
    timeout 90 $D bench compress,indexer --quick --json "$R/bench-compress-indexer.json" > /tmp/bench-ci.log 2>&1
    echo "rc=$?"; grep -v Warning /tmp/bench-ci.log | tail -16 | cut -c1-300
    stamp "host cost"
    timeout 90 $D bench attention --quick --json "$R/bench-attention-host.json" > /tmp/host.log 2>&1
    echo "rc=$?"; grep -v Warning /tmp/host.log | tail -8
    stamp "demo"
    timeout 120 $D demo --size flash --batch 64 --context 32768 --steps 8 --fill random \
      --json "$R/demo-flash.json" --plot "$R/demo-flash.png" > /tmp/demo.log 2>&1
    echo "rc=$?"; tail -22 /tmp/demo.log
  } 2>&1 | tee "$R/log-final7.txt"
fi
