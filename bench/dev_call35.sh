#!/usr/bin/env bash
# The swap-AB kernel on 128-row tiles (n128 MMAs, setmaxnreg 72 / 216) against 64-row tiles
# and the tile kernel, gpt-oss MXFP4 M = 1024 .. 4096; the MXFP4 warp-specialised tests (both
# tile heights). Carry target/release/libmoeplug.so, target/release/moeplug, .peers.
source "$(dirname "$0")/dev_common.sh"
SUITE_ARGS="-k mxfp4_ws" SUITE_JOBS=1 SUITE_TIMEOUT=200 bash bench/device_check.sh suite 2>&1 | grep -E '^suite|process|FAILED|Error|assert' | head -20 | tee -a "$sum"
tail -2 "$OUT"/suite*.log | tee -a "$sum"; rm -f "$OUT"/suite*
stamp mx4_tests | tee -a "$sum"
W="MOEPLUG_GPU_FAMILY=wgmma"
OUT=/tmp/ab1 ROUNDS=2 AB_TIMEOUT=90 bash bench/ab.sh "$W" "$W MOEPLUG_WGMMA_SWAP=1" \
  "$W MOEPLUG_WGMMA_SWAP=1 MOEPLUG_WGMMA_BM=128" \
  -- --cases gptoss_mxfp4 --ms 512,1024,2048,4096 2>&1 | tail -6 | tee -a "$sum"
stamp ab | tee -a "$sum"
