#!/usr/bin/env bash
# The next GPU call (session 21 built it; no machine was lent after call 26). Build main and
# target/old/libmoeplug.so (e9e7571: `git worktree add /tmp/wt-old e9e7571`, then
# `CARGO_TARGET_DIR=/tmp/old-target cargo build --release` there, copy the library); carry
# target/release/libmoeplug.so, target/release/moeplug, target/old/libmoeplug.so and .peers.
# What main has that no GPU has run (bench/NOTES.md, session 21): wgmma descriptors by add and
# activation copies without selects (every wgmma kernel), stage-2 partials in the output's
# 16-bit type (the wgmma family), MXFP4 on the warp-specialised kernel (opt-in,
# MOEPLUG_WGMMA_BLOCKS=1). In order:
#  1. the whole suite on the new defaults;
#  2. the MXFP4 tests on the warp-specialised MXFP4 kernel;
#  3. A/B: e9e7571 / main / main + MXFP4 warp-specialised, every case at M = 64, 1024, 4096;
#  4. ncu: the warp-specialised MXFP4 stage 1 at M = 1024 (issue rate, stalls).
source "$(dirname "$0")/dev_common.sh"
SUITE_JOBS=8 SUITE_TIMEOUT=240 bash bench/device_check.sh suite 2>&1 | grep -E '^suite|process|FAILED|ERROR' | tee -a "$sum"
rm -f "$OUT"/suite_*.log "$OUT"/suite_ids.txt
stamp suite | tee -a "$sum"
MOEPLUG_WGMMA_BLOCKS=1 SUITE_ARGS="-k mxfp4" SUITE_JOBS=8 SUITE_TIMEOUT=150 bash bench/device_check.sh suite 2>&1 | grep -E '^suite|process|FAILED|ERROR' | tee -a "$sum"
rm -f "$OUT"/suite_*.log "$OUT"/suite_ids.txt
stamp mx4ws_tests | tee -a "$sum"
OUT=/tmp/ab1 ROUNDS=2 AB_TIMEOUT=100 bash bench/ab.sh \
  "MOEPLUG_LIBRARY=$PWD/target/old/libmoeplug.so MOEPLUG_CACHE_DIR=/tmp/c-old" "" \
  "MOEPLUG_WGMMA_BLOCKS=1" -- --ms 64,1024,4096 2>&1 | tail -19 | tee -a "$sum"
stamp ab | tee -a "$sum"
MOEPLUG_WGMMA_BLOCKS=1 NCU_KERNELS=moe_stage1 NCU_SKIP=1 NCU_COUNT=1 NCU_TIMEOUT=100 NCU_LINES=40 \
  bash bench/ncu_profile.sh gpt-oss-120b:mxfp4:1024 2>&1 | grep -E "moe_stage|Duration|DRAM Th|Issued|Eligible|Registers|Achieved" | tee -a "$sum"
stamp ncu | tee -a "$sum"
# 5. ncu: the default MXFP4 stage 1 (the tile kernel) at M = 1024 with the new step, stalls.
NCU_KERNELS=moe_stage1 NCU_SKIP=1 NCU_COUNT=1 NCU_TIMEOUT=100 NCU_LINES=40 \
  bash bench/ncu_profile.sh gpt-oss-120b:mxfp4:1024 2>&1 | grep -E "moe_stage|Duration|DRAM Th|Issued|Eligible|Registers|Achieved" | tee -a "$sum"
stamp ncu_tile | tee -a "$sum"
