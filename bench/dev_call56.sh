#!/usr/bin/env bash
# For session 31's first GPU call (session 30's device time ran out after call 54: nine
# failed starts and cool-downs). Carry target/release/libmoeplug.so, target/release/moeplug
# and .peers. MOEPLUG_STREAM_X_SHARED=1 is the per-lane activation ring: each lane copies its
# next step's MXFP4 activation packs into shared memory by cp.async (no register held) and
# reads its own packs back after `cp.async.wait_group 1`; 111/114 registers, ~398
# instructions per step against ~404 (bench/NOTES.md, session 30). Most wanted first:
#  1. A/B, two rounds, gpt-oss MXFP4 M = 1 / 8 / 64 / 256: [0] as chosen; [1] X_SHARED=1;
#     [2] MOEPLUG_STREAM_PREFETCH_BIAS=1 (each row group's bias lines asked for before its K
#     walk); [3] MOEPLUG_STREAM_SPLIT_K=1 (call 54: 0.984 at M = 256 with the old row
#     staging); [4] X_SHARED=1 with PREFETCH_BIAS=1. Predicted: [1] 0.88-0.95 at M = 64 / 256
#     (the activation wait, ~24 % of stage 1's stall samples, hidden behind a step),
#     0.97-1.0 at M = 1 / 8; [2] 0.97-0.99 everywhere (the epilogue's bias wait, 6.5 %,
#     cut to an L1 / L2 hit); [4] about [1] x [2].
#  2. If [1] is below 0.98 at M = 256: the MXFP4 GPU tests and the kit with X_SHARED=1 (the
#     candidate default); else the kit as chosen.
#  3. Where the ring's step stalls (ncu source counters, stage 1, M = 256, X_SHARED=1).
# Then, for each of [1] and [2] that won: flip its default (heuristics.rs) and run the whole
# suite.
source "$(dirname "$0")/dev_common.sh"
mxfp4_ab "" "MOEPLUG_STREAM_X_SHARED=1" "MOEPLUG_STREAM_PREFETCH_BIAS=1" \
  "MOEPLUG_STREAM_SPLIT_K=1" "MOEPLUG_STREAM_X_SHARED=1 MOEPLUG_STREAM_PREFETCH_BIAS=1"
ring=$(awk '$1 == "gptoss_mxfp4" && $2 == 256 {print $9}' "$sum" | tail -1)
echo "X_SHARED=1 at M = 256: ${ring:-?} of as chosen" | tee -a "$sum"
if awk -v r="${ring:-9}" 'BEGIN {exit !(r < 0.98)}'; then
  MOEPLUG_STREAM_X_SHARED=1 SUITE_ARGS="-k mxfp4" SUITE_TIMEOUT=150 suite_summary
  MOEPLUG_STREAM_X_SHARED=1 KIT_TIMEOUT=170 kit_summary
else
  KIT_TIMEOUT=170 kit_summary
fi
MOEPLUG_STREAM_X_SHARED=1 mxfp4_ncu_stage1
