#!/usr/bin/env bash
# The H200 plan of the sixteenth session (2026-12-01): results straight into the call's output folder ($R=$OUT); at
# most 8 files come back from a call, so logs stay in /tmp and their tails go to the part's log.
# The pdl part ran on commit a0766a2 (bench/ab_pdl.py and the kernels' PDL wiring were taken out after it).
#   R=$OUT bash bench/run_h200_session17.sh pdl    # programmatic dependent launch for the mHC and fused-MoE Triton
#                                                  # kernels: their GPU tests under DSV4HAL_PDL=2, the A/B of modes
#                                                  # 0/1/2 in turns (bench/ab_pdl.py), the host cost of a bound call
#                                                  # (dsv4hal bench attention --quick), the yardstick demo under
#                                                  # DSV4HAL_PDL=0 and 2
set -uo pipefail
part=${1:?pdl, host, final, prof, verify, conform_moe or conform_rest}
source bench/h200_env.sh
if [[ $part == pdl ]]; then
  { stamp "GPU tests of mHC and the fused MoE's decode under DSV4HAL_PDL=2"
    DSV4HAL_PDL=2 gpu_tests 150 pdl2 tests/test_triton_mhc.py tests/test_triton_mx_decode.py tests/test_triton_moe.py \
      -k "mhc or one_token or fused_cast or paired or decode"
    grep -E "^E  " /tmp/pytest-pdl2.log | head -8 | cut -c1-600
    stamp "A/B: PDL modes 0, 1, 2 in turns"
    timeout 240 python3 bench/ab_pdl.py --tokens 1,8,64 --json "$R/ab-pdl.json" > /tmp/ab-pdl.log 2>&1
    echo "rc=$?"; grep -v Warn /tmp/ab-pdl.log | tail -24 | cut -c1-400
    stamp "host cost: dsv4hal bench attention --quick"
    timeout 200 $D bench attention --quick --json "$R/bench-attention-host.json" > /tmp/bench-att.log 2>&1
    echo "rc=$?"; grep -v Warn /tmp/bench-att.log | tail -6 | cut -c1-300
    stamp "demo, DSV4HAL_PDL=0"; DSV4HAL_PDL=0 demo_flash 120 demo-flash-pdl0
    stamp "demo, DSV4HAL_PDL=2"; DSV4HAL_PDL=2 demo_flash 120 demo-flash-pdl2
  } 2>&1 | tee "$R/log-pdl17.txt"
fi
if [[ $part == host ]]; then  # the host cost of a bound call, this tree and 9857019's memo and cache files
                              # (.kernels/ab/host9857019) in turns, twice
  { for round in 1 2; do
      stamp "host cost, this tree (round $round)"
      timeout 200 $D bench attention --quick --json "$R/bench-attention-host-r$round.json" > /tmp/bench-att.log 2>&1
      echo "rc=$?"
      stamp "host cost, 9857019's package (round $round)"
      cp -r dsv4hal /tmp/dsv4hal-this  # (an editable install: swap in 9857019's memo and cache files, then back)
      cp .kernels/ab/host9857019/memo.py dsv4hal/ops/memo.py
      cp .kernels/ab/host9857019/{v4_cache,indexer_cache}.py dsv4hal/formats/
      timeout 200 $D bench attention --quick --json "$R/bench-attention-host-9857019-r$round.json" \
        > /tmp/bench-att-old.log 2>&1
      echo "rc=$?"; grep -v Warn /tmp/bench-att-old.log | tail -2 | cut -c1-300
      rm -rf dsv4hal && mv /tmp/dsv4hal-this dsv4hal
    done
    stamp "host cost, part by part (bench/host_parts.py)"
    timeout 120 python3 bench/host_parts.py --json "$R/host-parts.json"
    echo "rc=$?"
  } 2>&1 | tee "$R/log-host17.txt"
fi
if [[ $part == final ]]; then  # the memo of moe_experts' prepared weights: GPU tests, the host cost part by part and
                               # beside the direct FlashMLA call, moe_experts' conformance (eager and graph, the
                               # fused MoE forced), the yardstick demo
  { stamp "GPU tests: prepared weights, host cost, custom ops, the fused MoE's decode"
    gpu_tests 150 final tests/test_prepared_weights.py tests/test_host_cost.py tests/test_custom_ops.py
    grep -E "^E  " /tmp/pytest-final.log | head -8 | cut -c1-600
    decode_tests 150 final-moe "decode or swapped or shapes_off or above_128 or paired or one_token or fused_cast or down"
    stamp "host cost, part by part (bench/host_parts.py)"
    timeout 150 python3 bench/host_parts.py --json "$R/host-parts.json" > /tmp/host-parts.log 2>&1
    echo "rc=$?"; grep -v Warn /tmp/host-parts.log | tail -13
    stamp "host cost: dsv4hal bench attention --quick"
    timeout 150 $D bench attention --quick --json "$R/bench-attention-host.json" > /tmp/bench-att.log 2>&1
    echo "rc=$?"
    conform_fused_moe 150 conformance-cuda_sm90-moe-triton-memo
    stamp "demo (as selected)"; demo_flash 120 demo-flash
  } 2>&1 | tee "$R/log-final17.txt"
fi
if [[ $part == prof ]]; then  # where an eager call's host time goes (cProfile): moe_experts at one token through the
                              # fused MoE, sparse_attention_decode through the Triton kernel
  { stamp "host time by function (bench/profile_host.py)"
    timeout 200 python3 bench/profile_host.py --json "$R/profile-host.json" > /tmp/prof-host.log 2>&1
    echo "rc=$?"; grep -v Warn /tmp/prof-host.log | tail -32 | cut -c1-200
  } 2>&1 | tee "$R/log-prof17.txt"
fi
if [[ $part == verify ]]; then  # the code of this session on every op: the whole conformance catalog (auto
                                # selection, eager and graph; it did not finish in 420 s: split it by --ops over
                                # calls), then a short soak (new shapes, captures, replays)
  { stamp "conformance: the whole catalog (auto selection)"
    timeout 420 $D conformance --platform cuda_sm90 --json "$R/conformance-cuda_sm90.json" \
      --markdown "$R/conformance-cuda_sm90.md" --quiet > /tmp/conf-all.log 2>&1
    echo "rc=$?"; tail -3 /tmp/conf-all.log | cut -c1-300
    stamp "soak, 2 minutes"
    timeout 200 $D soak --minutes 2 --json "$R/soak-2min.json" > /tmp/soak.log 2>&1
    echo "rc=$?"; grep -v Warn /tmp/soak.log | tail -6 | cut -c1-300
  } 2>&1 | tee "$R/log-verify17.txt"
fi
if [[ $part == conform_moe || $part == conform_rest ]]; then  # (not run this session) the whole catalog in two calls:
  # moe_experts alone (141 s of cells in the fourth session, plus the fused MoE's compiles), then every other op
  # (~200 s then); each writes its own report
  if [[ $part == conform_moe ]]; then ops=moe_experts; else
    ops=$(python3 -c "from dsv4hal.conformance.runner import load_catalog as c
print(','.join(sorted({s.op for s, _ in c()} - {'moe_experts'})))"); fi
  { stamp "conformance: $ops (auto selection, eager and graph)"
    timeout 560 $D conformance --platform cuda_sm90 --ops "$ops" --json "$R/conformance-cuda_sm90-$part.json" \
      --markdown "$R/conformance-cuda_sm90-$part.md" --quiet > /tmp/conf.log 2>&1
    echo "rc=$?"; tail -3 /tmp/conf.log | cut -c1-300
  } 2>&1 | tee "$R/log-$part.txt"
fi
