#!/usr/bin/env bash
# The trust checks on a CUDA machine, results in bench/results/<card>/ (card: h100 or h200, from the GPU's name), one
# file a suite, overwritten on each run, each with its command and environment:
#   memory-safety.json     the guard-memory tests (tests/core/test_unchecked_bounds*.py) and the FlashMLA glue tests on
#                          the GPU
#   shape-sequence.json    python3 -m dsv4hal.conformance.sequence: every vendor-bound op's conformance cases in shuffled
#                          shapes, eager and graph-captured, then garbage inputs (an unsynchronised do_bench_cudagraph,
#                          lengths outside the index rows) with a valid call checked after each
#   memcheck.json          compute-sanitizer --tool memcheck over the guard tests and the index-taking ops' conformance
#                          cases (the CPU-sized ones, eager), where the CUDA toolkit has the sanitizer
#   gpu-tests.json         the whole test suite on the GPU
#   bench-attention.json   dsv4hal bench attention --quick: the bound calls' GPU and host time against the direct call
# Needs the vendor libraries importable (README: "Installing for a GPU"); run from the repository root:
#   bash bench/gpu_checks.sh [safety] [sequence] [memcheck] [tests] [host]     (none: all of them)
# R=DIR puts the files there instead.
set -uo pipefail
parts=" ${*:-all} "
want() { [[ $parts == *" $1 "* || $parts == *" all "* ]]; }
export PYTHONUNBUFFERED=1
card=$(python3 -c "import torch; n = torch.cuda.get_device_name().upper(); print('h200' if 'H200' in n else 'h100' if 'H100' in n else n.split()[-1].lower())")
R=${R:-bench/results/$card}
mkdir -p "$R"
T0=$(date +%s)
stamp() { echo "--- $(( $(date +%s) - T0 ))s: $*"; }

# pytest's JUnit XML as one JSON result with the command and the environment
junit_json() {  # XML JSON COMMAND
  python3 - "$@" <<'PY'
import json, platform, sys, xml.etree.ElementTree as ET
import torch
from dsv4hal.hardware import detect
xml, out, command = sys.argv[1:4]
root = ET.parse(xml).getroot()
cases = []
for tc in root.iter("testcase"):
    status = "passed"
    for tag in ("failure", "error", "skipped"):
        el = tc.find(tag)
        if el is not None:
            status = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
            detail = (el.get("message") or "")[:300]
            break
    cases.append({"test": f"{tc.get('classname')}::{tc.get('name')}", "status": status,
                  **({"detail": detail} if status != "passed" else {})})
counts = {s: sum(c["status"] == s for c in cases) for s in ("passed", "failed", "error", "skipped")}
info = detect().to_json()
json.dump({"command": command, "device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "python": platform.python_version(), "libraries": info.get("libraries"), "summary": counts,
           "cases": cases}, open(out, "w"), indent=1)
print(counts)
PY
}

run_pytest() {  # NAME TIMEOUT FILES...: pytest on the GPU into $R/NAME.json
  local name=$1 limit=$2
  shift 2
  local cmd="python3 -m pytest -p no:cacheprovider -q $*"
  timeout "$limit" $cmd --junitxml "/tmp/$name.xml" > "/tmp/$name.log" 2>&1
  echo "rc=$?"; tail -3 "/tmp/$name.log" | cut -c1-300
  junit_json "/tmp/$name.xml" "$R/$name.json" "$cmd"
}

if want safety; then
  stamp "guard-memory tests and the FlashMLA glue on the GPU"
  run_pytest memory-safety 400 tests/core/test_unchecked_bounds.py tests/core/test_unchecked_bounds_kernels.py \
    tests/ops/attention/test_flashmla_decode_op.py tests/ops/attention/test_flashmla_sched.py \
    tests/ops/attention/test_flashmla_glue_ops.py tests/ops/indexer/test_indexer_q_prep.py \
    tests/ops/compress/test_triton_compress.py tests/ops/compress/test_compress_decode.py \
    tests/ops/indexer/test_indexer_logits_kernels.py tests/plugins/triton/test_triton_sm90_compile.py
