#!/usr/bin/env bash
# The H200 plan of the ninth session (2026-12-01): results straight into the call's output folder ($R=$OUT); at
# most 8 files come back from a call, so logs stay in /tmp and their tails go to the part's log.
#   R=$OUT bash bench/run_h200_session10.sh probe  # torch.mm's fp32 output from bf16 operands (the demo's
#                                                  # linear_bf16_fp32); mHC's apply launch swept
#                                                  # (bench/sweep_mhc_apply.py); the demo with its bf16 projections;
#                                                  # tests/test_demo.py on the GPU
set -uo pipefail
part=${1:?probe}
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
