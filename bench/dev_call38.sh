#!/usr/bin/env bash
# Next session's first GPU call (written in session 24, whose device time ran out). Carry
# target/release/libmoeplug.so, target/release/moeplug, .peers. In order:
#  1. the MXFP4 warp-specialised tests (the shared-memory kernels now with the swap-AB default
#     off, the swap-AB kernel on both tile heights and with bulk pack copies);
#  2. the kit on the final commit (the swap-AB default; a block per item for 40+ K steps at
#     decode too, A/B-measured in calls 31 / 36 but not yet in a kit);
#  3. A/B: bulk pack copies (MOEPLUG_WGMMA_BULK_PACKS=1; SASS: the producer's step 273 -> 223
#     instructions) at gpt-oss MXFP4 M = 1024, 2048, 4096.
# Then bench/dev_call39.sh (the sanitizers and where the swap-AB kernel stalls).
source "$(dirname "$0")/dev_common.sh"
mx4_ws_tests
KIT_TIMEOUT=170 kit_summary
OUT=/tmp/ab1 ROUNDS=2 AB_TIMEOUT=90 bash bench/ab.sh "" "MOEPLUG_WGMMA_BULK_PACKS=1" \
  -- --cases gptoss_mxfp4 --ms 1024,2048,4096 2>&1 | tail -5 | tee -a "$sum"
stamp ab_bulk | tee -a "$sum"
