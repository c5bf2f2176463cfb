#!/usr/bin/env bash
# The H200 plan of the eleventh session (2026-12-01): results straight into the call's output folder ($R=$OUT); at
# most 8 files come back from a call, so logs stay in /tmp and their tails go to the part's log.
#   R=$OUT bash bench/run_h200_session12.sh one    # the top-k filter pass: the rows' counts on separate cache lines,
#                                                  # a slot an atomic a key (tune_triton.py --ops topk); the FP8 MoE
#                                                  # quantizers' launch sweep (sweep_moe_quant.py); GPU tests
#   R=$OUT bash bench/run_h200_session12.sh two    # second sweeps: per_key's chunk, block, warps, and from how many
#                                                  # rows it pays; the quantizers' finer grid at T = 4096 and 512,
#                                                  # the whole FP8 call, its launches alone, expected_m (--call)
#   R=$OUT bash bench/run_h200_session12.sh three  # the new defaults (per-key top-k filter from 8 rows, 4 x 4
#                                                  # quantizer tiles in 3 stages): GPU tests, the FP8 call and its
#                                                  # launches, expected_m; dsv4hal bench topk; top-k conformance
#   R=$OUT bash bench/run_h200_session12.sh four   # FP8 MoE conformance (DeepGEMM forced), the FP8 call with
#                                                  # the former and current tiles, dsv4hal bench moe --quick
#   R=$OUT bash bench/run_h200_session12.sh demo   # DeepGEMM MoE tests (CPU-tensor tests now skipped on a GPU
#                                                  # host), the yardstick demo
#   R=$OUT bash bench/run_h200_session12.sh skip   # the top-k filter's third sweep: small blocks that skip the
#                                                  # atomics when none of their keys is a candidate
#   R=$OUT bash bench/run_h200_session12.sh pair   # the quantizers' former and current tiles in one run: alone on
#                                                  # random rows, and inside the FP8 call (its launches, the call)
#   R=$OUT bash bench/run_h200_session12.sh lean   # the lean top-k filter against the same filter without it
#                                                  # (tune_triton.py), the sampled top-k's GPU tests
set -uo pipefail
part=${1:?one, two, three, four, demo, skip, pair or lean}
source bench/h200_env.sh
if [[ $part == one ]]; then
  {
    stamp "top-k: the filter's count stride and per-key slots, passes (bench/tune_triton.py --ops topk)"
    tune_topk 280 tune-triton-topk-filter
    stamp "FP8 MoE quantizers: tiles, warps, stages at T = 4096 (bench/sweep_moe_quant.py)"
    timeout 150 python3 bench/sweep_moe_quant.py --json "$R/sweep-moe-quant.json" > /tmp/sweep-quant.log 2>&1
    echo "rc=$?"; grep -v Warn /tmp/sweep-quant.log | cut -c1-200 | tail -80
    stamp "GPU tests: the sampled top-k, the MoE glue kernels"
    gpu_tests 140 one tests/test_triton_sampled_topk.py tests/test_triton_moe_glue.py
  } 2>&1 | tee "$R/log-one12.txt"
fi
if [[ $part == two ]]; then
  {
    stamp "top-k: per_key's chunk, block, warps; rows 1-64 (bench/tune_triton.py --ops topk)"
    tune_topk 300 tune-triton-topk-perkey
    stamp "FP8 MoE: the quantizers' finer grid, the whole call and its launches, expected_m"
    timeout 270 python3 bench/sweep_moe_quant.py --json "$R/sweep-moe-quant2.json" --grid second --tokens 4096,512 \
      --call > /tmp/sweep-quant.log 2>&1
    echo "rc=$?"; grep -v Warn /tmp/sweep-quant.log | cut -c1-200 | tail -150
  } 2>&1 | tee "$R/log-two12.txt"
fi
if [[ $part == three ]]; then
  {
    stamp "GPU tests: the sampled top-k, the MoE quantizers and glue, DeepGEMM's MoE"
    gpu_tests 170 three tests/test_triton_sampled_topk.py tests/test_moe_quant_rows.py tests/test_triton_moe_glue.py \
      tests/test_deepgemm_moe.py
    stamp "FP8 MoE at T = 4096: the whole call, its launches alone, expected_m (bench/sweep_moe_quant.py --call-only)"
    timeout 120 python3 bench/sweep_moe_quant.py --json "$R/sweep-moe-fp8-call.json" --call-only > /tmp/call.log 2>&1
    echo "rc=$?"; grep -v Warn /tmp/call.log | cut -c1-200 | tail -20
    stamp "top-k: the bound op (dsv4hal bench topk)"
    bench_op 90 topk
    stamp "conformance: indexer_topk (eager and graph)"
    conform 130 conformance-cuda_sm90-topk-perkey indexer_topk
  } 2>&1 | tee "$R/log-three12.txt"
fi
if [[ $part == four ]]; then
  {
    stamp "conformance: moe_experts through DeepGEMM's FP8 psum and per-row layouts (forced), eager and graph"
    for impl in deepgemm_fp8_psum_sm90 deepgemm_fp8_sm90; do
      echo "$impl"; DSV4HAL_KERNELS=moe_experts=$impl conform 110 conformance-cuda_sm90-moe-$impl moe_experts \
        --platform cuda_sm90
    done
    stamp "FP8 MoE at T = 4096: the call with the former and the current quantizer tiles, its launches alone"
    timeout 120 python3 bench/sweep_moe_quant.py --json "$R/sweep-moe-fp8-call.json" --call-only > /tmp/call.log 2>&1
    echo "rc=$?"; grep -v Warn /tmp/call.log | cut -c1-200 | tail -20
    stamp "MoE: dsv4hal bench moe --quick"
    timeout 240 $D bench moe --quick --json "$R/bench-moe-quick.json" --plot "$R/bench-moe-quick.png" \
      > /tmp/bench-moe.log 2>&1
    echo "rc=$?"; grep -v Warning /tmp/bench-moe.log | tail -30 | cut -c1-400
  } 2>&1 | tee "$R/log-four12.txt"
fi
if [[ $part == demo ]]; then
  {
    stamp "GPU tests: DeepGEMM's MoE binding"
    gpu_tests 100 dg tests/test_deepgemm_moe.py
    stamp "demo (the yardstick)"
    demo_flash 200 demo-flash
  } 2>&1 | tee "$R/log-demo12.txt"
fi
if [[ $part == skip ]]; then
  {
    stamp "top-k: blocks without a candidate skipped (bench/tune_triton.py --ops topk)"
    tune_topk 200 tune-triton-topk-skip
  } 2>&1 | tee "$R/log-skip12.txt"
fi
if [[ $part == pair ]]; then
  {
    stamp "FP8 MoE quantizers, former and current tiles, alone and in the call (bench/sweep_moe_quant.py)"
    timeout 200 python3 bench/sweep_moe_quant.py --json "$R/sweep-moe-quant-pair.json" --grid pair --call \
      > /tmp/pair.log 2>&1
    echo "rc=$?"; grep -v Warn /tmp/pair.log | cut -c1-200 | tail -40
  } 2>&1 | tee "$R/log-pair12.txt"
fi
if [[ $part == lean ]]; then
  {
    stamp "top-k: the lean filter (bench/tune_triton.py --ops topk)"
    tune_topk 150 tune-triton-topk-lean
    stamp "GPU tests: the sampled top-k"
    gpu_tests 120 lean tests/test_triton_sampled_topk.py
  } 2>&1 | tee "$R/log-lean12.txt"
fi
