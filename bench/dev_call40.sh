#!/usr/bin/env bash
# Session 25's third GPU call. Carry target/release/libmoeplug.so, target/release/moeplug, .peers.
#  1. the MXFP4 warp-specialised tests (swap_bulk now runs the 128-row early-pack kernel);
#  2. A/B at gpt-oss MXFP4 M = 1024 / 2048 / 4096: bulk pack copies, which on 128-row tiles now
#     also give the consumers 224 registers and load each group's packs under the previous
#     group's wait (WGS_EARLY_PACKS);
#  3. pipe utilisation of stage 1 (64- and 128-row tiles) to see which pipe bounds the step;
#  4. every kernel of one launch at the decode points still above the peer: gpt-oss bf16 M = 1
#     and gpt-oss MXFP4 M = 256 (durations and DRAM rates).
source "$(dirname "$0")/dev_common.sh"
mx4_ws_tests
OUT=/tmp/ab1 ROUNDS=2 AB_TIMEOUT=90 bash bench/ab.sh "" "MOEPLUG_WGMMA_BULK_PACKS=1" \
  -- --cases gptoss_mxfp4 --ms 1024,2048,4096 2>&1 | tail -5 | tee -a "$sum"
stamp ab_bulk | tee -a "$sum"
for m in 1024 4096; do
  MOEPLUG_WGMMA_BULK_PACKS=1 NCU_WHAT=breakdown NCU_SKIP=2 NCU_COUNT=1 NCU_KERNELS=moe_stage1 \
    NCU_EXTRA="regex:sm__inst_executed_pipe_.*.avg.pct_of_peak_sustained_active,regex:sm__pipe_.*_cycles_active.avg.pct_of_peak_sustained_active" \
    bash bench/ncu_profile.sh gpt-oss-120b:mxfp4:$m 2>&1 | grep -E "===|Duration|pipe|issue_active|inst_executed" | grep -v " 0$" | head -60 | tee -a "$sum"
done
stamp ncu_pipes | tee -a "$sum"
ncu_launch gpt-oss-120b:bf16:1 4 120
ncu_launch gpt-oss-120b:mxfp4:256 4 120
stamp ncu_launch | tee -a "$sum"
