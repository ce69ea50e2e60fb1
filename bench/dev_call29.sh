#!/usr/bin/env bash
# dev_call28.sh cut to the ~150 s of device time left in session 22 (refused starts ate the
# rest): A/B 2dda2a5 / main on gpt-oss MXFP4 at M = 1024, 4096 (one round), then the MXFP4 GPU
# tests on main. Carry as dev_call28.sh.
source "$(dirname "$0")/dev_common.sh"
OUT=/tmp/ab1 ROUNDS=1 AB_TIMEOUT=45 bash bench/ab.sh \
  "MOEPLUG_LIBRARY=$PWD/target/old/libmoeplug.so MOEPLUG_CACHE_DIR=/tmp/c-old" "" \
  -- --cases gptoss_mxfp4 --ms 1024,4096 2>&1 | tail -4 | tee -a "$sum"
stamp ab | tee -a "$sum"
SUITE_ARGS="-k mxfp4" SUITE_JOBS=8 SUITE_TIMEOUT=90 bash bench/device_check.sh suite 2>&1 | grep -E '^suite|process|FAILED|ERROR' | tee -a "$sum"
rm -f "$OUT"/suite_*.log "$OUT"/suite_ids.txt
stamp mx4_tests | tee -a "$sum"
