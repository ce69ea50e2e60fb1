#!/usr/bin/env bash
# GPU calls of session 12, one per argument:
#   initcheck: compute-sanitizer initcheck over the whole GPU suite, every kernel instrumented
#              (issue 14), 8 shards at once
#   racecheck: racecheck over the whole GPU suite (kernel filter on), 8 shards at once
#   rerun7:    initcheck of call 1's shard 7 as 4 smaller shards, then racecheck
#   rs:        MXFP4 weights as wgmma's register operand: tests, A/B, peer, racecheck
#   suite:     the whole GPU suite (8 processes) and the kit with peers on target/release
# Carry target/release/libmoeplug.so and target/release/moeplug (test_selftest.py runs the CLI).
source "$(dirname "$0")/dev_common.sh"
sum=$OUT/summary.txt
case ${1:-suite} in
initcheck | racecheck)
  SAN_JOBS=${SAN_JOBS:-8} SAN_TIMEOUT=${SAN_TIMEOUT:-540} SHARD=${SHARD:-1,2,3,4,5,6,7,8/8} \
    SAN_SELECT=. bash bench/sanitize.sh "$1" 2>&1 | grep -v "^===" | tee -a "$sum"
  stamp "$1" | tee -a "$sum"
  ;;
rerun7)
  # Call 1's initcheck shard 7 of 8 timed out at 525 s: the same tests as 4 shards of 32
  # (residues 6, 14, 22, 30), then racecheck over the whole suite.
  SAN_JOBS=4 SAN_TIMEOUT=230 SHARD=7,15,23,31/32 bash "$0" initcheck
  SAN_TIMEOUT=290 bash "$0" racecheck
  ;;
rs)
  # MXFP4 weights as wgmma's register operand (WG_RS): the wgmma tests of every MXFP4 shape
  # with it, the cp.async kernel's tests (the shared activation copies) with the old MXFP4
  # path, then the A/B against it and the stream family, the peer next to it, racecheck.
  run_tests() {  # label, env, pytest args
    local label=$1 envs=$2
    shift 2
    env $envs MOEPLUG_LIBRARY=$PWD/target/release/libmoeplug.so timeout "${TEST_TIMEOUT:-100}" python3 -m pytest -q \
      -p no:cacheprovider -x "$@" >"$OUT/tests_$label.log" 2>&1
    echo "tests $label [$envs]: rc=$? $(tail -1 "$OUT/tests_$label.log")" | tee -a "$sum"
    grep -E "^(FAILED|ERROR)" "$OUT/tests_$label.log" | head -3 | tee -a "$sum"
  }
  run_tests rs "MOEPLUG_GPU_FAMILY=wgmma" tests/gpu/test_fused_moe.py tests/gpu/test_launch_fields.py \
    -k "mxfp4 or gpt-oss"
  TEST_TIMEOUT=70 run_tests ss "MOEPLUG_GPU_FAMILY=wgmma MOEPLUG_WGMMA_TMA=0 MOEPLUG_WGMMA_RS=0" \
    tests/gpu/test_fused_moe.py -k "deterministic or large_m"
  stamp tests | tee -a "$sum"
  ROUNDS=2 AB_TIMEOUT=60 bash bench/ab.sh "MOEPLUG_GPU_FAMILY=wgmma MOEPLUG_WGMMA_RS=0" \
    "MOEPLUG_GPU_FAMILY=wgmma" "MOEPLUG_GPU_FAMILY=stream" -- --cases gptoss_mxfp4 \
    --ms 512,1024,4096 2>&1 | tail -8 | tee -a "$sum"
  stamp ab | tee -a "$sum"
  MOEPLUG_GPU_FAMILY=wgmma MOEPLUG_LIBRARY=$PWD/target/release/libmoeplug.so timeout 80 \
    python3 .peers/bench_peer.py --peers moeplug,triton_kernels --cases gptoss_mxfp4 \
    --ms 512,1024,4096 --budget-s 60 --json-out "$OUT/peer_rs.json" 2>&1 | tail -12 | tee -a "$sum"
  stamp peer | tee -a "$sum"
  left=$((375 - $(date +%s) + t0))
  if [ $left -gt 60 ]; then
    MOEPLUG_GPU_FAMILY=wgmma SAN_SELECT='test_fused_moe\.py::test_(deterministic|large_m).*mxfp4' \
      SAN_JOBS=2 SAN_TIMEOUT=$((left - 25)) SHARD=1,2/2 bash bench/sanitize.sh racecheck 2>&1 |
      grep -v "^===" | tee -a "$sum"
  fi
  stamp racecheck | tee -a "$sum"
  ;;
suite)
  suite_and_kit
  ;;
esac
