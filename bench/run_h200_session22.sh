#!/usr/bin/env bash
# The H200 plan of the twenty-first session (2026-12-04): results straight into the call's output folder ($R=$OUT); at
# most 8 files come back from a call, so logs stay in /tmp and their tails go to the part's log.
#   R=$OUT bash bench/run_h200_session22.sh glue     # the C++ call glue for FlashMLA's decode (kernels/native_glue.py):
#                                                    # GPU tests of the glue, the call sequence, the host cost and
#                                                    # the custom ops; the op's conformance (eager and graph); four
#                                                    # rounds of dsv4hal bench attention
#                                                    # --quick with the glue required; the yardstick demo
#   R=$OUT bash bench/run_h200_session22.sh final    # with the glue required: the whole conformance catalog as
#                                                    # three reports side by side, the compiled decode step captured
#                                                    # in a CUDA graph (bench/compiled_decode_graph.py), a 1-minute soak
#   R=$OUT bash bench/run_h200_session22.sh soak     # with the glue required: a 1-minute soak under the memory check's
#                                                    # floor-and-ceiling rule, dsv4hal bench moe --quick
#   R=$OUT bash bench/run_h200_session22.sh align    # route alignment with a SCAN launch between COUNT and PLACE: GPU
#                                                    # tests, the alignment beside the previous file in turns (carry
#                                                    # .kernels/old_moe_align.py: `git show 4ca7c2c:dsv4hal/kernels/
#                                                    # triton/moe_align.py`), dsv4hal bench moe --quick three times,
#                                                    # the yardstick demo, moe_experts' conformance (eager and graph)
#   R=$OUT bash bench/run_h200_session22.sh cross    # the SCAN launch from SCAN_MIN_PROGRAMS programs only: GPU tests of
#                                                    # the alignment, both sweeps against the previous file again,
#                                                    # dsv4hal bench moe --quick three times
# (Parts align and cross share align_ab, and bench_moe_again (now in h200_env.sh), since they ran; the commands
# they run are the same.)
set -uo pipefail
part=${1:?glue, final, soak, align or cross}
source bench/h200_env.sh
host_rounds() {  # PREFIX N: N rounds of dsv4hal bench attention --quick into $R/PREFIX-rI.json, the ratios' summary
  local prefix=$1 n=$2 round
  for round in $(seq 1 "$n"); do
    stamp "host cost: dsv4hal bench attention --quick (round $round, DSV4HAL_NATIVE_GLUE=${DSV4HAL_NATIVE_GLUE:-auto})"
    timeout 150 $D bench attention --quick --json "$R/$prefix-r$round.json" > "/tmp/$prefix-r$round.log" 2>&1
    echo "rc=$?"; grep -E "Error|error" "/tmp/$prefix-r$round.log" | tail -3 | cut -c1-300
  done
  python3 bench/host_ratio_summary.py "$R"/$prefix-r*.json
}
if [[ $part == glue ]]; then
  { stamp "build the C++ glue (DSV4HAL_NATIVE_GLUE=1: a failed build is an error)"
    DSV4HAL_NATIVE_GLUE=1 python3 -c "
import time; t = time.time()
from dsv4hal.kernels import native_glue
m = native_glue.module(native_glue.FLASHMLA_DECODE); print('built in', round(time.time() - t, 1), 's:', m.__file__)"
    stamp "GPU tests: the C++ glue, the FlashMLA glue and call sequence, the host cost, the typed surface, custom ops"
    gpu_tests 220 glue tests/test_native_glue.py tests/test_flashmla_decode_op.py tests/test_gpu_flashmla_sequence.py \
      tests/test_flashmla_glue_ops.py tests/test_host_cost.py tests/test_typed_surface.py tests/test_custom_ops.py
    grep -E "^E  " /tmp/pytest-glue.log | head -8 | cut -c1-600
    DSV4HAL_NATIVE_GLUE=1 conform 200 conformance-cuda_sm90-decode-native-glue sparse_attention_decode
    DSV4HAL_NATIVE_GLUE=1 host_rounds bench-attention-host-native-glue 4
    stamp "demo (as selected)"; demo_flash 150 demo-flash
  } 2>&1 | tee "$R/log-glue22.txt"
fi
if [[ $part == final ]]; then
  export DSV4HAL_NATIVE_GLUE=1  # the C++ glue required: a failed build fails the calls, never a silent Python glue
  { conform_all 300 conformance-cuda_sm90-final
    stamp "the decode step compiled (fullgraph) and captured in a CUDA graph, FlashMLA through the C++ glue"
    timeout 120 python3 bench/compiled_decode_graph.py > "$R/compiled-decode-graph.json" 2> /tmp/compiled.log
    echo "rc=$?"; tail -c 700 "$R/compiled-decode-graph.json"; grep -E "Error" /tmp/compiled.log | tail -3
    soak_1min 100
  } 2>&1 | tee "$R/log-final22.txt"
fi
if [[ $part == soak ]]; then
  export DSV4HAL_NATIVE_GLUE=1
  { soak_1min 100
    bench_moe_quick 200
  } 2>&1 | tee "$R/log-soak22.txt"
fi
align_ab() {  # SUFFIX TIMEOUT: bench/sweep_moe_align.py --old, prefill and decode route counts, into
             # $R/sweep-moe-align-prefill-SUFFIX.json and $R/sweep-moe-align-SUFFIX.json, their rows
  stamp "the alignment, this tree against the previous file in turns (prefill: blocks of 128; decode: blocks of 8)"
  timeout "$2" python3 bench/sweep_moe_align.py --prefill --old .kernels/old_moe_align.py \
    --json "$R/sweep-moe-align-prefill-$1.json" > /tmp/align-prefill.log 2>&1
  echo "rc=$?"; grep -v Warn /tmp/align-prefill.log | tail -3 | cut -c1-500
  timeout "$2" python3 bench/sweep_moe_align.py --old .kernels/old_moe_align.py \
    --json "$R/sweep-moe-align-$1.json" > /tmp/align-decode.log 2>&1
  echo "rc=$?"; grep -v Warn /tmp/align-decode.log | tail -6 | cut -c1-500
}
if [[ $part == align ]]; then
  { stamp "GPU tests: the route alignment (torch and Triton), the FP8 quantizers, the DeepGEMM glue"
    gpu_tests 150 align tests/test_triton_moe_align.py tests/test_moe_align.py tests/test_moe_quant_rows.py \
      tests/test_deepgemm_moe.py
    grep -E "^E  " /tmp/pytest-align.log | head -8 | cut -c1-600
    align_ab scan 90
    bench_moe_quick 200
    bench_moe_again 120 /tmp/bench-moe-quick  # not among the 8 files that come back: the log has the FP8 lines
    stamp "demo (as selected)"; demo_flash 130 demo-flash
    conform 170 conformance-cuda_sm90-moe-scan moe_experts
  } 2>&1 | tee "$R/log-align22.txt"
fi
if [[ $part == cross ]]; then
  { stamp "GPU tests: the route alignment, both PLACE paths"
    gpu_tests 80 cross tests/test_triton_moe_align.py tests/test_moe_align.py
    grep -E "^E  " /tmp/pytest-cross.log | head -8 | cut -c1-600
    align_ab cross 60
    bench_moe_quick 130
    bench_moe_again 60 "$R/bench-moe-quick-cross"
  } 2>&1 | tee "$R/log-cross22.txt"
fi
