#!/usr/bin/env bash
# The swap-AB kernel as the MXFP4 default (64-row tiles below 64 pairs per expert, 128 from
# 64): the whole suite and the kit; then a block per item against persistent at decode for
# the long-K cases (call 31: gpt-oss bf16 0.976-0.990 at M = 8-256; DeepSeek fp8 not yet
# measured). Carry target/release/libmoeplug.so, target/release/moeplug, .peers.
source "$(dirname "$0")/dev_common.sh"
suite_summary
kit_summary
OUT=/tmp/ab2 ROUNDS=2 AB_TIMEOUT=80 bash bench/ab.sh "" "MOEPLUG_WGMMA_PERSISTENT=0" \
  -- --cases dsv3_fp8blk,gptoss_bf16 --ms 8,64,256 2>&1 | tail -8 | tee -a "$sum"
stamp ab_persistent | tee -a "$sum"
