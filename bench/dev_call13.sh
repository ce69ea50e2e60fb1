#!/usr/bin/env bash
# GPU calls of session 13, one per argument:
#   san1: racecheck over shards 1-12 of 24 of the whole GPU suite (its two slowest tests left
#         out of every shard), racecheck of test_many_tokens alone, and initcheck of the two
#         tests of initcheck shard 15/32 that never finished, each alone (issue 14)
#   san2: racecheck over shards 13-24 of 24, racecheck of gpt-oss-120b M = 1024 alone, and
#         initcheck of the other 18 tests of shard 15/32
#   san3: what san2 left (below)
#   san4: what san3 left (below)
#   decode_ab: the MXFP4 decode change against its parent's library (carry target/ab too)
#   check: the whole suite and the kit with peers (the session's new defaults)
# Carry target/release/libmoeplug.so, target/release/moeplug and .peers.
source "$(dirname "$0")/dev_common.sh"
slow='test_many_tokens|test_real_shapes\[gpt-oss-120b-1024\]'
case ${1:-san1} in
san1 | san2)
  if [ "$1" = san1 ]; then
    shards=1,2,3,4,5,6,7,8,9,10,11,12/24
    san race_many racecheck SAN_SELECT='test_many_tokens' SAN_TIMEOUT=530
    san init_many initcheck SAN_SELECT='test_many_tokens' SAN_TIMEOUT=530
    san init_gptoss initcheck SAN_SELECT='test_real_shapes\[gpt-oss-120b-1024\]' SAN_TIMEOUT=530
  else
    shards=13,14,15,16,17,18,19,20,21,22,23,24/24
    san race_gptoss racecheck SAN_SELECT='test_real_shapes\[gpt-oss-120b-1024\]' SAN_TIMEOUT=530
    san init_rest initcheck SAN_SELECT=. SAN_EXCLUDE="$slow" SHARD=15/32 SAN_TIMEOUT=530
  fi
  san race racecheck SAN_SELECT=. SAN_EXCLUDE="$slow" SAN_JOBS=12 SHARD=$shards SAN_TIMEOUT=530
  report "$1"
  ;;
san3)
  # What san2 left: shards 20-23 (their first tests, test_fused_combine's four children of
  # 108 launches each, held them past 530 s with 12 sanitizers at once) as four shards without
  # them and each of the four alone; shard 17 again (one failure, unnamed by the old report);
  # initcheck of test_opcheck_on_cuda, the one test of initcheck shard 15/32 left.
  combine='test_fused_combine\.py'
  for fam in heuristics stream tile32 fp32; do
    san "race_combine_$fam" racecheck SAN_SELECT="$combine::.*\[$fam\]" SAN_TIMEOUT=${T:-470}
  done
  san race_rest racecheck SAN_SELECT=. SAN_EXCLUDE="$slow|$combine" SAN_JOBS=4 SHARD=20,21,22,23/24 \
    SAN_TIMEOUT=${T:-470}
  san race_17 racecheck SAN_SELECT=. SAN_EXCLUDE="$slow" SHARD=17/24 SAN_TIMEOUT=${T:-470}
  san init_opcheck initcheck SAN_SELECT='test_opcheck_on_cuda' SAN_TIMEOUT=${T:-470}
  report "$1"
  ;;
san4)
  # What san3 left: racecheck of test_fused_combine (now 12 tests of three formats each, one
  # job each), of the tests of shard 20/24 it did not reach, and initcheck of
  # test_opcheck_on_cuda (440 s alone did not finish: the whole call's time).
  san race_combine racecheck SAN_SELECT='test_fused_combine\.py' SAN_JOBS=12 \
    SHARD=1,2,3,4,5,6,7,8,9,10,11,12/12 SAN_TIMEOUT=${T:-530}
  # The 18 tests of shard 20/24 that san3 did not reach (the shards moved when
  # test_fused_combine grew to 12 tests: named, not numbered), deepseek-v3 M = 1024 alone.
  ds='test_real_shapes\[deepseek-v3-1024\]'
  left=$(grep -v deepseek-v3-1024 bench/racecheck_left.txt | sed 's/[].[]/\\&/g' | paste -sd'|')
  san race_ds racecheck SAN_SELECT="$ds" SAN_TIMEOUT=${T:-530}
  san race_left racecheck SAN_SELECT="$left" SAN_JOBS=2 SHARD=1,2/2 SAN_TIMEOUT=${T:-530}
  san init_opcheck initcheck SAN_SELECT='test_opcheck_on_cuda' SAN_TIMEOUT=${T:-530}
  report "$1"
  ;;
decode_ab)
  # The MXFP4 decode change (690511b) alone: the library of its parent (target/ab, built as in
  # bench/NOTES.md, session 13) against this one, two interleaved rounds, through the kit.
  ROUNDS=2 AB_TIMEOUT=80 bash bench/ab.sh "MOEPLUG_LIBRARY=$PWD/target/ab/libmoeplug.so" \
    "MOEPLUG_LIBRARY=$PWD/target/release/libmoeplug.so" -- --cases gptoss_mxfp4 \
    --ms 1,8,64,256,1024,4096 2>&1 | tail -10 | tee -a "$sum"
  stamp "$1" | tee -a "$sum"
  ;;
check)
  # The session's default change on the GPU: the whole suite (MXFP4 on two blocks per SM from
  # 32 pairs per expert) and the kit with peers.
  suite_and_kit
  ;;
esac
