#!/usr/bin/env bash
# GPU calls of session 12, one per argument:
#   initcheck: compute-sanitizer initcheck over the whole GPU suite, every kernel instrumented
#              (issue 14), 8 shards at once
#   racecheck: racecheck over the whole GPU suite (kernel filter on), 8 shards at once
#   rerun7:    initcheck of call 1's shard 7 as 4 smaller shards, then racecheck
#   initcheck15: the 20 tests of initcheck shard 15/32 not yet finished, its 2 slowest alone
#   rs:        MXFP4 weights as wgmma's register operand: tests, A/B, peer, racecheck
#   blocks2:   MXFP4's weight tile with two blocks per SM against one
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
initcheck15)
  # The 20 tests of initcheck shard 15/32 that have not finished (calls 1-2): its two slowest
  # each alone, the other 18 as one shard, at once (separate OUT folders).
  slow='test_many_tokens|test_real_shapes\[gpt-oss-120b-1024\]'
  (OUT=$OUT/many SAN_SELECT='test_many_tokens' SAN_TIMEOUT=520 bash bench/sanitize.sh initcheck \
    2>&1 | grep -v "^===" >"$OUT/many.txt") &
  (OUT=$OUT/gptoss SAN_SELECT='test_real_shapes\[gpt-oss-120b-1024\]' SAN_TIMEOUT=520 \
    bash bench/sanitize.sh initcheck 2>&1 | grep -v "^===" >"$OUT/gptoss.txt") &
  (OUT=$OUT/rest SAN_SELECT=. SAN_EXCLUDE="$slow" SHARD=15/32 SAN_TIMEOUT=520 \
    bash bench/sanitize.sh initcheck 2>&1 | grep -v "^===" >"$OUT/rest.txt") &
  wait
  cat "$OUT/many.txt" "$OUT/gptoss.txt" "$OUT/rest.txt" | tee -a "$sum"
  stamp initcheck15 | tee -a "$sum"
  ;;
rs)
  # MXFP4 weights as wgmma's register operand (WG_RS): the wgmma tests of every MXFP4 shape
  # with it; the A/B against the shared-memory weight tile, 64-row tiles and the stream
  # family; the peer alone in the same call; then, as time allows, the 64-row tiles' tests,
  # the cp.async kernel's tests (its activation copies are shared now) and racecheck.
  deadline=${DEADLINE:-375}
  fits() { [ $(($(date +%s) - t0 + $1)) -le "$deadline" ]; }
  run_tests() {  # seconds, label, env, pytest args
    local secs=$1 label=$2 envs=$3
    shift 3
    fits "$secs" || { echo "tests $label: skipped (time)" | tee -a "$sum"; return; }
    env $envs MOEPLUG_LIBRARY=$PWD/target/release/libmoeplug.so timeout "$secs" python3 -m pytest -q \
      -p no:cacheprovider -x "$@" >"$OUT/tests_$label.log" 2>&1
    echo "tests $label [$envs]: rc=$? $(tail -1 "$OUT/tests_$label.log")" | tee -a "$sum"
    grep -E "^(FAILED|ERROR)" "$OUT/tests_$label.log" | head -3 | tee -a "$sum"
  }
  run_tests 90 rs "MOEPLUG_GPU_FAMILY=wgmma" tests/gpu/test_fused_moe.py \
    tests/gpu/test_launch_fields.py -k "mxfp4 or gpt-oss"
  stamp tests | tee -a "$sum"
  ROUNDS=2 AB_TIMEOUT=50 bash bench/ab.sh "MOEPLUG_GPU_FAMILY=wgmma MOEPLUG_WGMMA_RS=0" \
    "MOEPLUG_GPU_FAMILY=wgmma" "MOEPLUG_GPU_FAMILY=wgmma MOEPLUG_WGMMA_BM=64" \
    "MOEPLUG_GPU_FAMILY=stream" -- --cases gptoss_mxfp4 --ms 256,512,1024,4096 2>&1 |
    tail -12 | tee -a "$sum"
  stamp ab | tee -a "$sum"
  MOEPLUG_LIBRARY=$PWD/target/release/libmoeplug.so timeout 60 python3 .peers/bench_peer.py \
    --peers triton_kernels --cases gptoss_mxfp4 --ms 256,512,1024,4096 --budget-s 45 \
    --json-out "$OUT/peer_mxfp4.json" 2>&1 | tail -9 | tee -a "$sum"
  stamp peer | tee -a "$sum"
  run_tests 50 rs64 "MOEPLUG_GPU_FAMILY=wgmma MOEPLUG_WGMMA_BM=64" tests/gpu/test_fused_moe.py \
    -k "mxfp4 and (deterministic or large_m or real_shapes or formats_x)"
  run_tests 50 ss "MOEPLUG_GPU_FAMILY=wgmma MOEPLUG_WGMMA_TMA=0 MOEPLUG_WGMMA_RS=0" \
    tests/gpu/test_fused_moe.py -k "deterministic or large_m"
  stamp more-tests | tee -a "$sum"
  if fits 70; then
    MOEPLUG_GPU_FAMILY=wgmma SAN_SELECT='test_fused_moe\.py::test_(deterministic|large_m).*mxfp4' \
      SAN_JOBS=2 SAN_TIMEOUT=$((deadline - $(date +%s) + t0 - 20)) SHARD=1,2/2 \
      bash bench/sanitize.sh racecheck 2>&1 | grep -v "^===" | tee -a "$sum"
  fi
  stamp racecheck | tee -a "$sum"
  ;;
blocks2)
  # MXFP4's shared-memory weight tile with two blocks per SM (16 warps to issue the decode)
  # against one, one round each (the device budget's last minute).
  for v in "" "MOEPLUG_WGMMA_BLOCKS=2"; do
    env MOEPLUG_GPU_FAMILY=wgmma MOEPLUG_WGMMA_RS=0 $v MOEPLUG_LIBRARY=$PWD/target/release/libmoeplug.so \
      timeout 50 python3 .peers/bench_peer.py --peers moeplug --cases gptoss_mxfp4 --ms 1024,4096 \
      --budget-s 38 --json-out "$OUT/blocks_${#v}.json" 2>&1 | grep -E "^gptoss" | tee -a "$sum"
    stamp "blocks [$v]" | tee -a "$sum"
  done
  ;;
suite)
  suite_and_kit
  ;;
esac
