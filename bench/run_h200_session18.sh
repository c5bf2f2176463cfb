#!/usr/bin/env bash
# The H200 plan of the seventeenth session (2026-12-01): results straight into the call's output folder ($R=$OUT); at
# most 8 files come back from a call, so logs stay in /tmp and their tails go to the part's log.
#   R=$OUT bash bench/run_h200_session18.sh check    # the memo's C++ tensor checks on the GPU: GPU tests, the host
#                                                    # cost part by part and beside the direct FlashMLA call (three
#                                                    # rounds), the yardstick demo, a 1-minute soak of every op
#   R=$OUT bash bench/run_h200_session18.sh conform  # the whole conformance catalog (auto selection, eager and graph)
#                                                    # as three reports run side by side (one run does not finish in
#                                                    # 420 s); correctness only, so sharing the GPU is fine
#   R=$OUT bash bench/run_h200_session18.sh single   # one query row to triton_sparse_decode on SM90 (FLASHMLA_SINGLE_ROW_
#                                                    # CASES): GPU tests, the selection on this machine, the op's
#                                                    # conformance (auto selection), the demo at batch 1 with FlashMLA
#                                                    # forced and as selected, in turns
#   R=$OUT bash bench/run_h200_session18.sh alltests # the whole test suite on the GPU machine, as four pytest runs
#                                                    # side by side (files dealt by size): each run's failures,
#                                                    # errors and skips
#   R=$OUT bash bench/run_h200_session18.sh refixed  # the test files that failed in alltests, after their fixes (two
#                                                    # runs side by side), and the quick start as a user runs it
set -uo pipefail
part=${1:?check, conform, parts, single, alltests or refixed}
source bench/h200_env.sh
if [[ $part == check ]]; then
  { stamp "GPU tests: host cost (the tensor checks on CUDA tensors), prepared weights, custom ops"
    gpu_tests 150 check tests/test_host_cost.py tests/test_prepared_weights.py tests/test_custom_ops.py
    grep -E "^E  " /tmp/pytest-check.log | head -8 | cut -c1-600
    stamp "host cost, part by part (bench/host_parts.py)"
    timeout 150 python3 bench/host_parts.py --json "$R/host-parts.json" > /tmp/host-parts.log 2>&1
    echo "rc=$?"; grep -v Warn /tmp/host-parts.log | tail -13
    for round in 1 2 3; do
      stamp "host cost: dsv4hal bench attention --quick (round $round)"
      timeout 150 $D bench attention --quick --json "$R/bench-attention-host-r$round.json" > /tmp/bench-att.log 2>&1
      echo "rc=$?"; grep -v Warn /tmp/bench-att.log | tail -3 | cut -c1-300
    done
    stamp "demo (as selected)"; demo_flash 120 demo-flash
    stamp "soak, 1 minute"
    timeout 150 $D soak --minutes 1 --json "$R/soak-1min.json" > /tmp/soak.log 2>&1
    echo "rc=$?"; grep -v Warn /tmp/soak.log | tail -6 | cut -c1-300
  } 2>&1 | tee "$R/log-check18.txt"
fi
if [[ $part == conform ]]; then  # the reports were committed as conformance-cuda_sm90-all-{moe,attention,rest}.json
  { conform_all 540 conformance-cuda_sm90-all
  } 2>&1 | tee "$R/log-conform18.txt"
fi
if [[ $part == parts ]]; then  # the host cost part by part again, with the split key, the tensor checks and whether
                               # the checks answered the validated calls
  { stamp "host cost, part by part (bench/host_parts.py)"
    timeout 150 python3 bench/host_parts.py --json "$R/host-parts-checks.json" > /tmp/host-parts.log 2>&1
    echo "rc=$?"; grep -v Warn /tmp/host-parts.log | tail -16
  } 2>&1 | tee "$R/log-parts18.txt"
