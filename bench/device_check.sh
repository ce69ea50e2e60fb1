#!/usr/bin/env bash
# One GPU-machine call: the GPU suite (default heuristics), then the peer kit. Logs to $OUT.
#   bash bench/device_check.sh [suite|kit|both] [extra kit args...]
# Env: SUITE_ARGS (pytest args), SUITE_FAMILY (MOEPLUG_GPU_FAMILY for a second suite pass),
# SUITE_JOBS (pytest processes at once, default 1), SUITE_TIMEOUT / KIT_TIMEOUT (s),
# MOEPLUG_LIBRARY (the library under test, default target/release/libmoeplug.so).
set -uo pipefail
what=${1:-both}; shift || true
export MOEPLUG_LIBRARY=${MOEPLUG_LIBRARY:-$PWD/target/release/libmoeplug.so} PYTHONUNBUFFERED=1
export MOEPLUG_CACHE_DIR=/tmp/moeplug-cache
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
# tests/gpu/test_selftest.py runs the `moeplug` CLI next to the library: carry both.
if [ "$what" != kit ] && [ ! -x "$(dirname "$MOEPLUG_LIBRARY")/moeplug" ]; then
  echo "warning: no moeplug CLI next to $MOEPLUG_LIBRARY: the self-test tests that run it will fail (carry target/release/moeplug)"
fi
if [ "$what" != kit ] && [ "${SUITE_JOBS:-1}" -gt 1 ]; then
  # SUITE_JOBS pytest processes at once on the one GPU, each a contiguous run of the suite's
  # test ids (neighbouring tests share kernel configurations: each is compiled by one process,
  # and the disk cache serves the others); a cold suite is mostly NVRTC, which has the cores.
  # test_fused_combine's 12 tests (each two child processes that compile their own kernels,
  # ~20-60 s apiece) go round-robin: contiguous, they held process 0 past its limit
  # (session 14).
  python3 -m pytest --collect-only -q -p no:cacheprovider tests/gpu ${SUITE_ARGS:-} 2>/dev/null \
    | grep "::" >$OUT/suite_ids.txt
  total=$(wc -l <$OUT/suite_ids.txt)
  for g in $(seq 0 $((SUITE_JOBS - 1))); do
    mapfile -t ids < <(awk -v g=$g -v n=$SUITE_JOBS '
      /test_fused_combine/ { if (c++ % n == g) print; next }
      { rest[r++] = $0 }
      END { for (i = 0; i < r; i++) if (i >= int(g * r / n) && i < int((g + 1) * r / n)) print rest[i] }
      ' $OUT/suite_ids.txt)
    (timeout ${SUITE_TIMEOUT:-300} python3 -m pytest -q -p no:cacheprovider -rf "${ids[@]}" \
      >$OUT/suite_$g.log 2>&1; echo "exit status $?" >>$OUT/suite_$g.log) &
  done
  wait
  echo "suite: $total tests in $SUITE_JOBS processes"
  for g in $(seq 0 $((SUITE_JOBS - 1))); do
    grep -E "^(FAILED|ERROR) " $OUT/suite_$g.log | head -10
    result=$(grep -E "[0-9]+ (passed|failed|skipped|errors?)\b.* in [0-9.]+s" $OUT/suite_$g.log | tail -1)
    if [ -z "$result" ]; then  # killed (124: past SUITE_TIMEOUT) or crashed: say so, and how far
      result="NO RESULT, $(tail -1 $OUT/suite_$g.log); progress: $(grep -E '^[.sFEx]+' $OUT/suite_$g.log | tr -d ' \n[]%0-9' | wc -c) tests run"
    fi
    echo "  process $g: $result"
  done
elif [ "$what" != kit ]; then
  timeout ${SUITE_TIMEOUT:-300} python3 -m pytest -q -p no:cacheprovider tests/gpu ${SUITE_ARGS:-} 2>&1 \
    | tee $OUT/suite.log | grep -v "^\.*$" | tail -25
  if [ -n "${SUITE_FAMILY:-}" ]; then
    MOEPLUG_GPU_FAMILY=$SUITE_FAMILY timeout ${SUITE_TIMEOUT:-300} python3 -m pytest -q -p no:cacheprovider \
      tests/gpu/test_fused_moe.py ${SUITE_ARGS:-} 2>&1 | tee $OUT/suite_$SUITE_FAMILY.log | tail -6
  fi
fi
if [ "$what" != suite ]; then
  timeout ${KIT_TIMEOUT:-400} python3 .peers/bench_peer.py --moeplug-lib "$MOEPLUG_LIBRARY" \
    --moeplug-python python --budget-s $(( ${KIT_TIMEOUT:-400} - 40 )) --json-out $OUT/peerbench.json "$@" \
    2>&1 | tee $OUT/peerbench.log | sed -n '/^summary/,$p'
fi
