#!/usr/bin/env bash
# The swap-AB kernel's next packs loaded before a group's decode (the previous build, in
# target/old, loaded them after the previous group's MMAs), and persistent against a block
# per item (the default at gpt-oss M >= 1024: 45 stage-1 K steps of 64, 32 pairs per expert);
# the tile kernel as the base. Carry target/release/libmoeplug.so, target/old/libmoeplug.so,
# target/release/moeplug, .peers. Plus the MXFP4 tests on the new build.
source "$(dirname "$0")/dev_common.sh"
SUITE_ARGS="-k mxfp4_ws" SUITE_JOBS=1 SUITE_TIMEOUT=200 bash bench/device_check.sh suite 2>&1 | grep -E '^suite|process|FAILED|Error|assert' | head -20 | tee -a "$sum"
for f in "$OUT"/suite_*.log; do grep -qE " in [0-9.]+s" "$f" && rm -f "$f"; done
rm -f "$OUT"/suite_ids.txt
stamp mx4_tests | tee -a "$sum"
W="MOEPLUG_GPU_FAMILY=wgmma"
OUT=/tmp/ab1 ROUNDS=2 AB_TIMEOUT=90 bash bench/ab.sh "$W" \
  "$W MOEPLUG_WGMMA_SWAP=1 MOEPLUG_LIBRARY=$PWD/target/old/libmoeplug.so" \
  "$W MOEPLUG_WGMMA_SWAP=1" "$W MOEPLUG_WGMMA_SWAP=1 MOEPLUG_WGMMA_PERSISTENT=1" \
  -- --cases gptoss_mxfp4 --ms 512,1024,2048,4096 2>&1 | tail -8 | tee -a "$sum"
stamp ab | tee -a "$sum"
