#!/usr/bin/env bash
# Session 25's fifth GPU call. Carry target/release/libmoeplug.so, target/release/moeplug,
# .peers, target/old/libmoeplug.so (272a1c7's kernels) and target/b3/libmoeplug.so (the
# swap-AB decode change without mx_shr_fma). In order:
#  1. every MXFP4 GPU test (stream, tile and swap-AB kernels) on target/release;
#  2. A/B on gpt-oss MXFP4: [0] old, [1] b3 (swap-AB: two bytes per PRMT, the scale multiplier
#     as a half operand; predicted 6-10 % at M = 1024, 3-5 % at 4096), [2] release (+ the
#     stream family's right shifts as IMAD.HI, M <= 256: predicted 0-8 %, if the integer pipe
#     binds there);
#  3. pipe utilisation of the stream family's stage 1 at M = 256.
source "$(dirname "$0")/dev_common.sh"
SUITE_ARGS="-k mxfp4" SUITE_JOBS=6 SUITE_TIMEOUT=240 bash bench/device_check.sh suite 2>&1 \
  | grep -E '^suite|process|FAILED|Error|assert|passed|failed' | head -30 | tee -a "$sum"
rm -f "$OUT"/suite*
stamp mx4_tests | tee -a "$sum"
ROUNDS=2 AB_TIMEOUT=120 OUT=/tmp/ab1 bash bench/ab.sh "MOEPLUG_LIBRARY=$PWD/target/old/libmoeplug.so" \
  "MOEPLUG_LIBRARY=$PWD/target/b3/libmoeplug.so" "" \
  -- --cases gptoss_mxfp4 --ms 8,64,256,1024,4096 2>&1 | tail -8 | tee -a "$sum"
stamp ab | tee -a "$sum"
ncu_pipes gpt-oss-120b:mxfp4:256 40
stamp ncu_pipes | tee -a "$sum"
