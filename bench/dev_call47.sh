#!/usr/bin/env bash
# Session 26's GPU call (device starts were scarce: everything in one). Carry
# target/release/libmoeplug.so, target/release/moeplug, .peers, target/base/libmoeplug.so
# (session 25's final commit). In order:
#  1. A/B at M = 1, 8 (gpt-oss bf16 / MXFP4, Qwen3 bf16), two rounds: [0] the base; [1] this tree (the 16-bit stream loop's second
#     column tile unpredicated, the route's three-barrier scan: MXFP4 and fp8 see only the
#     route); [2] + two weight steps in flight in the 16-bit stream loop;
#  2. with two steps in flight: memcheck and racecheck over 16-bit stream launches and the
#     route (expert mask), beside the whole GPU suite. (No kit: the device time left after
#     the failed starts holds one call of ~300 s.)
source "$(dirname "$0")/dev_common.sh"
ROUNDS=2 AB_TIMEOUT=60 OUT=/tmp/ab1 bash bench/ab.sh "MOEPLUG_LIBRARY=$PWD/target/base/libmoeplug.so" "" \
  "MOEPLUG_STREAM_AHEAD=2" \
  -- --cases gptoss_bf16,qwen3_bf16,gptoss_mxfp4 --ms 1,8 2>&1 | tail -10 | tee -a "$sum"
stamp ab | tee -a "$sum"
export MOEPLUG_STREAM_AHEAD=2  # the new path under the sanitizers and the suite
san mem_stream memcheck SAN_SELECT='test_formats_x_act_dtypes\[.*bf16-bf16|test_deterministic\[.*bf16|test_expert_mask|test_real_shapes\[gpt-oss-120b-(1|7)\]' SAN_TIMEOUT=100
san race_stream racecheck SAN_SELECT='test_formats_x_act_dtypes\[.*bf16-bf16-aiter_16x16-none-separated|test_deterministic\[.*bf16|test_expert_mask' SAN_TIMEOUT=100
SUITE_TIMEOUT=120 suite_summary
report sanitizer
rm -rf "$OUT"/mem_stream "$OUT"/race_stream
