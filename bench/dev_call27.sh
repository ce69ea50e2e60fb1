#!/usr/bin/env bash
# The next GPU call (sessions 21-22), sized for ~450 s of a device budget cut by refused
# starts. Carry target/release/libmoeplug.so, target/release/moeplug and .peers.
# What main has that no GPU has run (bench/NOTES.md, sessions 21-22): wgmma descriptors by add
# and activation copies without selects (every wgmma kernel), stage-2 partials in the output's
# 16-bit type (the wgmma family), the MXFP4 loads after the proxy fence (tile and register-
# operand kernels; the warp-specialised kernel's scales through the ring), MXFP4 on the
# warp-specialised kernel (opt-in, MOEPLUG_WGMMA_BLOCKS=1) and with two decoding warpgroups
# (MOEPLUG_WGMMA_DECODERS=2). In order:
#  1. the whole suite on the new defaults (test_wgmma_mxfp4_ws.py runs both opt-ins against
#     the tile kernel, bit for bit);
#  2. the kit with peers (compare with call 25's table, H100, e9e7571);
#  3. A/B of MXFP4: main / warp-specialised / with decoding warpgroups / register operand,
#     M = 1024, 4096, one round;
#  4. ncu stall reasons of the MXFP4 tile kernel's stage 1 at M = 1024.
source "$(dirname "$0")/dev_common.sh"
SUITE_JOBS=8 SUITE_TIMEOUT=200 bash bench/device_check.sh suite 2>&1 | grep -E '^suite|process|FAILED|ERROR' | tee -a "$sum"
rm -f "$OUT"/suite_*.log "$OUT"/suite_ids.txt
stamp suite | tee -a "$sum"
KIT_TIMEOUT=200 bash bench/device_check.sh kit 2>&1 | tail -40 | tee -a "$sum"
stamp kit | tee -a "$sum"
OUT=/tmp/ab2 ROUNDS=1 AB_TIMEOUT=60 bash bench/ab.sh "" "MOEPLUG_WGMMA_BLOCKS=1" \
  "MOEPLUG_WGMMA_BLOCKS=1 MOEPLUG_WGMMA_DECODERS=2" "MOEPLUG_WGMMA_RS=1" -- --cases gptoss_mxfp4 \
  --ms 1024,4096 2>&1 | tail -5 | tee -a "$sum"
stamp ab_mx4 | tee -a "$sum"
NCU_WHAT=breakdown NCU_KERNELS=moe_stage1 NCU_SKIP=1 NCU_COUNT=1 NCU_TIMEOUT=80 NCU_LINES=80 \
  NCU_GREP='moe_stage|Duration|DRAM Th|stalled|tensor' bash bench/ncu_profile.sh gpt-oss-120b:mxfp4:1024 2>&1 \
  | grep -E 'moe_stage|Duration|tensor|stalled_(barrier|membar|long|short|wait|math|mio|lg|not_sel|selected|dispatch|no_inst|branch|sleeping|drain|tex)' | tee -a "$sum"
stamp ncu | tee -a "$sum"
