#!/usr/bin/env bash
# Session 29's first GPU call (dev_call50 never started: device starts failed). Carry
# target/release/libmoeplug.so, target/release/moeplug and .peers. The library has the MXFP4
# stream option MOEPLUG_STREAM_X_SHARED=1 (SW_XSHARED: the tile's activation rows copied into
# shared memory once per block, the K loop reading them with LDS instead of four L1/L2 loads
# per lane, step and column tile, each consumed in its own step), off by default. In order (the ncu read last: the device has been scarce, the A/B matters most):
#  1. A/B, two rounds, gpt-oss MXFP4 M = 1 / 8 / 64 / 256: [0] as chosen, [1] X_SHARED=1.
#     Predicted: [1] 0.95-0.98 at M = 64 / 256 if the activation loads carry the stalls, ~1.0
#     at M = 1 / 8 (few blocks per expert, short walks: the copy is not hidden), and ~1.0
#     everywhere if the weights carry them;
#  2. the MXFP4 GPU tests with X_SHARED=1 (every stream MXFP4 launch on sm_90 stages its rows);
#  3. the kit with X_SHARED=1 (the candidate; [1] of step 1 gives its delta);
#  4. one round, gpt-oss MXFP4 M = 256 / 512: [0] as chosen (stream) against [1] the wgmma
#     family. Predicted: [1] slower at both (~1.3x at 256, ~1.1x at 512);
#  5. where the gpt-oss MXFP4 stream step stalls (ncu source counters, stage 1, M = 256, as
#     chosen): on the weight packs (loaded a step ahead from DRAM) or the activations?
source "$(dirname "$0")/dev_common.sh"
AB_TIMEOUT=60 mxfp4_ab "" "MOEPLUG_STREAM_X_SHARED=1"
MOEPLUG_STREAM_X_SHARED=1 SUITE_ARGS="-k mxfp4" SUITE_TIMEOUT=120 suite_summary
MOEPLUG_STREAM_X_SHARED=1 KIT_TIMEOUT=170 kit_summary
mxfp4_wgmma_check
mxfp4_ncu_stage1
