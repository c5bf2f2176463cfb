# Sourced by the bench/run_h200_*.sh scripts on the device machine: the vendor bundle, this tree installed,
# $OUT (what comes back) and $R (results collected there), `stamp` for the log, $D (the CLI) and the helpers the
# session scripts share.
export PYTHONUNBUFFERED=1
OUT=${OUT:-out/h200}
R=${R:-/tmp/h200-results}
mkdir -p "$OUT" "$R"
source .kernels/install-kernels.sh .kernels/bundle /tmp/dsv4hal-site >/dev/null || echo "vendor bundle did not install"
python3 -m pip install -q --no-deps --no-build-isolation --no-index -e . >/dev/null 2>&1 || echo "pip install -e . failed"
T0=$(date +%s)
stamp() { echo "--- $(( $(date +%s) - T0 ))s: $*"; }
D="python3 -m dsv4hal"
demo_flash() {  # TIMEOUT NAME [ARGS...]: the yardstick demo, results as $R/NAME.json/png, the log's tail
  local limit=$1 name=$2
  shift 2
  timeout "$limit" $D demo --size flash --batch 64 --context 32768 --steps 8 --fill random "$@" \
    --json "$R/$name.json" --plot "$R/$name.png" > "/tmp/$name.log" 2>&1
  echo "rc=$?"; grep -v Warn "/tmp/$name.log" | tail -32
}
demo_eager_and_compiled() {  # the yardstick demo as written ($R/demo-flash.*), then with its step compiled
  stamp "demo"
  demo_flash 150 demo-flash
  stamp "demo, the decode step compiled (inductor)"
  demo_flash 300 demo-flash-compiled --compile
}
topk_rows() {  # one line a shape of a bench/tune_triton.py --ops topk result: times, per-pass times, failures
  python3 - "$1" <<'PY'
import json, sys
for r in json.load(open(sys.argv[1]))["topk"]:
    print(r.get("kernel", "sampled"), r["B"], r["N"], r["k"], {k: round(v, 1) for k, v in r["us"].items()},
          "passes", {k: [round(x, 1) for x in v] for k, v in r.get("us_passes", {}).items()},
          "not ok", [k for k, v in r["ok"].items() if v is not True])
PY
}
tune_topk() {  # TIMEOUT NAME: bench/tune_triton.py --ops topk into $R/NAME.json, a line a shape, its errors
  local limit=$1 name=$2
  timeout "$limit" python3 bench/tune_triton.py --json "$R/$name.json" --ops topk > "/tmp/$name.log" 2>&1
  echo "rc=$?"; topk_rows "$R/$name.json"; grep -E "Error|error" "/tmp/$name.log" | tail -5
}
bench_op() {  # TIMEOUT NAME: dsv4hal bench NAME into $R/bench-NAME.json/png, the log's tail
  local limit=$1 name=$2
  timeout "$limit" $D bench "$name" --json "$R/bench-$name.json" --plot "$R/bench-$name.png" \
    > "/tmp/bench-$name.log" 2>&1
  echo "rc=$?"; grep -v Warning "/tmp/bench-$name.log" | tail -16 | cut -c1-300
}
conform() {  # TIMEOUT NAME OPS [ARGS...]: dsv4hal conformance --ops OPS into $R/NAME.json (eager and graph), its tail
  local limit=$1 name=$2 ops=$3
  shift 3
  timeout "$limit" $D conformance --ops "$ops" --quiet --json "$R/$name.json" "$@" > "/tmp/$name.log" 2>&1
  echo "rc=$?"; tail -3 "/tmp/$name.log" | cut -c1-300
}
gpu_tests() {  # TIMEOUT NAME FILES...: pytest on the GPU, the log in /tmp/pytest-NAME.log, its summary here
  local limit=$1 name=$2
  shift 2
  timeout "$limit" python3 -m pytest -p no:cacheprovider -p no:warnings -rfE "$@" > "/tmp/pytest-$name.log" 2>&1
  echo "rc=$?"; grep -E "^FAILED|^ERROR|passed|failed" "/tmp/pytest-$name.log" | tail -12 | cut -c1-400
}
gpu_tests_errors() {  # TIMEOUT NAME FILES...: gpu_tests, then the first assertion messages of its log
  gpu_tests "$@"
  grep -E "^E  " "/tmp/pytest-$2.log" | head -8 | cut -c1-600
}
bench_moe_again() {  # TIMEOUT PREFIX: rounds 2 and 3 of dsv4hal bench moe --quick into PREFIX-rI.json, the FP8 line
  local i
  for i in 2 3; do
    stamp "MoE: dsv4hal bench moe --quick (again, $i)"
    timeout "$1" $D bench moe --quick --json "$2-r$i.json" > "/tmp/bench-moe-r$i.log" 2>&1
    echo "rc=$?"; grep -E "ceilings|fp8_block T=4096 \(" "/tmp/bench-moe-r$i.log" | cut -c1-300
  done
}
decode_tests() {  # TIMEOUT NAME KEXPR: the MXFP4 decode and fused-MoE GPU tests, their assertion messages
  stamp "GPU tests: the PTX and plain decode, the fused MoE kernels ($3)"
  gpu_tests "$1" "$2" tests/test_triton_mx_decode.py tests/test_triton_moe.py -k "$3"
  grep -E "^E  " "/tmp/pytest-$2.log" | head -12 | cut -c1-600
}
mx_sweep() {  # TIMEOUT NAME TAIL ARGS...: bench/sweep_mx_moe_decode.py into $R/NAME.json, the log's last TAIL lines
  local limit=$1 name=$2 lines=$3
  shift 3
  stamp "MXFP4 decode MoE ($*) beside Marlin and triton_kernels"
  timeout "$limit" python3 bench/sweep_mx_moe_decode.py "$@" --json "$R/$name.json" > "/tmp/$name.log" 2>&1
  echo "rc=$?"; grep -v Warn "/tmp/$name.log" | tail -"$lines" | cut -c1-1200
}
conform_fused_moe() {  # TIMEOUT NAME: moe_experts conformance with triton_fused_moe forced into $R/NAME.json
  stamp "conformance: moe_experts with triton_fused_moe forced (no full-size V4-Pro), eager and graph"
  DSV4HAL_KERNELS=moe_experts=triton_fused_moe timeout "$1" $D conformance --platform cuda_sm90 --ops moe_experts \
    --cases '^(?!pro-(mxfp4|fp8_block)-)' --json "$R/$2.json" --quiet > /tmp/conf-moe.log 2>&1
  echo "rc=$?"; tail -3 /tmp/conf-moe.log | cut -c1-300
}
bench_moe_quick() {  # TIMEOUT: dsv4hal bench moe --quick into $R/bench-moe-quick.json/png
  stamp "MoE: dsv4hal bench moe --quick"
  timeout "$1" $D bench moe --quick --json "$R/bench-moe-quick.json" --plot "$R/bench-moe-quick.png" \
    > /tmp/bench-moe.log 2>&1
  echo "rc=$?"; grep -v Warn /tmp/bench-moe.log | tail -12 | cut -c1-400
}
ab_decode() {  # TIMEOUT NAME ARGS...: bench/ab_mx_moe_decode.py (--old NAME=PATH ...) into $R/NAME.json, its rows
  local limit=$1 name=$2
  shift 2
  stamp "A/B: this tree against earlier module files and Marlin, in turns ($*)"
  timeout "$limit" python3 bench/ab_mx_moe_decode.py "$@" --json "$R/$name.json" > "/tmp/$name.log" 2>&1
  echo "rc=$?"; grep -v Warn "/tmp/$name.log" | tail -8 | cut -c1-1500
}
profile_decode() {  # TIMEOUT: the MXFP4 decode call kernel by kernel into $R/profile-mx-moe-decode.json
  stamp "the MXFP4 decode call kernel by kernel"
  timeout "$1" python3 bench/profile_mx_moe_decode.py --tokens 1,8,64 --json "$R/profile-mx-moe-decode.json" \
    > /tmp/prof.log 2>&1
  echo "rc=$?"; grep -v Warn /tmp/prof.log | tail -4 | cut -c1-1500
}
soak_1min() {  # TIMEOUT: dsv4hal soak --minutes 1 into $R/soak-1min.json, its last lines
  stamp "soak, 1 minute"
  timeout "$1" $D soak --minutes 1 --json "$R/soak-1min.json" > /tmp/soak.log 2>&1
  echo "rc=$?"; grep -v Warn /tmp/soak.log | tail -4 | cut -c1-300
}
conform_all() {  # TIMEOUT PREFIX: the whole conformance catalog (auto selection, eager and graph) as three reports
                 # run side by side ($R/PREFIX-moe, -attention, -rest .json; the markdown in $R/PREFIX.md), their tails
  local limit=$1 prefix=$2
  local groups=(moe_experts
                sparse_attention_decode,indexer_logits,mhc_post_pre,compress,compress_decode,sparse_attention_prefill
                mhc_pre,mhc_post,mhc_head,indexer_topk,dequant_gather,pack_store,indexer_store,indexer_q_prep,moe_route,build_attention_metadata,decode_step)
  local names=(moe attention rest) all listed i
  all=$(python3 -c "from dsv4hal.conformance.runner import load_catalog as c
print(' '.join(sorted({s.op for s, _ in c()} | {'decode_step'})))")
  listed=$(echo "${groups[*]}" | tr ', ' '\n\n' | sort | xargs)
  stamp "conformance: the whole catalog in three reports side by side"
  [[ "$listed" == "$all" ]] || echo "the groups miss ops: catalog [$all] groups [$listed]"
  for i in 0 1 2; do
    OMP_NUM_THREADS=5 timeout "$limit" $D conformance --platform cuda_sm90 --ops "${groups[$i]}" \
      --json "$R/$prefix-${names[$i]}.json" --markdown "/tmp/conformance-g$i.md" --quiet > "/tmp/conf-g$i.log" 2>&1 &
  done
  for i in 0 1 2; do wait -n; echo "a group ended: rc=$? at $(( $(date +%s) - T0 ))s"; done
  for i in 0 1 2; do echo "group ${names[$i]}:"; tail -2 "/tmp/conf-g$i.log" | cut -c1-300; done
  cat /tmp/conformance-g{0,1,2}.md > "$R/$prefix.md"
}
