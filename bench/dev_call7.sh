#!/usr/bin/env bash
# One GPU call after the merges: the launch-field and fused-combine suites, then moeplug alone
# through the kit (every case and M), and decode with the combine unfused (A/B).
set -uo pipefail
export MOEPLUG_LIBRARY=$PWD/target/release/libmoeplug.so MOEPLUG_CACHE_DIR=/tmp/moeplug-cache PYTHONUNBUFFERED=1
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_launch_fields.py tests/gpu/test_fused_combine.py \
  2>&1 | tee $OUT/suite7.log | grep -E "^FAILED|passed|failed" | tail -15
bash bench/variants.sh "DEFAULT=1" >/dev/null 2>&1
bash bench/variants.sh "MOEPLUG_FUSED_COMBINE=0" -- --ms 1,8,64,256 >/dev/null 2>&1
grep -E "^=== | [0-9]+\.[0-9]+ [0-9.]+$" $OUT/variants.log
