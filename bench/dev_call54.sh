#!/usr/bin/env bash
# Session 30's first GPU call (dev_call53 plus the staged MXFP4 K loop with two weight steps
# in flight). Carry target/release/libmoeplug.so, target/release/moeplug and .peers. Most
# wanted first:
#  1. A/B, two rounds, gpt-oss MXFP4 M = 1 / 8 / 64 / 256: [0] as chosen; [1] X_SHARED=1;
#     [2] X_SHARED=1 with two weight steps in flight (MOEPLUG_STREAM_AHEAD=2: a third 16-byte
#     x 4 register set, 128 registers, no spill; ~455-470 issued instructions per step against
#     ~400, and 98 KiB of code per stage against 41);
#     [3] X_SHARED=1 with one K warp per row group (MOEPLUG_STREAM_SPLIT_K=1).
#     Predicted: [1] 0.95-0.98 at M = 64 / 256 if the activation loads carry the stalls,
#     ~1.0 at M = 1 / 8; [2] below [1] only if the warps wait on weight latency, not issue
#     (the extra instructions cost ~+10 % if they issue-bind); [3] below [1] at M = 256
#     only if the copy shows;
#  2. the MXFP4 GPU tests with X_SHARED=1 and with X_SHARED=1 AHEAD=2;
#  3. the kit with X_SHARED=1 (the candidate default; step 1 gives its delta);
#  4. gpt-oss MXFP4 M = 256 / 512: as chosen (stream) against the wgmma family;
#  5. where the MXFP4 stream step stalls (ncu source counters, stage 1, M = 256, as chosen).
source "$(dirname "$0")/dev_common.sh"
AB_TIMEOUT=90 mxfp4_ab "" "MOEPLUG_STREAM_X_SHARED=1" \
  "MOEPLUG_STREAM_X_SHARED=1 MOEPLUG_STREAM_AHEAD=2" \
  "MOEPLUG_STREAM_X_SHARED=1 MOEPLUG_STREAM_SPLIT_K=1"
MOEPLUG_STREAM_X_SHARED=1 SUITE_ARGS="-k mxfp4" SUITE_TIMEOUT=150 suite_summary
MOEPLUG_STREAM_X_SHARED=1 MOEPLUG_STREAM_AHEAD=2 SUITE_ARGS="-k mxfp4" SUITE_TIMEOUT=150 suite_summary
MOEPLUG_STREAM_X_SHARED=1 KIT_TIMEOUT=170 kit_summary
mxfp4_wgmma_check
mxfp4_ncu_stage1
