#!/usr/bin/env bash
# The H200 plan after the fourth session (2026-12-01): what that session changed without a GPU left to check it.
# Two calls back to back (a machine goes back after 30 s idle; a process dies with its call). Results are written
# straight into the call's output folder, so a call cut short still brings back what it finished:
#   R=$OUT bash bench/run_h200_session5.sh verify   # GPU tests of the FP8 decoder fix, the triton_kernels MoE and the
#                                                   # pack_store tiles; the compiled decode graph; the new MoE forced
#   R=$OUT bash bench/run_h200_session5.sh conform  # conformance of the new mHC kernels and of the FP8 psum MoE
#                                                   # (now the static FP8 choice; so far checked by tune) forced, and
#                                                   # of the cache ops
# Its third call was not run as written: bench/run_h200_session6.sh (moe, topk, final, lock) took its place.
set -uo pipefail
part=${1:?verify or conform}
source bench/h200_env.sh
D="python3 -m dsv4hal"
if [[ $part == verify ]]; then
  {
    stamp "GPU tests"
    timeout 220 python3 -m pytest -q -p no:cacheprovider -p no:warnings tests/test_fp8_codec.py \
      tests/test_oai_triton_moe.py tests/test_triton_pack_store_tiles.py 2>&1 | tail -15
    stamp "compiled decode step in a CUDA graph"
    timeout 60 python3 bench/compiled_decode_graph.py > "$R/compiled-decode-graph.json"; echo "rc=$?"
    tail -c 600 "$R/compiled-decode-graph.json"
    stamp "conformance: the triton_kernels MoE forced"
    DSV4HAL_KERNELS=moe_experts=triton_kernels_mxfp4_sm90 timeout 200 $D conformance --platform cuda_sm90 \
      --ops moe_experts --json "$R/conformance-cuda_sm90-moe-triton-kernels.json" --quiet | tail -2
  } 2>&1 | tee "$R/log-verify5.txt"
else
  {
    stamp "conformance: the DeepGEMM mHC kernels, the Triton post-then-pre, the FP8 psum MoE forced; the cache ops"
    DSV4HAL_KERNELS=mhc_pre=deepgemm_mhc_pre_sm90,mhc_post_pre=deepgemm_mhc_post_pre_sm90 timeout 160 $D conformance \
      --platform cuda_sm90 --ops mhc_pre,mhc_post_pre --json "$R/conformance-cuda_sm90-mhc-deepgemm.json" --quiet | tail -2
    DSV4HAL_KERNELS=mhc_post_pre=triton_mhc_post_then_pre timeout 120 $D conformance --platform cuda_sm90 \
      --ops mhc_post_pre --json "$R/conformance-cuda_sm90-mhc-post-then-pre.json" --quiet | tail -2
    DSV4HAL_KERNELS=moe_experts=deepgemm_fp8_psum_sm90 timeout 120 $D conformance --platform cuda_sm90 \
      --ops moe_experts --json "$R/conformance-cuda_sm90-moe-psum.json" --quiet | tail -2
    timeout 90 $D conformance --platform cuda_sm90 --ops pack_store,dequant_gather \
      --json "$R/conformance-cuda_sm90-cache.json" --quiet | tail -2
  } 2>&1 | tee "$R/log-conform5.txt"
fi
