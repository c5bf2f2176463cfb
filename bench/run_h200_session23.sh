#!/usr/bin/env bash
# The H200 plan of the twenty-second session (2026-12-04): results straight into the call's output folder ($R=$OUT); at
# most 8 files come back from a call, so logs stay in /tmp and their tails go to the part's log.
#   R=$OUT bash bench/run_h200_session23.sh gather   # the gather pass's scatter with each token's route rows loaded up
#                                                    # front: GPU tests, bench/ab_moe_fp8_prefill.py against the
#                                                    # previous moe_quant.py in turns (carry .kernels/old_moe_quant.py:
#                                                    # `git show 0d8ad11:dsv4hal/kernels/triton/moe_quant.py`) and
#                                                    # DeepGEMM's num_sms and BLOCK_N settings, dsv4hal bench moe
#                                                    # --quick three times
#   R=$OUT bash bench/run_h200_session23.sh blockn   # the psum GEMMs with BLOCK_N 128 (deepgemm_moe.PSUM_BLOCK_N): GPU
#                                                    # tests, bench/ab_moe_fp8_prefill.py --block-n against DeepGEMM's
#                                                    # heuristic in turns from T = 1 to 4096, dsv4hal bench moe --quick
#                                                    # three times, moe_experts' conformance (eager and graph)
#   R=$OUT bash bench/run_h200_session23.sh final    # the yardstick demo, dsv4hal bench moe --quick three times (the
#                                                    # FP8 line's run-to-run spread on another machine)
#   TAG=X R=$OUT bash bench/run_h200_session23.sh tgemm  # both psum GEMMs through DeepGEMM and a Triton grouped FP8
#                                                    # GEMM prototype (bench/proto_grouped_fp8_gemm.py) in turns, into
#                                                    # ab-moe-fp8-triton-gemm-X.json. X = 1: without TMA; tma: with it;
#                                                    # rescale: a variant since removed (the sum kept in units of the
#                                                    # current step's scales), its rows labelled /rescale
set -uo pipefail
part=${1:?gather, blockn, final or tgemm}
source bench/h200_env.sh
if [[ $part == gather ]]; then
  { stamp "GPU tests: the FP8 quantizers, the DeepGEMM glue, the sm90 compile checks"
    gpu_tests_errors 150 gather tests/test_moe_quant_rows.py tests/test_deepgemm_moe.py tests/test_triton_sm90_compile.py
    stamp "the FP8 psum call at prefill: the gather pass and the call against the previous moe_quant.py; DeepGEMM knobs"
    DG_PRINT_CONFIGS=1 timeout 280 python3 bench/ab_moe_fp8_prefill.py --old .kernels/old_moe_quant.py --knobs \
      --json "$R/ab-moe-fp8-gather.json" > /tmp/ab-gather.log 2>&1
    echo "rc=$?"; grep -v Warn /tmp/ab-gather.log | cut -c1-400 | tail -40
    bench_moe_quick 200
    bench_moe_again 100 "$R/bench-moe-quick-gather"
  } 2>&1 | tee "$R/log-gather23.txt"
fi
if [[ $part == blockn ]]; then
  { stamp "GPU tests: the DeepGEMM glue, the FP8 quantizers"
    gpu_tests_errors 120 blockn tests/test_deepgemm_moe.py tests/test_moe_quant_rows.py
    stamp "the FP8 psum call and its GEMMs: DeepGEMM's BLOCK_N against 128 in turns"
    DG_PRINT_CONFIGS=1 timeout 240 python3 bench/ab_moe_fp8_prefill.py --rounds 3 \
      --block-n 4096:0,4096:0.5,1024:0,512:0,64:0,8:0,1:0 --json "$R/ab-moe-fp8-block-n.json" > /tmp/ab-blockn.log 2>&1
    echo "rc=$?"; grep -v Warn /tmp/ab-blockn.log | grep -v "^{" | sed 's/GemmDesc(gemm_type=5, kernel_type=1, //' \
      | cut -c1-900 | sort -u | tail -16
    python3 - "$R/ab-moe-fp8-block-n.json" <<'PY'
import json, statistics, sys
rows = json.load(open(sys.argv[1]))["block_n"]
for key in sorted({(r["T"], r["dropped"]) for r in rows}):
    sel = [r for r in rows if (r["T"], r["dropped"]) == key]
    med = {b: {p: statistics.median(r[f"{p}_us"] for r in sel if r["block_n"] == b) for p in ("call", "gemm1", "gemm2")}
           for b in ("heuristic", 128)}
    print(key, "equal", all(r["equal"] for r in sel), {b: {p: round(v, 1) for p, v in m.items()} for b, m in med.items()})
PY
    bench_moe_quick 200
    bench_moe_again 100 "$R/bench-moe-quick-blockn"
    conform 170 conformance-cuda_sm90-moe-block-n moe_experts
  } 2>&1 | tee "$R/log-blockn23.txt"
fi
if [[ $part == final ]]; then
  { stamp "demo (as selected)"; demo_flash 150 demo-flash
    bench_moe_quick 200
    bench_moe_again 100 "$R/bench-moe-quick-final"
  } 2>&1 | tee "$R/log-final23.txt"
fi
if [[ $part == tgemm ]]; then
  { stamp "both psum GEMMs: DeepGEMM against the Triton grouped FP8 GEMM at several launch settings, in turns"
    timeout 300 python3 bench/ab_moe_fp8_prefill.py --triton-gemm 4096,512 --rounds 2 \
      --json "$R/ab-moe-fp8-triton-gemm-${TAG:-1}.json" > /tmp/ab-tgemm.log 2>&1
    echo "rc=$?"; grep -v Warn /tmp/ab-tgemm.log | cut -c1-400 | tail -32
  } 2>&1 | tee "$R/log-tgemm23.txt"
fi
