#!/usr/bin/env bash
# Session 27, second GPU call: a one-round screen of the existing switches at the points where
# the kit still has moeplug behind (call 47, H100): gpt-oss bf16 M = 1-256 (1.02-1.05),
# gpt-oss MXFP4 M = 8-256 (1.04-1.14), Qwen3 fp8 M = 8 (1.03). Winners are confirmed with two
# rounds before any default moves. Carry target/release/libmoeplug.so and .peers.
source "$(dirname "$0")/dev_common.sh"
ab() {  # name, cases, ms, variants...
  local name=$1 cases=$2 ms=$3
  shift 3
  ROUNDS=1 AB_TIMEOUT=60 OUT=/tmp/ab_$name bash bench/ab.sh "$@" -- --cases "$cases" --ms "$ms" \
    2>&1 | grep -v "^===" | tee -a "$sum"
  stamp "$name" | tee -a "$sum"
}
P=MOEPLUG_
# Most points first (each block's table is printed as it ends: a timeout keeps the earlier ones).
ab bf16mid gptoss_bf16 8,64,256 "" "${P}WGMMA_N=128" "${P}WGMMA_BLOCKS=2" "${P}GPU_FAMILY=stream"
ab mxfp4 gptoss_mxfp4 8,64,256 "" "${P}STREAM_PREFETCH=2" "${P}STREAM_SPLIT_K=4,4" "${P}STREAM_SPLIT_K=8,8"
ab split16 gptoss_bf16 1 "" "${P}STREAM_SPLIT_K=8,8" "${P}STREAM_SPLIT_K=4,4" "${P}FUSED_COMBINE=1"
ab fp8 qwen3_fp8blk 8 "" "${P}GPU_FAMILY=stream" "${P}WGMMA_N=128"
