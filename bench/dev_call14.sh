#!/usr/bin/env bash
# GPU calls of session 14, one per argument:
#   mem: memcheck over the whole GPU suite on today's kernels (8 shards, test_fused_combine
#        apart in 6 shards of two tests), and test_fused_combine's tile32 tests without the
#        sanitizer, timed (the suite's process 0 stopped inside them at its 330 s limit)
#   mem2: memcheck again, the real shapes apart (the first pass ran out of GPU memory)
#   san5: what san4 left of racecheck (test_fused_combine one format per test)
#   san4: session 13's san4 (racecheck of test_fused_combine and of the tests left, initcheck
#        of test_opcheck_on_cuda)
# Carry target/release/libmoeplug.so, target/release/moeplug and .peers.
source "$(dirname "$0")/dev_common.sh"
combine='test_fused_combine\.py'
case ${1:-mem} in
mem)
  san mem memcheck SAN_SELECT=. SAN_EXCLUDE="$combine" SAN_JOBS=8 SHARD=1,2,3,4,5,6,7,8/8 \
    SAN_TIMEOUT=${T:-520}
  san mem_combine memcheck SAN_SELECT="$combine" SAN_JOBS=6 SHARD=1,2,3,4,5,6/6 SAN_TIMEOUT=${T:-520}
  (timeout ${T:-520} python3 -m pytest -q -p no:cacheprovider -rf --durations=0 \
    tests/gpu/test_fused_combine.py -k tile32 2>&1 | tail -25 >"$OUT/plain_combine_tile32.txt") &
  report "$1"
  ;;
mem2)
  # The first pass lost 112 tests to out-of-memory errors, no memcheck report: five shards each
  # held a DeepSeek-V3 layer (~25 GB) in test_real_shapes' cache while the others cached
  # what torch's allocator had freed. Now the real shapes run in three shards of their own,
  # one per model, and every shard gives torch's cache back after each test
  # (tests/gpu/conftest.py).
  real='test_real_shapes'
  san mem_real_ds memcheck SAN_SELECT="$real\\[deepseek" SAN_TIMEOUT=${T:-520}
  san mem_real_gptoss memcheck SAN_SELECT="$real\\[gpt-oss" SAN_TIMEOUT=${T:-520}
  san mem_real_qwen memcheck SAN_SELECT="$real\\[qwen3" SAN_TIMEOUT=${T:-520}
  san mem memcheck SAN_SELECT=. SAN_EXCLUDE="$combine|$real" SAN_JOBS=8 SHARD=1,2,3,4,5,6,7,8/8 \
    SAN_TIMEOUT=${T:-520}
  san mem_combine memcheck SAN_SELECT="$combine" SAN_JOBS=4 SHARD=1,2,3,4/4 SAN_TIMEOUT=${T:-520}
  report "$1"
  ;;
san4)
  bash bench/dev_call13.sh san4
  ;;
san5)
  # What san4 left of racecheck (not yet run): test_fused_combine's groups that ran past 560 s,
  # now one format per test under the sanitizer (18 tests, one sanitizer each). Not here:
  # deepseek-v3 M = 1024, which ran past 560 s alone.
  left_combine="$combine::.*\\[((heuristics|stream|tile32)-(mxfp8|int4_group32|int4_per_channel)|fp32-.*)\\]"
  san race_combine racecheck SAN_SELECT="$left_combine" SAN_JOBS=15 \
    SHARD=$(seq -s, 1 18)/18 SAN_TIMEOUT=${T:-540}
  report "$1"
  ;;
esac
