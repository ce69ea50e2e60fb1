#!/usr/bin/env bash
# Session 21, call 26 (H100 or H200): which existing MXFP4 configuration is fastest at
# M = 256-4096 (no code change: family and shape opt-ins), and what stalls MXFP4 stage 1 at
# M = 1024. Carry target/release/libmoeplug.so, target/release/moeplug, .peers.
source "$(dirname "$0")/dev_common.sh"
OUT=/tmp/ab1 ROUNDS=2 AB_TIMEOUT=110 bash bench/ab.sh "" "MOEPLUG_GPU_FAMILY=stream" \
  "MOEPLUG_GPU_FAMILY=wgmma MOEPLUG_WGMMA_RS=1 MOEPLUG_WGMMA_BM=64" \
  "MOEPLUG_GPU_FAMILY=wgmma MOEPLUG_WGMMA_RS=1" "MOEPLUG_GPU_FAMILY=wgmma" -- \
  --cases gptoss_mxfp4 --ms 256,512,1024,4096 2>&1 | tail -8 | tee -a "$sum"
stamp ab | tee -a "$sum"
NCU_KERNELS=moe_stage1 NCU_SKIP=1 NCU_COUNT=1 NCU_TIMEOUT=120 NCU_LINES=80 \
  bash bench/ncu_profile.sh gpt-oss-120b:mxfp4:1024 2>&1 | tail -80 | tee -a "$sum"
stamp ncu | tee -a "$sum"
