#!/usr/bin/env bash
# The H200 runs of the 2026-12-01 session (results in $OUT as one tarball per part):
#   bash bench/run_h200_session3.sh verify  # GPU tests, the whole conformance catalog, the FlashMLA sequence, the
#                                           # compiled decode step in a CUDA graph, host cost, top-k
#   bash bench/run_h200_session3.sh soak    # the soak alone, in the foreground: a process left running when a
#                                           # device call ends does not survive into the next call, so the soak
#                                           # must fit one call (SOAK_MINUTES, default 9, plus ~1 min warm-up)
#   bash bench/run_h200_session3.sh final   # MoE benchmark, the demo, the tuned lock
# On 2026-12-01 `verify` ran (it then started the soak in the background, which died with the call); the soak
# (3.6 min) and `dsv4hal tune` ran in one later call, as bench/results/h200/README.md records.
set -uo pipefail
part=${1:?verify, soak or final}
source bench/h200_env.sh
if [[ $part == verify ]]; then
  {
    nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader
    python3 -m dsv4hal info --json > "$R/info.json"
    stamp "GPU tests"
    timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_triton_kernels.py tests/test_triton_mhc.py \
      tests/test_triton_compress.py tests/test_indexer_logits_kernels.py tests/test_indexer_store.py \
      tests/test_gpu_flashmla_sequence.py 2>&1 | tail -12
    stamp "conformance: the whole catalog (auto selection)"
    timeout 280 python3 -m dsv4hal conformance --platform cuda_sm90 --json "$R/conformance-cuda_sm90.json" \
      --markdown "$R/conformance-cuda_sm90.md" --quiet | tail -3
    stamp "conformance: the two-read top-k forced"
    DSV4HAL_KERNELS=indexer_topk=triton_filter_topk timeout 60 python3 -m dsv4hal conformance --platform cuda_sm90 \
      --ops indexer_topk --json "$R/conformance-cuda_sm90-filter-topk.json" --quiet | tail -2
    stamp "FlashMLA sequence"
    timeout 60 python3 bench/flashmla_sequence.py > "$R/flashmla-sequence.json"; echo "ordered rc=$?"
    stamp "compiled decode step in a CUDA graph"
    timeout 120 python3 bench/compiled_decode_graph.py > "$R/compiled-decode-graph.json"; echo "rc=$?"
    tail -c 700 "$R/compiled-decode-graph.json"
    stamp "host cost and top-k"
    timeout 60 python3 -m dsv4hal bench attention --quick --json "$R/bench-attention-host.json" 2>&1 | grep -v Warning | tail -12
    timeout 60 python3 -m dsv4hal bench topk --json "$R/bench-topk.json" --plot "$R/bench-topk.png" 2>&1 | grep -v Warning | tail -16
  } 2>&1 | tee "$R/log-verify.txt"
elif [[ $part == soak ]]; then
  {
    stamp "soak alone on the GPU"
    timeout 590 python3 -m dsv4hal soak --minutes "${SOAK_MINUTES:-9}" --json "$R/soak.json" > "$R/soak.log" 2>&1
    echo "soak rc=$?"; tail -3 "$R/soak.log"
  } 2>&1 | tee "$R/log-soak.txt"
else
  {
    stamp "MoE"
    timeout 150 python3 -m dsv4hal bench moe --json "$R/bench-moe.json" --plot "$R/bench-moe.png" 2>&1 | grep -v Warning | tail -30
    stamp "demo"
    timeout 120 python3 -m dsv4hal demo --size flash --batch 64 --context 32768 --steps 8 --fill random \
      --json "$R/demo-flash.json" --plot "$R/demo-flash.png" 2>&1 | tail -25
    stamp "tune"
    timeout 280 python3 -m dsv4hal tune --platform cuda_sm90 --out "$R/cuda_sm90.lock.json" --markdown "$R/tune-cuda_sm90.md" \
      2>&1 | tail -25
  } 2>&1 | tee "$R/log-final.txt"
fi
tar czf "$OUT/results-$part.tgz" -C "$R" .
