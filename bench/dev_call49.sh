#!/usr/bin/env bash
# Session 28's first GPU call; it ran as call 49 (bench/NOTES.md) against the stream loop change
# that it refuted and that was reverted, so on today's tree [1] is the base again. Carry target/release/libmoeplug.so, target/release/moeplug,
# .peers, target/base/libmoeplug.so (main at 96716f8, session 27's final commit) and
# target/pp1/libmoeplug.so (this tree built with SW_PINGPONG 1). In order:
#  1. A/B at M = 1-256, two rounds: [0] the base; [1] this tree (the stream K loop without
#     load predicates outside a walk's last step: ~4.5 % fewer instructions per MXFP4 step,
#     SASS); [2] + the one-ahead loop unrolled by two so that its register sets are not
#     copied (~9 % fewer; it spills in some configurations, so it is not the default yet).
#     Predicted: MXFP4 M = 8-256 [1] 0.96-0.98x, [2] 0.93-0.97x; fp8 stream points
#     0.97-1.00x; 16-bit 0.98-1.00x;
#  2. memcheck over stream launches (MXFP4 and 16-bit, the expert mask), beside the whole GPU
#     suite;
#  3. the kit on this tree, which also measures session 27's long-K stream rule (predicted:
#     gpt-oss bf16 M = 8 / 64 / 256 at ~1.00 / 0.99 / 1.00; MXFP4 M = 8-256 0.02-0.04 below
#     call 47's 1.04 / 1.05 / 1.14).
source "$(dirname "$0")/dev_common.sh"
ROUNDS=2 AB_TIMEOUT=110 OUT=/tmp/ab1 bash bench/ab.sh "MOEPLUG_LIBRARY=$PWD/target/base/libmoeplug.so" "" \
  "MOEPLUG_LIBRARY=$PWD/target/pp1/libmoeplug.so" \
  -- --cases gptoss_mxfp4,gptoss_bf16,qwen3_fp8blk --ms 1,8,64,256 2>&1 \
  | tail -16 | tee -a "$sum"
stamp ab | tee -a "$sum"
san mem_stream memcheck SAN_SELECT='test_formats_x_act_dtypes\[.*(bf16-bf16|mxfp4-bf16)|test_deterministic\[.*(bf16|mxfp4)|test_expert_mask|test_real_shapes\[gpt-oss-120b-(1|7)\]' SAN_TIMEOUT=170
SUITE_TIMEOUT=200 suite_summary
report sanitizer
rm -rf "$OUT"/mem_stream
KIT_TIMEOUT=170 kit_summary
