#!/usr/bin/env bash
# The H200 plan of the seventh session (2026-12-01): results straight into the call's output folder ($R=$OUT); at
# most 8 files come back from a call, so logs stay in /tmp and their tails go to the part's log.
#   R=$OUT bash bench/run_h200_session8.sh host   # FlashMLA decode through its torch op: GPU tests, conformance of
#                                                 # sparse_attention_decode and the decode step, host cost (turns)
#   R=$OUT bash bench/run_h200_session8.sh lock   # moe_experts tuned strict into a copy of the lock (fixtures now
#                                                 # built per bucket); the top-k bench
#   R=$OUT bash bench/run_h200_session8.sh final  # the demo, with one replay profiled kernel by kernel
#   R=$OUT bash bench/run_h200_session8.sh sweep  # launch settings of the MXFP4 expert kernels at decode sizes (the
#                                                 # first call swept triton_kernels only, as bench/sweep_oai_moe.py)
#   R=$OUT bash bench/run_h200_session8.sh combo  # the sampled top-k's filter sweep, host cost with its parts, the demo
#   R=$OUT bash bench/run_h200_session8.sh marlin # Marlin's launch settings; indexer_topk conformance; the top-k bench
#   R=$OUT bash bench/run_h200_session8.sh mhc    # mHC's comb as scalars or a [4, 4] tile (bench/sweep_mhc_apply.py, at
#                                                 # commit 2e3f5b6: the scalar path and the script were removed after)
#   R=$OUT bash bench/run_h200_session8.sh final2 # mHC conformance; the demo, and the demo with its step compiled
#   R=$OUT bash bench/run_h200_session8.sh compiled # the demo with its step compiled, again (after the fakes' fix)
#   R=$OUT bash bench/run_h200_session8.sh indexer  # indexer logits against DeepGEMM direct (schedule once, per call)
#   R=$OUT bash bench/run_h200_session8.sh fused    # the sampled top-k with sampling fused into the filter (sweep)
set -uo pipefail
part=${1:?host, lock, final, sweep, combo, marlin, mhc, final2, compiled, indexer or fused}
source bench/h200_env.sh
bench_topk() {  # dsv4hal bench topk into $R/bench-topk.json/png, the log's tail
  stamp "top-k bench"
  timeout 100 $D bench topk --json "$R/bench-topk.json" --plot "$R/bench-topk.png" > /tmp/bench-topk.log 2>&1
  echo "rc=$?"; grep -v Warning /tmp/bench-topk.log | tail -16 | cut -c1-300
}
if [[ $part == host ]]; then
  {
    stamp "GPU tests: the FlashMLA call sequence, the decode glue"
    timeout 200 python3 -m pytest -q -p no:cacheprovider -p no:warnings tests/test_gpu_flashmla_sequence.py \
      tests/test_flashmla_decode_op.py tests/test_flashmla_glue_ops.py > /tmp/pytest-fmla.log 2>&1
    echo "rc=$?"; tail -4 /tmp/pytest-fmla.log
    stamp "conformance: sparse_attention_decode and the decode step (eager and graph)"
    timeout 200 $D conformance --ops sparse_attention_decode,decode_step --quiet \
      --json "$R/conformance-attention.json" > /tmp/conf.log 2>&1
    echo "rc=$?"; tail -6 /tmp/conf.log | cut -c1-300
    stamp "host cost (bench attention --quick)"
    timeout 150 $D bench attention --quick --json "$R/bench-attention-host.json" > /tmp/host.log 2>&1
    echo "rc=$?"; grep -v Warning /tmp/host.log | tail -8
    python3 - "$R/bench-attention-host.json" <<'PY'
import json, sys
for r in json.load(open(sys.argv[1]))["attention"]:
    if r.get("host_ratio_vs_direct"):
        print(r["config"], {k: round(v, 3) for k, v in r["host_ratio_vs_direct"].items()},
              r.get("same_output_as_direct"))
PY
  } 2>&1 | tee "$R/log-host8.txt"
elif [[ $part == lock ]]; then
  {
    stamp "the lock: moe_experts (token classes few, decode, prefill), strict"
    cp bench/results/h200/cuda_sm90.lock.json "$R/cuda_sm90.lock.json"
    DSV4HAL_STRICT=1 timeout 380 $D tune --platform cuda_sm90 --ops moe_experts --update --out "$R/cuda_sm90.lock.json" \
      --markdown "$R/tune-cuda_sm90-moe.md" > /tmp/tune-moe.log 2>&1
    echo "rc=$?"; grep "^\[moe\|^wrote\|rror" /tmp/tune-moe.log | cut -c1-400
    bench_topk
  } 2>&1 | tee "$R/log-lock8.txt"
elif [[ $part == final ]]; then
  {
    stamp "demo"
    demo_flash 200 demo-flash
  } 2>&1 | tee "$R/log-final8.txt"
