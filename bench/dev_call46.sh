#!/usr/bin/env bash
# Next session's first GPU call (written in session 25, whose device time ran out). Build
# first: cargo build --release, then bash bench/ablate_swap.sh no_mma no_decode. Carry
# target/release/libmoeplug.so, target/release/moeplug, .peers, target/no_mma/libmoeplug.so,
# target/no_decode/libmoeplug.so. In order:
#  1. the kit on session 25's final kernels (its last three calls came on H100s; want an H200);
#  2. the ablations at gpt-oss MXFP4 M = 1024 / 4096 on the final kernels;
#  3. every kernel of the M = 4096 launch (durations: is it the GEMMs?), then what bounds the
#     MMA-only 128-row step there (half tiles did not move 4096): ncu of the no-decode
#     library's stage 1 (tensor and shared pipes, L2 and DRAM rates, stalls).
source "$(dirname "$0")/dev_common.sh"
KIT_TIMEOUT=170 kit_summary
AB_ANY_RESULT=1 ROUNDS=2 AB_TIMEOUT=90 OUT=/tmp/ab1 bash bench/ab.sh "" \
  "MOEPLUG_LIBRARY=$PWD/target/no_mma/libmoeplug.so" "MOEPLUG_LIBRARY=$PWD/target/no_decode/libmoeplug.so" \
  -- --cases gptoss_mxfp4 --ms 1024,4096 2>&1 | tail -6 | tee -a "$sum"
stamp ablations | tee -a "$sum"
ncu_launch gpt-oss-120b:mxfp4:4096 4 150
for lib in release no_decode; do
  echo "=== $lib" | tee -a "$sum"
  MOEPLUG_LIBRARY=$PWD/target/$lib/libmoeplug.so ncu_pipes gpt-oss-120b:mxfp4:4096
done
stamp ncu | tee -a "$sum"
