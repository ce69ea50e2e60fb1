#!/usr/bin/env bash
# Session 26's first GPU call. Carry target/release/libmoeplug.so, target/release/moeplug,
# .peers, target/base/libmoeplug.so (session 25's final commit), target/d1/libmoeplug.so. A/B at
# decode, two rounds: [0] the base; [1] d1: the stream loop's second column tile unpredicated
# and the route's three-barrier scan; [2] this tree: d1 + two weight steps in flight in the
# 16-bit stream loop; [3] this tree + the top-k combine fused into stage 2 (3-12 % slower in
# session 4).
source "$(dirname "$0")/dev_common.sh"
d1=MOEPLUG_LIBRARY=$PWD/target/d1/libmoeplug.so
ROUNDS=2 AB_TIMEOUT=100 OUT=/tmp/ab1 bash bench/ab.sh "MOEPLUG_LIBRARY=$PWD/target/base/libmoeplug.so" "$d1" "" \
  "MOEPLUG_FUSED_COMBINE=1" \
  -- --cases gptoss_bf16,gptoss_mxfp4,qwen3_bf16,qwen3_fp8blk --ms 1,8,64,256 2>&1 | tail -20 | tee -a "$sum"
stamp ab | tee -a "$sum"
