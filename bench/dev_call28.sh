#!/usr/bin/env bash
# The next GPU call (built in session 22, not run: no device time was left). The MXFP4 tile
# kernel's packs and scales by cp.async two steps ahead (MOEPLUG_WGMMA_PACK_COPIES=1, an
# opt-in until this call measures it; call 27's ncu had the step waiting on global memory:
# long-scoreboard stalls 2.94 per issued instruction, membar 0). Carry
# target/release/libmoeplug.so, target/release/moeplug and .peers. In order:
#  1. the MXFP4 GPU tests (test_wgmma_mxfp4_ws.py compares the opt-in bit for bit with the
#     default tile kernel);
#  2. A/B: default / pack copies on gpt-oss MXFP4 at M = 512, 1024, 4096;
#  3. ncu stall reasons of the pack-copies MXFP4 stage 1 at M = 1024;
#  4. the kit with peers.
# Predicted (bench/NOTES.md, session 22): if the stalls are the pack loads, stage 1 at
# M = 1024 1.09 → ~0.85 ms and the launch 1660 → ~1400 µs (H100); M = 4096 2738 → ~2450.
source "$(dirname "$0")/dev_common.sh"
SUITE_ARGS="-k mxfp4" SUITE_JOBS=8 SUITE_TIMEOUT=150 bash bench/device_check.sh suite 2>&1 | grep -E '^suite|process|FAILED|ERROR' | tee -a "$sum"
rm -f "$OUT"/suite_*.log "$OUT"/suite_ids.txt
stamp mx4_tests | tee -a "$sum"
OUT=/tmp/ab1 ROUNDS=2 AB_TIMEOUT=60 bash bench/ab.sh "" "MOEPLUG_WGMMA_PACK_COPIES=1" \
  -- --cases gptoss_mxfp4 --ms 512,1024,4096 2>&1 | tail -5 | tee -a "$sum"
stamp ab | tee -a "$sum"
MOEPLUG_WGMMA_PACK_COPIES=1 NCU_WHAT=breakdown NCU_KERNELS=moe_stage1 NCU_SKIP=1 NCU_COUNT=1 \
  NCU_TIMEOUT=80 NCU_LINES=80 NCU_GREP='moe_stage|Duration|DRAM Th|stalled|tensor' \
  bash bench/ncu_profile.sh gpt-oss-120b:mxfp4:1024 2>&1 \
  | grep -E 'moe_stage|Duration|tensor_cycles|stalled_(barrier|membar|long|short|wait|math|mio|not_sel|selected|dispatch)' | tee -a "$sum"
stamp ncu | tee -a "$sum"
KIT_TIMEOUT=150 bash bench/device_check.sh kit 2>&1 | tail -34 | tee -a "$sum"
stamp kit | tee -a "$sum"
