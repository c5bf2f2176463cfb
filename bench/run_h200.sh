#!/usr/bin/env bash
# Everything dsv4hal checks and times on the H200, in one go (run through the device tool from the repo
# root, with the vendor bundle carried in .kernels/: see bench/README.md). Writes into $OUT.
set -uo pipefail
OUT=${OUT:-out/h200}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if [ -d .kernels/bundle ]; then
  source .kernels/install-kernels.sh .kernels/bundle /tmp/dsv4hal-site || echo "vendor bundle did not install"
fi
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1 || echo "pip install -e . failed"
what=${1:-all}
{
  nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv
  dsv4hal info
  dsv4hal info --json > "$OUT/info.json"
  if [[ $what == all || $what == tests ]]; then
    python3 -m pytest -q -x tests/test_triton_kernels.py -p no:cacheprovider
  fi
  if [[ $what == all || $what == conformance ]]; then
    timeout ${CONF_TIMEOUT:-400} dsv4hal conformance --platform cuda_sm90 ${OPS:+--ops $OPS} \
      --json "$OUT/conformance-cuda_sm90.json" --markdown "$OUT/conformance-cuda_sm90.md" > /dev/null
  fi
  if [[ $what == all || $what == conformance ]]; then
    DSV4HAL_KERNELS=sparse_attention_decode=triton_sparse_decode,sparse_attention_prefill=triton_sparse_prefill \
      timeout ${CONF_TIMEOUT:-400} dsv4hal conformance --platform cuda_sm90 \
      --ops sparse_attention_decode,sparse_attention_prefill,decode_step \
      --json "$OUT/conformance-cuda_sm90-triton-attention.json" \
      --markdown "$OUT/conformance-cuda_sm90-triton-attention.md" > /dev/null
  fi
  if [[ $what == all || $what == moe ]]; then
    timeout ${CONF_TIMEOUT:-400} dsv4hal conformance --platform cuda_sm90 --ops moe_route,moe_experts \
      ${CASES:+--cases "$CASES"} \
      --json "$OUT/conformance-cuda_sm90-moe.json" --markdown "$OUT/conformance-cuda_sm90-moe.md" > /dev/null
    DSV4HAL_KERNELS=moe_experts=triton_fused_moe,moe_route=triton_moe_route \
      timeout ${CONF_TIMEOUT:-400} dsv4hal conformance --platform cuda_sm90 --ops moe_route,moe_experts \
      ${CASES:+--cases "$CASES"} \
      --json "$OUT/conformance-cuda_sm90-moe-triton.json" --markdown "$OUT/conformance-cuda_sm90-moe-triton.md" \
      > /dev/null
  fi
  if [[ $what == all || $what == demo ]]; then
    timeout ${DEMO_TIMEOUT:-300} dsv4hal demo --size flash --batch ${DEMO_BATCH:-64} --context ${DEMO_CONTEXT:-32768} \
      --steps 8 --fill random --compare-cpu --json "$OUT/demo-flash.json" --plot "$OUT/demo-flash.png"
  fi
  if [[ $what == all || $what == sequence ]]; then
    # issue 12.1: the FlashMLA call sequence with ordered streams (must pass), then the unordered harness
    # (triton's do_bench_cudagraph with no sync) in a process of its own, which may die: recorded, not required
    timeout 300 python3 bench/flashmla_sequence.py > "$OUT/flashmla-sequence.json"; echo "ordered sequence rc=$?"
    timeout 120 python3 bench/flashmla_sequence.py --unordered > "$OUT/flashmla-sequence-unordered.json" 2>&1
    echo "unordered sequence rc=$?"
  fi
  if [[ $what == soak ]]; then
    timeout $(( ${SOAK_MINUTES:-10} * 60 + 240 )) dsv4hal soak --minutes ${SOAK_MINUTES:-10} --json "$OUT/soak.json"
  fi
  if [[ $what == all || $what == bench ]]; then
    timeout ${BENCH_TIMEOUT:-400} dsv4hal bench ${BENCH:-all} --json "$OUT/bench-${BENCH:-all}.json" --plot "$OUT/bench-${BENCH:-all}.png"
  fi
} 2>&1 | tee "$OUT/log.txt"
