#!/usr/bin/env bash
# One GPU-machine call: the GPU suite (default heuristics), then the peer kit. Logs to $OUT.
#   bash bench/device_check.sh [suite|kit|both] [extra kit args...]
# Env: SUITE_ARGS (pytest args), SUITE_FAMILY (MOEPLUG_GPU_FAMILY for a second suite pass).
set -uo pipefail
what=${1:-both}; shift || true
export MOEPLUG_LIBRARY=$PWD/target/release/libmoeplug.so PYTHONUNBUFFERED=1
export MOEPLUG_CACHE_DIR=/tmp/moeplug-cache
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
if [ "$what" != kit ]; then
  timeout ${SUITE_TIMEOUT:-300} python3 -m pytest -q -p no:cacheprovider tests/gpu ${SUITE_ARGS:-} 2>&1 \
    | tee $OUT/suite.log | grep -v "^\.*$" | tail -25
  if [ -n "${SUITE_FAMILY:-}" ]; then
    MOEPLUG_GPU_FAMILY=$SUITE_FAMILY timeout ${SUITE_TIMEOUT:-300} python3 -m pytest -q -p no:cacheprovider \
      tests/gpu/test_fused_moe.py ${SUITE_ARGS:-} 2>&1 | tee $OUT/suite_$SUITE_FAMILY.log | tail -6
  fi
fi
if [ "$what" != suite ]; then
  timeout ${KIT_TIMEOUT:-400} python3 .peers/bench_peer.py --moeplug-lib target/release/libmoeplug.so \
    --moeplug-python python --budget-s $(( ${KIT_TIMEOUT:-400} - 40 )) --json-out $OUT/peerbench.json "$@" \
    2>&1 | tee $OUT/peerbench.log | sed -n '/^summary/,$p'
fi
