#!/usr/bin/env bash
# GPU calls of session 18, one per argument, each fitting one 600 s call (device time is
# scarce: the first call does the most). Build main (`cargo build --release`), carry
# target/release/libmoeplug.so, target/release/moeplug and .peers.
#   first:  dev_call18's `check` (the suite, the kit on main with the idle-warpgroup skip,
#           the A/B of session 17's two folds on the fp8 cases), then every kernel of one
#           DeepSeek fp8 M = 1 launch under ncu
#   second: the decode rule's edges (wgmma against stream, M = 1-16), the stall reasons of
#           DeepSeek fp8 M = 1's wgmma stages, every kernel of one Qwen3 fp8 M = 1 launch
source "$(dirname "$0")/dev_common.sh"
case ${1:-first} in
first)
  bash bench/dev_call18.sh check
  ncu_launch deepseek-v3:fp8_block128:1 6 100
  stamp ncu | tee -a "$sum"
  ;;
second)
  ROUNDS=1 edges_ab
  bash bench/dev_call18.sh stall
  ncu_launch qwen3-30b-a3b:fp8_block128:1 5 100
  stamp ncu | tee -a "$sum"
  ;;
esac
