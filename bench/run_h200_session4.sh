#!/usr/bin/env bash
# The H200 plan after the 2026-12-01 session (results in $OUT as one tarball per part). Four calls back to back
# (a machine goes back after 30 s idle; a process left running when a call ends dies with it), about 30 minutes:
#   bash bench/run_h200_session4.sh verify  # GPU tests (with the new MoE and top-k kernels), the whole conformance
#                                           # catalog (with the new decode classes' cases)
#   bash bench/run_h200_session4.sh bench   # the compiled decode step in a CUDA graph, host cost, MoE, top-k, mHC
#                                           # (with DeepGEMM's hc_prenorm GEMM against the Triton partials)
#   bash bench/run_h200_session4.sh soak    # the soak alone in the foreground (SOAK_MINUTES, default 9)
#   bash bench/run_h200_session4.sh final   # the demo; the lock re-tuned for the ops whose kernels or buckets changed
set -uo pipefail
part=${1:?verify, bench, soak or final}
source bench/h200_env.sh
D="python3 -m dsv4hal"
if [[ $part == verify ]]; then
  {
    nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader
    $D info --json > "$R/info.json"
    stamp "GPU tests"
    timeout 170 python3 -m pytest -q -p no:cacheprovider tests/test_fp8_codec.py tests/test_triton_row_topk.py \
      tests/test_triton_chunked_topk.py tests/test_triton_moe_align.py tests/test_triton_moe_glue.py \
      tests/test_triton_kernels.py tests/test_triton_mhc.py tests/test_triton_compress.py \
      tests/test_indexer_logits_kernels.py tests/test_indexer_store.py tests/test_gpu_flashmla_sequence.py 2>&1 | tail -12
    stamp "conformance: the whole catalog (auto selection)"
    timeout 400 $D conformance --platform cuda_sm90 --json "$R/conformance-cuda_sm90.json" \
      --markdown "$R/conformance-cuda_sm90.md" --quiet | tail -3
  } 2>&1 | tee "$R/log-verify.txt"
elif [[ $part == bench ]]; then
  {
    stamp "compiled decode step in a CUDA graph"
    timeout 60 python3 bench/compiled_decode_graph.py > "$R/compiled-decode-graph.json"; echo "rc=$?"
    tail -c 400 "$R/compiled-decode-graph.json"
    stamp "host cost, MoE"
    timeout 50 $D bench attention --quick --json "$R/bench-attention-host.json" 2>&1 | grep -v Warning | tail -6
    timeout 150 $D bench moe --json "$R/bench-moe.json" --plot "$R/bench-moe.png" 2>&1 | grep -v Warning | tail -30
    stamp "top-k, mHC"
    timeout 80 $D bench topk --json "$R/bench-topk.json" --plot "$R/bench-topk.png" 2>&1 | grep -v Warning | tail -16
    timeout 110 $D bench mhc --json "$R/bench-mhc.json" 2>&1 | grep -v Warning | tail -30
    stamp "pack_store / dequant_gather BLOCK_T sweep"
    timeout 60 python3 bench/tune_triton.py --json "$R/tune-triton-cache.json" --ops cache 2>&1 | tail -8
  } 2>&1 | tee "$R/log-bench.txt"
elif [[ $part == soak ]]; then
  {
    stamp "soak alone on the GPU"
    timeout 590 $D soak --minutes "${SOAK_MINUTES:-9}" --json "$R/soak.json" > "$R/soak.log" 2>&1
    echo "soak rc=$?"; tail -3 "$R/soak.log"
  } 2>&1 | tee "$R/log-soak.txt"
else
  {
    stamp "demo"
    timeout 120 $D demo --size flash --batch 64 --context 32768 --steps 8 --fill random \
      --json "$R/demo-flash.json" --plot "$R/demo-flash.png" 2>&1 | tail -25
    stamp "tune the changed ops into the committed lock"
    cp bench/results/h200/cuda_sm90.lock.json "$R/cuda_sm90.lock.json"
    timeout 300 $D tune --platform cuda_sm90 --ops sparse_attention_decode,indexer_topk,moe_experts,moe_route --update \
      --out "$R/cuda_sm90.lock.json" --markdown "$R/tune-cuda_sm90.md" 2>&1 | tail -25
  } 2>&1 | tee "$R/log-final.txt"
fi
tar czf "$OUT/results-$part.tgz" -C "$R" .
