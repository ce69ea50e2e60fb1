#!/usr/bin/env bash
# For session 30's first GPU call (session 29's calls never ran: twelve failed starts, ten
# cool-down refusals, two machines lost mid-call). Carry target/release/libmoeplug.so,
# target/release/moeplug and .peers. The library has MOEPLUG_STREAM_X_SHARED=1 (SW_XSHARED:
# the MXFP4 stream tile's activation rows copied into shared memory by cp.async once per
# block, the K loop reading them with ld.shared instead of four L1 / L2 loads per lane, step
# and column tile consumed in their own step), off by default. In order, most wanted first:
#  1. A/B, two rounds, gpt-oss MXFP4 M = 1 / 8 / 64 / 256: [0] as chosen; [1] X_SHARED=1;
#     [2] X_SHARED=1 with one K warp per row group (MOEPLUG_STREAM_SPLIT_K=1: 8 row groups
#     share a block's copy, against 4 at the chosen split of 2).
#     Predicted: [1] 0.95-0.98 at M = 64 / 256 if the activation loads carry the stalls,
#     ~1.0 at M = 1 / 8 (a short walk does not hide the copy), ~1.0 everywhere if the
#     weights carry them; [2] below [1] at M = 256 only if the copy shows;
#  2. the MXFP4 GPU tests with X_SHARED=1 (every stream MXFP4 launch on sm_90 stages its rows;
#     test_real_shapes' gpt-oss runs K = 2880);
#  3. the kit with X_SHARED=1 (the candidate default; step 1 gives its delta);
#  4. one round, gpt-oss MXFP4 M = 256 / 512: [0] as chosen (stream) against the wgmma family.
#     Predicted: wgmma slower at both (~1.3x at 256, ~1.1x at 512);
#  5. where the MXFP4 stream step stalls (ncu source counters, stage 1, M = 256, as chosen).
source "$(dirname "$0")/dev_common.sh"
mxfp4_ab "" "MOEPLUG_STREAM_X_SHARED=1" "MOEPLUG_STREAM_X_SHARED=1 MOEPLUG_STREAM_SPLIT_K=1"
MOEPLUG_STREAM_X_SHARED=1 SUITE_ARGS="-k mxfp4" SUITE_TIMEOUT=150 suite_summary
MOEPLUG_STREAM_X_SHARED=1 KIT_TIMEOUT=170 kit_summary
mxfp4_wgmma_check
mxfp4_ncu_stage1