fi
if [[ $part == sweep ]]; then
  {
    stamp "launch settings of the MXFP4 expert kernels: triton_kernels at T = 16 and 64, Marlin at T = 1 and 8"
    timeout 200 python3 bench/sweep_moe_launch.py --impl oai --json "$R/sweep-oai-moe.json" > /tmp/sweep.log 2>&1
    echo "rc=$?"; grep -v Warning /tmp/sweep.log | cut -c1-300 | tail -30
    timeout 200 python3 bench/sweep_moe_launch.py --impl marlin --json "$R/sweep-marlin-moe.json" > /tmp/sweep-m.log 2>&1
    echo "rc=$?"; grep -v Warning /tmp/sweep-m.log | cut -c1-300 | tail -45
  } 2>&1 | tee "$R/log-sweep8.txt"
fi
if [[ $part == combo ]]; then
  {
    stamp "the sampled top-k's filter pass: pipelined chunks, warps (bench/tune_triton.py --ops topk)"
    timeout 240 python3 bench/tune_triton.py --json "$R/tune-triton-topk.json" --ops topk > /tmp/tune-topk.log 2>&1
    echo "rc=$?"; topk_rows "$R/tune-triton-topk.json"
    stamp "host cost, with the two lookups alone"
    timeout 150 $D bench attention --quick --json "$R/bench-attention-host.json" > /tmp/host.log 2>&1
    echo "rc=$?"
    python3 - "$R/bench-attention-host.json" <<'PY'
import json, sys
for r in json.load(open(sys.argv[1]))["attention"]:
    if r.get("host_us"):
        print(r["config"], {k: round(v, 1) for k, v in r["host_us"].items()}, r.get("same_output_as_direct"))
PY
    stamp "demo (the harness keeps its fp32 weights in fp32)"
    demo_flash 200 demo-flash
  } 2>&1 | tee "$R/log-combo8.txt"
fi
if [[ $part == marlin ]]; then
  {
    stamp "Marlin launch settings for the MXFP4 experts at T = 1 and 8"
    timeout 200 python3 bench/sweep_moe_launch.py --impl marlin --json "$R/sweep-marlin-moe.json" > /tmp/sweep-m.log 2>&1
    echo "rc=$?"; grep -v Warning /tmp/sweep-m.log | cut -c1-300 | tail -45
    stamp "conformance: indexer_topk (the sampled top-k's many-row filter)"
    timeout 200 $D conformance --ops indexer_topk --quiet --json "$R/conformance-topk.json" > /tmp/conf-topk.log 2>&1
    echo "rc=$?"; tail -4 /tmp/conf-topk.log | cut -c1-300
    bench_topk
  } 2>&1 | tee "$R/log-marlin8.txt"
fi
if [[ $part == mhc ]]; then
  {
    stamp "mHC: comb as 16 scalars or one [4, 4] tile (bench/sweep_mhc_apply.py)"
    timeout 300 python3 bench/sweep_mhc_apply.py --json "$R/sweep-mhc-apply.json" > /tmp/sweep-mhc.log 2>&1
    echo "rc=$?"; grep -v Warning /tmp/sweep-mhc.log | cut -c1-900 | tail -12
  } 2>&1 | tee "$R/log-mhc8.txt"
fi
if [[ $part == final2 ]]; then
  {
    stamp "conformance: the mHC ops (comb as one [4, 4] tile)"
    timeout 200 $D conformance --ops mhc_pre,mhc_post,mhc_post_pre,mhc_head --quiet \
      --json "$R/conformance-mhc.json" > /tmp/conf-mhc.log 2>&1
    echo "rc=$?"; tail -4 /tmp/conf-mhc.log | cut -c1-300
    demo_eager_and_compiled
  } 2>&1 | tee "$R/log-final8b.txt"
fi
if [[ $part == compiled ]]; then
  {
    stamp "demo, the decode step compiled (inductor), after the custom ops' outputs took their fakes' layout"
    demo_flash 400 demo-flash-compiled --compile
  } 2>&1 | tee "$R/log-compiled8.txt"
fi
if [[ $part == indexer ]]; then
  {
    stamp "indexer logits: the bound op against DeepGEMM called directly, with its schedule once or per call"
    timeout 200 $D bench indexer --quick --json "$R/bench-indexer.json" > /tmp/bench-idx.log 2>&1
    echo "rc=$?"; grep -v Warning /tmp/bench-idx.log | tail -8 | cut -c1-600
  } 2>&1 | tee "$R/log-indexer8.txt"
fi
if [[ $part == fused ]]; then
  {
    stamp "the sampled top-k with sampling fused into the filter (bench/tune_triton.py --ops topk)"
    timeout 200 python3 bench/tune_triton.py --json "$R/tune-triton-topk-fused.json" --ops topk > /tmp/tune-topk.log 2>&1
    echo "rc=$?"; topk_rows "$R/tune-triton-topk-fused.json"
  } 2>&1 | tee "$R/log-fused8.txt"
fi
