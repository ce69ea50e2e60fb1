#!/usr/bin/env bash
# The swap-AB kernel with its epilogue's loads batched (call 33's ncu had long-scoreboard
# stalls 1.4 per instruction: the epilogue's chain of dependent loads between stores) and
# persistent by default: the MXFP4 tests, A/B against the tile kernel, ncu of both stages at
# M = 1024. Carry target/release/libmoeplug.so, target/release/moeplug, .peers.
source "$(dirname "$0")/dev_common.sh"
SUITE_ARGS="-k mxfp4_ws" SUITE_JOBS=1 SUITE_TIMEOUT=200 bash bench/device_check.sh suite 2>&1 | grep -E '^suite|process|FAILED|Error|assert' | head -20 | tee -a "$sum"
tail -2 "$OUT"/suite*.log | tee -a "$sum"; rm -f "$OUT"/suite*
stamp mx4_tests | tee -a "$sum"
W="MOEPLUG_GPU_FAMILY=wgmma"
OUT=/tmp/ab1 ROUNDS=2 AB_TIMEOUT=90 bash bench/ab.sh "$W" "$W MOEPLUG_WGMMA_SWAP=1" \
  -- --cases gptoss_mxfp4 --ms 512,1024,2048,4096 2>&1 | tail -6 | tee -a "$sum"
stamp ab | tee -a "$sum"
MOEPLUG_GPU_FAMILY=wgmma MOEPLUG_WGMMA_SWAP=1 NCU_EXTRA=smsp__issue_active.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum NCU_WHAT=breakdown NCU_KERNELS=moe_stage NCU_SKIP=0 NCU_COUNT=2 \
  NCU_TIMEOUT=100 NCU_LINES=120 NCU_GREP='moe_stage|Duration|DRAM Th|stalled|tensor|inst_executed|issue' \
  bash bench/ncu_profile.sh gpt-oss-120b:mxfp4:1024 2>&1 \
  | grep -E 'moe_stage|Duration|tensor_cycles|inst_executed|issue_active|stalled_(barrier|membar|long|short|wait|math|mio|not_sel|selected|dispatch|sleeping|branch|no_inst|misc|lg_)' | tee -a "$sum"
stamp ncu | tee -a "$sum"
