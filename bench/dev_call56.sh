#!/usr/bin/env bash
# dev_call55 cut to the device time left (session 30): the A/B decides what follows.
# Carry target/release/libmoeplug.so, target/release/moeplug and .peers.
#  1. A/B, two rounds, gpt-oss MXFP4 M = 1 / 8 / 64 / 256: [0] as chosen; [1] X_SHARED=1 (the
#     per-lane activation ring). Predicted: [1] 0.88-0.95 at M = 64 / 256, 0.97-1.0 at
#     M = 1 / 8 (bench/NOTES.md, session 30).
#  2. If [1] is below 0.98 at M = 256: the MXFP4 GPU tests and the kit with X_SHARED=1 (the
#     candidate default); else the kit as chosen.
#  3. ncu source counters of stage 1 at M = 256 with X_SHARED=1.
source "$(dirname "$0")/dev_common.sh"
mxfp4_ab "" "MOEPLUG_STREAM_X_SHARED=1"
ring=$(awk '$1 == "gptoss_mxfp4" && $2 == 256 {print $9}' "$sum" | tail -1)
echo "X_SHARED=1 at M = 256: ${ring:-?} of as chosen" | tee -a "$sum"
if awk -v r="${ring:-9}" 'BEGIN {exit !(r < 0.98)}'; then
  MOEPLUG_STREAM_X_SHARED=1 SUITE_ARGS="-k mxfp4" SUITE_TIMEOUT=150 suite_summary
  MOEPLUG_STREAM_X_SHARED=1 KIT_TIMEOUT=170 kit_summary
else
  KIT_TIMEOUT=170 kit_summary
fi
MOEPLUG_STREAM_X_SHARED=1 mxfp4_ncu_stage1
