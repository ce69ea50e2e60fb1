#!/usr/bin/env bash
# Session 27's first GPU call (written in session 26, whose device starts all failed; it ran
# on the H100 in session 27: bench/NOTES.md, call 47). Carry target/release/libmoeplug.so, target/release/moeplug,
# .peers and target/base/libmoeplug.so (built from e8a1a0e, session 25's final commit: git
# worktree add /tmp/base e8a1a0e && cd /tmp/base && cargo build --release, then copy its
# target/release/libmoeplug.so to target/base/ here). In order:
#  1. A/B at M = 1-256, two rounds: [0] the base; [1] this tree (the 16-bit stream loop's
#     second column tile unpredicated, the route's three-barrier scan: MXFP4 and fp8 see only
#     the route); [2] + two weight steps in flight in the 16-bit stream loop
#     (MOEPLUG_STREAM_AHEAD=2; predictions in bench/NOTES.md, session 26);
#  2. with two steps in flight: memcheck and racecheck over 16-bit stream launches and the
#     route (expert mask), beside the whole GPU suite;
#  3. the kit with two steps in flight (flip heuristics::STREAM_AHEAD_DEFAULT if [2] wins).
source "$(dirname "$0")/dev_common.sh"
ROUNDS=2 AB_TIMEOUT=90 OUT=/tmp/ab1 bash bench/ab.sh "MOEPLUG_LIBRARY=$PWD/target/base/libmoeplug.so" "" \
  "MOEPLUG_STREAM_AHEAD=2" \
  -- --cases gptoss_bf16,qwen3_bf16,gptoss_mxfp4,qwen3_fp8blk --ms 1,8,64,256 2>&1 | tail -19 | tee -a "$sum"
stamp ab | tee -a "$sum"
export MOEPLUG_STREAM_AHEAD=2  # the new path under the sanitizers, the suite and the kit
san mem_stream memcheck SAN_SELECT='test_formats_x_act_dtypes\[.*bf16-bf16|test_deterministic\[.*bf16|test_expert_mask|test_real_shapes\[gpt-oss-120b-(1|7)\]' SAN_TIMEOUT=150
san race_stream racecheck SAN_SELECT='test_formats_x_act_dtypes\[.*bf16-bf16-aiter_16x16-none-separated|test_deterministic\[.*bf16|test_expert_mask' SAN_TIMEOUT=150
SUITE_TIMEOUT=200 suite_summary
report sanitizer
rm -rf "$OUT"/mem_stream "$OUT"/race_stream
KIT_TIMEOUT=170 kit_summary
