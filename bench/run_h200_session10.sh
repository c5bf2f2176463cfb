#!/usr/bin/env bash
# The H200 plan of the ninth session (2026-12-01): results straight into the call's output folder ($R=$OUT); at
# most 8 files come back from a call, so logs stay in /tmp and their tails go to the part's log.
#   R=$OUT bash bench/run_h200_session10.sh probe  # torch.mm's fp32 output from bf16 operands (the demo's
#                                                  # linear_bf16_fp32); mHC's apply launch swept
#                                                  # (bench/sweep_mhc_apply.py); the demo with its bf16 projections;
#                                                  # tests/test_demo.py on the GPU
#   R=$OUT bash bench/run_h200_session10.sh sched  # FlashMLA's plan from one parallel program: GPU tests, checked
#                                                  # against the vendor's own (bench/check_flashmla_sched.py);
#                                                  # the demo inside a declared decode step
#   R=$OUT bash bench/run_h200_session10.sh verify # after sched: GPU tests (summary shown), the plan checked (the
#                                                  # check timed out in sched: a compile per batch value), mHC
#                                                  # conformance
#   R=$OUT bash bench/run_h200_session10.sh final  # the mHC bench; the demo compiled (the eager yardstick is
#                                                  # sched's: no kernel changed after it)
#   R=$OUT bash bench/run_h200_session10.sh sweep  # the top-k passes' warps (bench/tune_triton.py --ops topk);
#                                                  # the parallel plan's warps (check_flashmla_sched.py --warps)
set -uo pipefail
part=${1:?probe, sched, verify, final or sweep}
source bench/h200_env.sh
if [[ $part == probe ]]; then
  {
    stamp "torch.mm(bf16, bf16, out_dtype=float32) against the fp32 product of the same values"
    python3 - <<'PY'
import torch
g = torch.Generator("cuda").manual_seed(0)
x = torch.randn(64, 4096, generator=g, device="cuda").bfloat16()
w = torch.randn(2048, 4096, generator=g, device="cuda").bfloat16()
a = torch.mm(x, w.t(), out_dtype=torch.float32)
torch.backends.cuda.matmul.allow_tf32 = False
b = x.float() @ w.float().T
print("dtype", a.dtype, "max rel diff", float((a - b).abs().max() / b.abs().max()))
PY
    stamp "mHC apply launch sweep (bench/sweep_mhc_apply.py)"
    timeout 240 python3 bench/sweep_mhc_apply.py --json "$R/sweep-mhc-apply-warps.json" > /tmp/sweep-mhc.log 2>&1
    echo "rc=$?"; grep -v Warn /tmp/sweep-mhc.log | grep -E "current\": true|whole|Error|error" | cut -c1-300 | tail -30
    stamp "demo (bf16 projections with fp32 output)"
    demo_flash 150 demo-flash-harness10
    stamp "GPU tests: the demo"
    timeout 150 python3 -m pytest -q -p no:cacheprovider -p no:warnings tests/test_demo.py > /tmp/pytest-demo.log 2>&1
    echo "rc=$?"; grep -E "FAILED|ERROR|passed|failed|Error" /tmp/pytest-demo.log | tail -12 | cut -c1-400
  } 2>&1 | tee "$R/log-probe10.txt"
fi
if [[ $part == sched ]]; then
  {
    stamp "GPU tests: FlashMLA's parallel plan, the decode glue, mHC, the demo"
    timeout 240 python3 -m pytest -q -p no:cacheprovider -p no:warnings tests/test_flashmla_sched.py \
      tests/test_flashmla_decode_op.py tests/test_triton_mhc.py tests/test_deepgemm_mhc.py tests/test_demo.py \
      > /tmp/pytest-sched.log 2>&1
    echo "rc=$?"; grep -E "FAILED|ERROR|passed|failed|Error" /tmp/pytest-sched.log | tail -12 | cut -c1-400
    stamp "the parallel plan against sgl-flash-mla's own (bench/check_flashmla_sched.py)"
    timeout 200 python3 bench/check_flashmla_sched.py --json "$R/check-flashmla-sched.json" > /tmp/check-sched.log 2>&1
    echo "rc=$?"; grep -v Warn /tmp/check-sched.log | tail -8 | cut -c1-600
    stamp "demo (a declared decode step: the parallel plan; mHC's apply on one warp)"
    demo_flash 150 demo-flash
  } 2>&1 | tee "$R/log-sched10.txt"
fi
if [[ $part == verify ]]; then
  {
    stamp "GPU tests: FlashMLA's parallel plan, the decode glue, mHC, the demo"
    timeout 240 python3 -m pytest -p no:cacheprovider -p no:warnings -rfE tests/test_flashmla_sched.py \
      tests/test_flashmla_decode_op.py tests/test_triton_mhc.py tests/test_deepgemm_mhc.py tests/test_demo.py \
      > /tmp/pytest-verify.log 2>&1
    echo "rc=$?"; grep -E "^FAILED|^ERROR|passed|failed" /tmp/pytest-verify.log | tail -12 | cut -c1-400
    stamp "the parallel plan against sgl-flash-mla's own (bench/check_flashmla_sched.py)"
    timeout 240 python3 bench/check_flashmla_sched.py --json "$R/check-flashmla-sched.json" > /tmp/check-sched.log 2>&1
    echo "rc=$?"; grep -v Warn /tmp/check-sched.log | tail -12 | cut -c1-600
    stamp "conformance: the mHC ops (eager and graph), after the apply launch's change"
    timeout 200 $D conformance --ops mhc_pre,mhc_post,mhc_post_pre,mhc_head --quiet \
      --json "$R/conformance-cuda_sm90-mhc-one-warp.json" > /tmp/conf-mhc.log 2>&1
    echo "rc=$?"; tail -4 /tmp/conf-mhc.log | cut -c1-300
  } 2>&1 | tee "$R/log-verify10.txt"
fi
if [[ $part == final ]]; then
  {
    stamp "mHC bench"
    timeout 150 $D bench mhc --quick --json "$R/bench-mhc.json" > /tmp/bench-mhc.log 2>&1
    echo "rc=$?"; grep -v Warn /tmp/bench-mhc.log | tail -14 | cut -c1-300
    stamp "demo, the decode step compiled (inductor) inside the declared step"
    demo_flash 300 demo-flash-compiled --compile
  } 2>&1 | tee "$R/log-final10.txt"
fi
if [[ $part == sweep ]]; then
  {
    stamp "top-k: the sample and select passes' warps, the row kernel's (bench/tune_triton.py --ops topk)"
    timeout 240 python3 bench/tune_triton.py --json "$R/tune-triton-topk-warps.json" --ops topk > /tmp/tune-topk.log 2>&1
    echo "rc=$?"; topk_rows "$R/tune-triton-topk-warps.json"
    stamp "FlashMLA's parallel plan: its warps (bench/check_flashmla_sched.py --warps)"
    timeout 100 python3 bench/check_flashmla_sched.py --warps --json "$R/sweep-flashmla-sched-warps.json" \
      > /tmp/sweep-sched.log 2>&1
    echo "rc=$?"; grep -v Warn /tmp/sweep-sched.log | tail -6 | cut -c1-500
  } 2>&1 | tee "$R/log-sweep10.txt"
fi
