#!/usr/bin/env bash
# The H200 plan of the eighteenth session (2026-12-04): results straight into the call's output folder ($R=$OUT); at
# most 8 files come back from a call, so logs stay in /tmp and their tails go to the part's log.
#   R=$OUT bash bench/run_h200_session19.sh host     # the unvalidated call's case key and the inlined FlashMLA glue:
#                                                    # GPU tests of the glue and the host cost, the op's conformance
#                                                    # (eager and graph), the host cost part by part, three rounds of
#                                                    # dsv4hal bench attention --quick, the yardstick demo
#   R=$OUT bash bench/run_h200_session19.sh tail     # the row top-k's tail tile: GPU tests of the three top-k kernels,
#                                                    # the row shapes tuned (padded against tail, every warp count),
#                                                    # indexer_topk's conformance, the yardstick demo
#   R=$OUT bash bench/run_h200_session19.sh half     # the top-k tune again, with a row half past a power of two
#   R=$OUT bash bench/run_h200_session19.sh final    # the whole conformance catalog (auto selection, eager and graph)
#                                                    # as three reports side by side, then a 1-minute soak of every op
set -uo pipefail
part=${1:?host, tail, half or final}
source bench/h200_env.sh
if [[ $part == host ]]; then
  { stamp "GPU tests: the FlashMLA glue and call sequence, the host cost, the typed surface"
    gpu_tests 200 host tests/test_flashmla_decode_op.py tests/test_gpu_flashmla_sequence.py \
      tests/test_flashmla_glue_ops.py tests/test_host_cost.py tests/test_typed_surface.py tests/test_custom_ops.py
    grep -E "^E  " /tmp/pytest-host.log | head -8 | cut -c1-600
    conform 200 conformance-cuda_sm90-decode-case-key sparse_attention_decode
    stamp "host cost, part by part (bench/host_parts.py)"
    timeout 150 python3 bench/host_parts.py --json "$R/host-parts-case-key.json" > /tmp/host-parts.log 2>&1
    echo "rc=$?"; grep -v Warn /tmp/host-parts.log | tail -16
    for round in 1 2 3; do
      stamp "host cost: dsv4hal bench attention --quick (round $round)"
      timeout 150 $D bench attention --quick --json "$R/bench-attention-host-case-key-r$round.json" \
        > /tmp/bench-att.log 2>&1
      echo "rc=$?"; grep -v Warn /tmp/bench-att.log | tail -3 | cut -c1-300
    done
    stamp "demo (as selected)"; demo_flash 120 demo-flash
  } 2>&1 | tee "$R/log-host19.txt"
fi
if [[ $part == tail ]]; then
  { stamp "GPU tests: the row, chunked and sampled top-k"
    gpu_tests 240 topk tests/test_triton_row_topk.py tests/test_triton_chunked_topk.py tests/test_triton_sampled_topk.py
    grep -E "^E  " /tmp/pytest-topk.log | head -8 | cut -c1-600
    stamp "top-k tune (bench/tune_triton.py --ops topk)"; tune_topk 240 tune-topk-tail
    conform 200 conformance-cuda_sm90-topk-tail indexer_topk
    stamp "demo (as selected)"; demo_flash 120 demo-flash
  } 2>&1 | tee "$R/log-tail19.txt"
fi
if [[ $part == final ]]; then
  { conform_all 420 conformance-cuda_sm90-final
    stamp "soak, 1 minute"
    timeout 150 $D soak --minutes 1 --json "$R/soak-1min.json" > /tmp/soak.log 2>&1
    echo "rc=$?"; grep -v Warn /tmp/soak.log | tail -6 | cut -c1-300
  } 2>&1 | tee "$R/log-final19.txt"
fi
if [[ $part == half ]]; then
  { stamp "top-k tune (bench/tune_triton.py --ops topk), 12288 too"; tune_topk 200 tune-topk-tail-half
  } 2>&1 | tee "$R/log-half19.txt"
fi
