#!/usr/bin/env bash
# The H200 plan of the nineteenth session (2026-12-04): results straight into the call's output folder ($R=$OUT); at
# most 8 files come back from a call, so logs stay in /tmp and their tails go to the part's log.
#   R=$OUT bash bench/run_h200_session20.sh moe      # the FP8 MoE's gather pass per token + copy: GPU tests of the
#                                                    # quantizers and alignment, the gather pass and the whole FP8
#                                                    # psum call both ways (bench/sweep_moe_quant.py --per-token
#                                                    # --call), the prefill alignment's programs, moe_experts'
#                                                    # conformance through DeepGEMM's two layouts (forced)
#   R=$OUT bash bench/run_h200_session20.sh bench    # indexer_topk's conformance (garbage past the lengths, strided
#                                                    # rows), V4-Pro heads in prefill, the gather pass both ways at
#                                                    # 1-64 tokens, the FP8 call at
#                                                    # T = 4096 launch by launch, dsv4hal bench moe --quick, the
#                                                    # yardstick demo
#   R=$OUT bash bench/run_h200_session20.sh swiglu   # the SwiGLU pass on GEMM1's real output against randn rows
#                                                    # (tiles, warps), the FP8 call with DeepGEMM's PDL off and on
#   R=$OUT bash bench/run_h200_session20.sh final    # the whole conformance catalog (auto selection, eager and graph;
#                                                    # indexer_q_prep and the new cases in it) as three reports side
#                                                    # by side, a 1-minute soak
#   R=$OUT bash bench/run_h200_session20.sh last     # GPU tests of indexer_q_prep, the compressor, checked top-k and
#                                                    # the custom ops; their conformance; the yardstick demo with
#                                                    # indexer_q_prep; a 1-minute soak
set -uo pipefail
part=${1:?moe, bench, swiglu, final or last}
source bench/h200_env.sh
if [[ $part == moe ]]; then
  { stamp "GPU tests: the FP8 quantizers (per token + copy too), the route alignment"
    gpu_tests 150 moeq tests/test_moe_quant_rows.py tests/test_triton_moe_align.py tests/test_moe_align.py
    grep -E "^E  " /tmp/pytest-moeq.log | head -8 | cut -c1-600
    stamp "FP8 MoE gather: one launch against per token + copy, alone and in the call (bench/sweep_moe_quant.py)"
    timeout 170 python3 bench/sweep_moe_quant.py --per-token --call --tokens 64,256,1024,4096 \
      --json "$R/sweep-moe-per-token.json" > /tmp/per-token.log 2>&1
    echo "rc=$?"; grep -v Warn /tmp/per-token.log | tail -4 | cut -c1-300
    stamp "prefill route alignment over its programs (bench/sweep_moe_align.py --prefill)"
    timeout 60 python3 bench/sweep_moe_align.py --prefill --json "$R/sweep-moe-align-prefill.json" \
      > /tmp/align.log 2>&1
    echo "rc=$?"; grep -v Warn /tmp/align.log | tail -4 | cut -c1-400
    for impl in deepgemm_fp8_psum_sm90 deepgemm_fp8_sm90; do
      stamp "conformance: moe_experts through $impl (forced), eager and graph"
      DSV4HAL_KERNELS=moe_experts=$impl timeout 100 $D conformance --platform cuda_sm90 --ops moe_experts \
        --json "$R/conformance-cuda_sm90-moe-$impl-per-token.json" --quiet > /tmp/conf-$impl.log 2>&1
      echo "rc=$?"; tail -2 /tmp/conf-$impl.log | cut -c1-300
    done
  } 2>&1 | tee "$R/log-moe20.txt"
fi
if [[ $part == bench ]]; then
  { stamp "conformance: indexer_topk (all), sparse attention's V4-Pro heads (eager and graph)"
    conform 240 conformance-cuda_sm90-topk-h128 indexer_topk,sparse_attention_prefill,sparse_attention_decode \
      --cases '^k|^edge/zero|^edge/exactly|h128|v4-pro/extend'
    stamp "FP8 MoE gather at few tokens: one launch against per token + copy (bench/sweep_moe_quant.py)"
    timeout 60 python3 bench/sweep_moe_quant.py --per-token --tokens 1,4,8,16,32,64 \
      --json "$R/sweep-moe-per-token-few.json" > /tmp/per-token-few.log 2>&1
    echo "rc=$?"; grep -v Warn /tmp/per-token-few.log | tail -12 | cut -c1-300
    stamp "FP8 MoE at T = 4096: the call and its launches alone (bench/sweep_moe_quant.py --call-only)"
    timeout 90 python3 bench/sweep_moe_quant.py --call-only --json "$R/sweep-moe-fp8-call.json" \
      > /tmp/fp8-call.log 2>&1
    echo "rc=$?"; grep -v Warn /tmp/fp8-call.log | head -9 | cut -c1-300
    bench_moe_quick 240
    stamp "demo (as selected)"; demo_flash 150 demo-flash
  } 2>&1 | tee "$R/log-bench20.txt"
fi
if [[ $part == swiglu ]]; then
  { stamp "FP8 MoE at T = 4096: the SwiGLU pass on GEMM1's output and on randn, DeepGEMM's PDL in the call"
    timeout 200 python3 bench/sweep_moe_quant.py --real-swiglu --tokens 4096 --json "$R/sweep-moe-swiglu-real.json" \
      > /tmp/swiglu.log 2>&1
    echo "rc=$?"; grep -v Warn /tmp/swiglu.log | tail -30 | cut -c1-300
  } 2>&1 | tee "$R/log-swiglu20.txt"
fi
if [[ $part == last ]]; then
  { stamp "GPU tests: indexer_q_prep, the compressor (its Hadamard now the butterfly), checked top-k, custom ops"
    gpu_tests 200 last tests/test_indexer_q_prep.py tests/test_triton_compress.py tests/test_compress_decode.py \
      tests/test_bad_inputs.py tests/test_custom_ops.py
    grep -E "^E  " /tmp/pytest-last.log | head -8 | cut -c1-600
    stamp "conformance: indexer_q_prep, compress, compress_decode (eager and graph)"
    conform 150 conformance-cuda_sm90-q-prep-compress indexer_q_prep,compress,compress_decode
    stamp "demo (as selected; indexer_q_prep now an op)"; demo_flash 150 demo-flash
    soak_1min 110
  } 2>&1 | tee "$R/log-last20.txt"
fi
if [[ $part == final ]]; then
  { conform_all 380 conformance-cuda_sm90-final
    soak_1min 110
  } 2>&1 | tee "$R/log-final20.txt"
fi
