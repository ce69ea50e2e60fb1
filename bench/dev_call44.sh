#!/usr/bin/env bash
# Session 25's seventh GPU call. Carry target/release/libmoeplug.so, target/release/moeplug,
# .peers and target/b3/libmoeplug.so (e9cd661's kernels, the swap-AB decode without half
# tiles). In order:
#  1. every MXFP4 GPU test on target/release (128-row swap-AB tiles whose last 64 rows are
#     padding now run n64 MMAs);
#  2. A/B on gpt-oss MXFP4 at M = 1024 (64-row tiles: unchanged, the control), 2048, 4096:
#     [0] e9cd661, [1] half tiles. Predicted: 2048 -8..-12 %, 4096 -6..-10 %.
source "$(dirname "$0")/dev_common.sh"
SUITE_ARGS="-k mxfp4" SUITE_JOBS=6 SUITE_TIMEOUT=240 bash bench/device_check.sh suite 2>&1 \
  | grep -E '^suite|process|FAILED|Error|assert|passed|failed' | head -30 | tee -a "$sum"
rm -f "$OUT"/suite*
stamp mx4_tests | tee -a "$sum"
ROUNDS=2 AB_TIMEOUT=120 OUT=/tmp/ab1 bash bench/ab.sh "MOEPLUG_LIBRARY=$PWD/target/b3/libmoeplug.so" "" \
  -- --cases gptoss_mxfp4 --ms 1024,2048,4096 2>&1 | tail -6 | tee -a "$sum"
stamp ab | tee -a "$sum"