fi
if [[ $part == single ]]; then
  { stamp "GPU tests: selection, the FlashMLA call sequence (forced), the glue, the Triton decode"
    gpu_tests 200 single tests/test_selection.py tests/test_gpu_flashmla_sequence.py tests/test_flashmla_glue_ops.py \
      tests/test_cli_misuse.py tests/test_typed_surface.py
    grep -E "^E  " /tmp/pytest-single.log | head -8 | cut -c1-600
    stamp "explain on this machine"
    for c in "--case tokens=single" "--case tokens=single --case extra_class=long" "--case tokens=batch"; do
      $D explain sparse_attention_decode $c 2>&1 | head -1 | cut -c1-400; done
    conform 200 conformance-cuda_sm90-decode-single sparse_attention_decode
    for round in 1 2; do
      stamp "demo at batch 1, FlashMLA forced (round $round)"
      DSV4HAL_KERNELS=sparse_attention_decode=flashmla_sm90_sgl timeout 100 $D demo --size flash --batch 1 \
        --context 32768 --steps 8 --fill random --json "$R/demo-flash-b1-flashmla-r$round.json" > /tmp/d1.log 2>&1
      echo "rc=$?"; grep -E "graph step|sparse_attention_decode" /tmp/d1.log | head -3
      stamp "demo at batch 1, as selected (round $round)"
      timeout 100 $D demo --size flash --batch 1 --context 32768 --steps 8 --fill random \
        --json "$R/demo-flash-b1-r$round.json" > /tmp/d2.log 2>&1
      echo "rc=$?"; grep -E "graph step|sparse_attention_decode" /tmp/d2.log | head -3
    done
  } 2>&1 | tee "$R/log-single18.txt"
fi
if [[ $part == alltests ]]; then
  { stamp "the whole test suite on the GPU, four runs side by side"
    mapfile -t files < <(wc -l tests/test_*.py | grep -v total | sort -rn | awk '{print $2}')
    for i in 0 1 2 3; do
      group=(); for j in "${!files[@]}"; do (( j % 4 == i )) && group+=("${files[$j]}"); done
      OMP_NUM_THREADS=4 timeout 500 python3 -m pytest -q -p no:cacheprovider -p no:warnings -rfEs "${group[@]}" \
        > "/tmp/pytest-all$i.log" 2>&1 &
    done
    for i in 0 1 2 3; do wait -n; echo "a run ended: rc=$? at $(( $(date +%s) - T0 ))s"; done
    for i in 0 1 2 3; do echo "run $i:"; grep -E "^FAILED|^ERROR|passed|failed|^SKIPPED" "/tmp/pytest-all$i.log" \
      | cut -c1-300 | tail -40; grep -E "^E  " "/tmp/pytest-all$i.log" | head -10 | cut -c1-400; done
  } 2>&1 | tee "$R/log-alltests18.txt"
fi
if [[ $part == refixed ]]; then
  { stamp "the fixed tests on the GPU, two runs side by side; the quick start"
    OMP_NUM_THREADS=8 timeout 230 python3 -m pytest -q -p no:cacheprovider -p no:warnings -rfEs tests/test_moe_align.py \
      tests/test_quickstart.py tests/test_triton_moe.py \
      -k "not swapped and not paired and not one_token and not fused_cast and not down and not above_128 and not shapes" \
      > /tmp/pytest-refix0.log 2>&1 &
    OMP_NUM_THREADS=8 timeout 230 python3 -m pytest -q -p no:cacheprovider -p no:warnings -rfEs tests/test_lock.py \
      tests/test_platform_and_cli.py tests/test_marlin_binding.py tests/test_bench_mhc_gemm.py \
      tests/test_moe_vendor_bindings.py tests/test_cli_misuse.py tests/test_deepgemm_moe.py tests/test_deepgemm_mhc.py \
      > /tmp/pytest-refix1.log 2>&1 &
    timeout 120 python3 examples/quickstart.py 2>&1 | grep -v Warn | tail -4; echo "quickstart rc=${PIPESTATUS[0]}"
    wait
    for i in 0 1; do echo "run $i:"; grep -E "^FAILED|^ERROR|passed|failed" "/tmp/pytest-refix$i.log" | tail -20 \
      | cut -c1-300; grep -E "^E  " "/tmp/pytest-refix$i.log" | head -8 | cut -c1-400; done
  } 2>&1 | tee "$R/log-refixed18.txt"
fi
