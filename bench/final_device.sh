#!/usr/bin/env bash
# The closing GPU call: the full peer kit, then compute-sanitizer memcheck and racecheck over
# a reduced fused_moe subset (both families), logs under $OUT.
set -uo pipefail
export MOEPLUG_LIBRARY=$PWD/target/release/libmoeplug.so PYTHONUNBUFFERED=1 MOEPLUG_CACHE_DIR=/tmp/moeplug-cache
timeout 200 python3 .peers/bench_peer.py --moeplug-lib target/release/libmoeplug.so --moeplug-python python \
  --budget-s 170 --json-out $OUT/peerbench.json 2>&1 | tee $OUT/peerbench.log | sed -n '/^summary/,$p'
sel="test_deterministic or test_cuda_graph or (test_formats_x_act_dtypes and aiter_16x16 and 7)"
for tool in memcheck racecheck; do
  echo "=== compute-sanitizer --tool $tool (-k '$sel')"
  timeout ${SAN_TIMEOUT:-130} compute-sanitizer --tool $tool --error-exitcode 3 python3 -m pytest -q -p no:cacheprovider \
    tests/gpu/test_fused_moe.py -k "$sel" 2>&1 | tee $OUT/sanitizer_$tool.log | grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed|failed|Error" | tail -4
  echo "rc=${PIPESTATUS[0]}"
done