fi
if want sequence; then
  stamp "randomized shape sequences through the vendor-bound ops, then garbage inputs"
  timeout 500 python3 -m dsv4hal.conformance.sequence --rounds 1 --json "$R/shape-sequence.json" \
    > /tmp/sequence.log 2>&1
  echo "rc=$?"; tail -3 /tmp/sequence.log | cut -c1-600
  python3 - "$R/shape-sequence.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print(r["summary"], r["seconds"], "s")
for c in r["cells"]:
    if c["status"] not in ("pass", "blocked") or "garbage" in c["case"] or "race" in c["case"] or "lengths" in c["case"]:
        print(c["status"], c["op"], c["implementation"], c["case"], c["mode"], str(c["detail"])[:200])
PY
fi
if want memcheck; then
  stamp "compute-sanitizer memcheck"
  san=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
  if [[ -z $san ]]; then
    python3 -c "import json, sys; json.dump({'command': 'compute-sanitizer --tool memcheck', 'available': False,
      'why': 'no compute-sanitizer in this CUDA toolkit (PATH, /usr/local/cuda*/bin)'}, open(sys.argv[1], 'w'))" \
      "$R/memcheck.json"
    echo "no compute-sanitizer here"
  else
    cat > /tmp/memcheck_conformance.py <<'PY'
# The conformance cases of every op that takes indices (the CPU-sized ones, eager), on the selected platform
import collections
import dsv4hal
from dsv4hal.conformance.runner import load_catalog, run_cell
ops = {"pack_store", "dequant_gather", "sparse_attention_decode", "sparse_attention_prefill", "indexer_topk",
       "indexer_store", "indexer_logits", "indexer_q_prep", "compress", "compress_decode", "moe_route", "moe_experts",
       "build_attention_metadata"}
p = dsv4hal.select_platform()
cells = [run_cell(p, s, b, "eager") for s, b in load_catalog(ops)
         if not s.gpu_only and "eager" in s.modes and "eager" not in s.unreachable]
print(dict(collections.Counter(c.status for c in cells)), "cells passed/failed:",
      sum(c.status == "pass" for c in cells), "passed", sum(c.status == "fail" for c in cells), "failed")
PY
    c1="$san --tool memcheck --error-exitcode 99 --print-limit 20 python3 -m pytest -p no:cacheprovider -q tests/core/test_unchecked_bounds.py tests/core/test_unchecked_bounds_kernels.py"
    c2="$san --tool memcheck --error-exitcode 99 --print-limit 20 python3 /tmp/memcheck_conformance.py"
    timeout 280 $c1 > /tmp/memcheck-guard.log 2>&1; rc1=$?
    echo "guard tests under memcheck: rc=$rc1"; tail -2 /tmp/memcheck-guard.log
    timeout 280 $c2 > /tmp/memcheck-conf.log 2>&1; rc2=$?
    echo "conformance under memcheck: rc=$rc2"; tail -2 /tmp/memcheck-conf.log
    python3 - "$R/memcheck.json" "$c1" "$rc1" "$c2" "$rc2" <<'PY'
import json, re, sys, torch
out, c1, rc1, c2, rc2 = sys.argv[1:]
def summary(path, command, rc):
    text = open(path, errors="replace").read()
    m = re.search(r"ERROR SUMMARY: (\d+) error", text)
    tail = [l for l in text.splitlines() if "passed" in l or "failed" in l or "ERROR SUMMARY" in l][-4:]
    return {"command": command, "exit_code": int(rc), "errors": int(m.group(1)) if m else None, "tail": tail,
            "first_errors": [l for l in text.splitlines() if l.startswith("=========") and "Invalid" in l][:10]}
res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "available": True,
       "runs": [summary("/tmp/memcheck-guard.log", c1, rc1), summary("/tmp/memcheck-conf.log", c2, rc2)]}
json.dump(res, open(out, "w"), indent=1)
print(json.dumps(res, indent=1)[:3000])
PY
  fi
fi
if want tests; then
  stamp "the whole test suite on the GPU"
  run_pytest gpu-tests 580 -x --maxfail 30 tests
fi
if want host; then
  stamp "host cost of the bound attention calls against the direct vendor call"
  timeout 200 python3 -m dsv4hal bench attention --quick --json "$R/bench-attention.json" > /tmp/bench-attention.log 2>&1
  echo "rc=$?"; grep -v Warn /tmp/bench-attention.log | tail -8 | cut -c1-300
fi
stamp done
