#!/usr/bin/env bash
# Session 22's second GPU call: the MXFP4 tile kernel's packs and scales by cp.async two
# steps ahead (call 27's ncu: long-scoreboard stalls 2.94 per issued instruction, membar 0).
# Build main and target/old/libmoeplug.so from 2dda2a5 (call 27's library: `git worktree add
# /tmp/wt-old 2dda2a5`, `CARGO_TARGET_DIR=/tmp/old-target cargo build --release` there, copy
# the library); carry target/release/libmoeplug.so, target/release/moeplug,
# target/old/libmoeplug.so and .peers. In order:
#  1. the MXFP4 GPU tests (the tile kernel is their default at wgmma sizes;
#     test_wgmma_mxfp4_ws.py compares it bit for bit with the warp-specialised kernels);
#  2. A/B: 2dda2a5 / main on gpt-oss MXFP4 at M = 1024, 4096;
#  3. ncu stall reasons of the new MXFP4 stage 1 at M = 1024;
#  4. the kit with peers on main.
source "$(dirname "$0")/dev_common.sh"
SUITE_ARGS="-k mxfp4" SUITE_JOBS=8 SUITE_TIMEOUT=150 bash bench/device_check.sh suite 2>&1 | grep -E '^suite|process|FAILED|ERROR' | tee -a "$sum"
rm -f "$OUT"/suite_*.log "$OUT"/suite_ids.txt
stamp mx4_tests | tee -a "$sum"
OUT=/tmp/ab1 ROUNDS=2 AB_TIMEOUT=60 bash bench/ab.sh \
  "MOEPLUG_LIBRARY=$PWD/target/old/libmoeplug.so MOEPLUG_CACHE_DIR=/tmp/c-old" "" \
  -- --cases gptoss_mxfp4 --ms 1024,4096 2>&1 | tail -4 | tee -a "$sum"
stamp ab | tee -a "$sum"
NCU_WHAT=breakdown NCU_KERNELS=moe_stage1 NCU_SKIP=1 NCU_COUNT=1 NCU_TIMEOUT=80 NCU_LINES=80 \
  NCU_GREP='moe_stage|Duration|DRAM Th|stalled|tensor' bash bench/ncu_profile.sh gpt-oss-120b:mxfp4:1024 2>&1 \
  | grep -E 'moe_stage|Duration|tensor_cycles|stalled_(barrier|membar|long|short|wait|math|mio|not_sel|selected|dispatch)' | tee -a "$sum"
stamp ncu | tee -a "$sum"
KIT_TIMEOUT=150 bash bench/device_check.sh kit 2>&1 | tail -34 | tee -a "$sum"
stamp kit | tee -a "$sum"
