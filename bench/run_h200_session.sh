#!/usr/bin/env bash
# The H200 runs of the 2026-11-30 second session, in three device calls (results in $OUT as one tarball each):
#   bash bench/run_h200_session.sh A   # quick soak, GPU tests, conformance of the new and changed ops, the FlashMLA
#                                      # sequence (its 10-minute soak crashed on a harness bug: see the soak report)
#   bash bench/run_h200_session.sh B   # benchmarks, the demo and the tuned lock alone on the GPU, then the
#                                      # 10-minute soak started in the background (setsid)
#   bash bench/run_h200_session.sh C   # beside the soak: GPU tests and conformance again; then collect the soak
set -uo pipefail
part=${1:?A, B or C}
source bench/h200_env.sh
if [[ $part == A ]]; then
  {
    nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader
    dsv4hal info --json > "$R/info.json"
    stamp "quick soak"
    timeout 120 dsv4hal soak --minutes 0.3 --json "$R/soak-quick.json" 2>&1 | tail -3
    stamp "10-minute soak started in the background"
    setsid nohup dsv4hal soak --minutes ${SOAK_MINUTES:-10} --json /tmp/soak.json > /tmp/soak.log 2>&1 < /dev/null &
    stamp "GPU tests"
    timeout 420 python3 -m pytest -q -x -p no:cacheprovider tests/test_triton_kernels.py tests/test_triton_mhc.py \
      tests/test_triton_compress.py tests/test_indexer_logits_kernels.py tests/test_indexer_store.py \
      tests/test_gpu_flashmla_sequence.py 2>&1 | tail -15
    stamp "conformance: new and changed ops (auto selection)"
    timeout 300 dsv4hal conformance --platform cuda_sm90 \
      --ops mhc_pre,mhc_post,mhc_head,mhc_post_pre,compress,compress_decode,indexer_logits,indexer_store \
      --json "$R/conformance-cuda_sm90-new-ops.json" --markdown "$R/conformance-cuda_sm90-new-ops.md" --quiet | tail -2
    stamp "conformance: attention, caches, top-k, metadata after the index-rule change"
    timeout 240 dsv4hal conformance --platform cuda_sm90 \
      --ops pack_store,dequant_gather,sparse_attention_decode,sparse_attention_prefill,indexer_topk,build_attention_metadata,decode_step \
      --json "$R/conformance-cuda_sm90-attention.json" --markdown "$R/conformance-cuda_sm90-attention.md" --quiet | tail -2
    stamp "FlashMLA sequence"
    timeout 200 python3 bench/flashmla_sequence.py > "$R/flashmla-sequence.json"; echo "ordered rc=$?"
    timeout 100 python3 bench/flashmla_sequence.py --unordered > "$R/flashmla-sequence-unordered.txt" 2>&1
    echo "unordered rc=$?"; tail -c 600 "$R/flashmla-sequence-unordered.txt"
    stamp "soak so far"; tail -2 /tmp/soak.log
  } 2>&1 | tee "$R/log-A.txt"
elif [[ $part == B ]]; then
  {
    stamp "benchmarks (nothing else on the GPU)"
    timeout 200 dsv4hal bench mhc,compress,indexer --json "$R/bench-kernels.json" 2>&1 | grep -v Warning | tail -45
    stamp "demo"
    timeout 150 dsv4hal demo --size flash --batch 64 --context 32768 --steps 8 --fill random \
      --json "$R/demo-flash.json" --plot "$R/demo-flash.png" 2>&1 | tail -25
    stamp "tune"
    timeout 150 dsv4hal tune --platform cuda_sm90 --out "$R/cuda_sm90.lock.json" --markdown "$R/tune-cuda_sm90.md" \
      2>&1 | tail -25
    stamp "10-minute soak started in the background"
    setsid nohup dsv4hal soak --minutes ${SOAK_MINUTES:-10} --json /tmp/soak.json > /tmp/soak.log 2>&1 < /dev/null &
    sleep 20; tail -2 /tmp/soak.log
  } 2>&1 | tee "$R/log-B.txt"
else
  {
    stamp "GPU tests (beside the soak)"
    timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_triton_mhc.py tests/test_triton_compress.py \
      tests/test_indexer_logits_kernels.py tests/test_indexer_store.py 2>&1 | tail -8
    stamp "conformance of the new ops again"
    timeout 240 dsv4hal conformance --platform cuda_sm90 \
      --ops mhc_pre,mhc_post,mhc_head,mhc_post_pre,compress,compress_decode,indexer_logits,indexer_store \
      --json "$R/conformance-cuda_sm90-new-ops.json" --markdown "$R/conformance-cuda_sm90-new-ops.md" --quiet | tail -2
    DSV4HAL_KERNELS=indexer_logits=triton_indexer_logits timeout 120 dsv4hal conformance --platform cuda_sm90 \
      --ops indexer_logits --json "$R/conformance-cuda_sm90-indexer-triton.json" --quiet | tail -2
    stamp "waiting for the soak"
    for _ in $(seq 1 100); do [[ -s /tmp/soak.json ]] && break; sleep 5; done
    tail -3 /tmp/soak.log; cp /tmp/soak.json /tmp/soak.log "$R/" 2>/dev/null
  } 2>&1 | tee "$R/log-C.txt"
fi
tar czf "$OUT/results-$part.tgz" -C "$R" .
