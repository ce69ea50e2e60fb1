#!/usr/bin/env bash
# Session 25's fourth GPU call. Carry target/release/libmoeplug.so, target/release/moeplug,
# .peers, and three libraries built for this call only (not committed kernels):
#   target/old  = the commit before WGS_EARLY_PACKS (bulk pack copies without the early loads),
#   target/abl1 = the swap-AB kernel with its MMAs replaced by an XOR of the fragments (decode
#                 alone; results wrong),
#   target/abl2 = the swap-AB kernel with the decode replaced by the raw pack words (MMA and
#                 loads alone; results wrong).
# 1. A/B at gpt-oss MXFP4 M = 1024 / 4096: default, bulk + early packs, bulk without them, and
#    the two ablations (do decode and MMA overlap? base ~ max(abl1, abl2) or ~ their sum?).
# 2. pipe utilisation of stage 1 at M = 1024 (the default kernel).
source "$(dirname "$0")/dev_common.sh"
AB_ANY_RESULT=1 OUT=/tmp/ab1 ROUNDS=2 AB_TIMEOUT=90 bash bench/ab.sh "" "MOEPLUG_WGMMA_BULK_PACKS=1" \
  "MOEPLUG_LIBRARY=$PWD/target/old/libmoeplug.so MOEPLUG_WGMMA_BULK_PACKS=1" \
  "MOEPLUG_LIBRARY=$PWD/target/abl1/libmoeplug.so" "MOEPLUG_LIBRARY=$PWD/target/abl2/libmoeplug.so" \
  -- --cases gptoss_mxfp4 --ms 1024,4096 2>&1 | tail -8 | tee -a "$sum"
stamp ab | tee -a "$sum"
ncu_pipes gpt-oss-120b:mxfp4:1024 120
stamp ncu_pipes | tee -a "$sum"
