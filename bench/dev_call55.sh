#!/usr/bin/env bash
# Session 30's second GPU call. Carry target/release/libmoeplug.so, target/release/moeplug and
# .peers. Call 54 (H100) found the MXFP4 stream step waiting on its activation loads (ncu,
# M = 256: 66 % of the samples long-scoreboard, the activation PRMTs ~24 % of all), the
# whole-row staging 3-7 % slower than the loads, and two weight steps ahead 5-20 % slower.
# MOEPLUG_STREAM_X_SHARED=1 is now a per-lane ring: each lane copies its next step's
# activation packs into shared memory by cp.async (LDGSTS, no register held) and reads its
# own packs back (LDS.128) after the wait; 111/114 registers, ~398 instructions per step
# against ~404. Most wanted first:
#  1. A/B, two rounds, gpt-oss MXFP4 M = 1 / 8 / 64 / 256: [0] as chosen; [1] X_SHARED=1;
#     [2] MOEPLUG_STREAM_SPLIT_K=1 (call 54: 0.984 at M = 256 with the row staging);
#     [3] X_SHARED=1 with SPLIT_K=1.
#     Predicted: [1] 0.88-0.95 at M = 64 / 256 (the activation wait hidden behind a step;
#     the weights' one-step lead becomes the bound), 0.97-1.0 at M = 1 / 8.
#  2. the kit with X_SHARED=1 (the candidate default);
#  3. the MXFP4 GPU tests with X_SHARED=1 (it changes only the MXFP4 stream kernels on
#     sm_90; the X_SHARED=0 stream kernels are byte-identical to those call 54 ran; trimmed
#     from the whole suite for the device time left);
#  4. where the staged step stalls now (ncu source counters, stage 1, M = 256, X_SHARED=1).
source "$(dirname "$0")/dev_common.sh"
mxfp4_ab "" "MOEPLUG_STREAM_X_SHARED=1" "MOEPLUG_STREAM_SPLIT_K=1" \
  "MOEPLUG_STREAM_X_SHARED=1 MOEPLUG_STREAM_SPLIT_K=1"
MOEPLUG_STREAM_X_SHARED=1 KIT_TIMEOUT=170 kit_summary
MOEPLUG_STREAM_X_SHARED=1 SUITE_ARGS="-k mxfp4" SUITE_TIMEOUT=150 suite_summary
MOEPLUG_STREAM_X_SHARED=1 mxfp4_ncu_stage1
