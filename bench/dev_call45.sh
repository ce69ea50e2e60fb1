#!/usr/bin/env bash
# Session 25's last GPU call (its device time nearly spent). Carry target/release/libmoeplug.so,
# target/release/moeplug, .peers and target/half128/libmoeplug.so (bf15885: half tiles on
# 128-row tiles only). In order: the MXFP4 warp-specialised tests (64-row swap-AB tiles whose
# last 32 rows are padding now run n32 MMAs), A/B at gpt-oss MXFP4 M = 1024 ([0] 128-row half
# tiles only, [1] + 64-row), the kit.
source "$(dirname "$0")/dev_common.sh"
mx4_ws_tests
ROUNDS=2 AB_TIMEOUT=60 OUT=/tmp/ab1 bash bench/ab.sh "MOEPLUG_LIBRARY=$PWD/target/half128/libmoeplug.so" "" \
  -- --cases gptoss_mxfp4 --ms 1024 2>&1 | tail -4 | tee -a "$sum"
stamp ab | tee -a "$sum"
KIT_TIMEOUT=150 kit_summary
