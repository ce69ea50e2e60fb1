#!/usr/bin/env bash
# GPU calls of session 11, one per argument:
#   ab:    the wgmma family's grouped work order (MOEPLUG_WGMMA_GROUP) at M = 1024 / 4096 with
#          the wgmma tests under group 8; the stream / tile32 / wgmma crossovers at M = 256-1024
#          with the fitted K split; the stream L2 prefetch at M = 1-256 with the longer walks
#   ncu:   Nsight Compute of the peer's GEMM kernel and ours at M = 4096 (bench/ncu_peer.sh)
#   suite: the whole GPU suite (8 processes) and the kit with peers on target/release
set -uo pipefail
export MOEPLUG_CACHE_DIR=/tmp/moeplug-cache PYTHONUNBUFFERED=1
t0=$(date +%s)
stamp() { echo "--- $1 at $(( $(date +%s) - t0 )) s"; }
case ${1:-suite} in
ab)
  ROUNDS=2 AB_TIMEOUT=45 bash bench/ab.sh "" "MOEPLUG_WGMMA_GROUP=4" "MOEPLUG_WGMMA_GROUP=8" \
    "MOEPLUG_WGMMA_GROUP=16" -- --ms 1024,4096 2>&1 | tail -12
  stamp group
  MOEPLUG_GPU_FAMILY=wgmma MOEPLUG_WGMMA_GROUP=8 MOEPLUG_LIBRARY=$PWD/target/release/libmoeplug.so \
    timeout 90 python3 -m pytest -q -p no:cacheprovider -x tests/gpu/test_fused_moe.py \
    -k "deterministic or formats_x or real_shapes" 2>&1 | tail -3
  stamp group-tests
  ROUNDS=1 AB_TIMEOUT=45 bash bench/ab.sh "" "MOEPLUG_GPU_FAMILY=stream" \
    "MOEPLUG_GPU_FAMILY=stream MOEPLUG_STREAM_BM=32" "MOEPLUG_GPU_FAMILY=wgmma" -- \
    --ms 256,512,1024 2>&1 | tail -17
  stamp crossover
  ROUNDS=2 AB_TIMEOUT=35 bash bench/ab.sh "" "MOEPLUG_STREAM_PREFETCH=2" "MOEPLUG_STREAM_PREFETCH=4" -- \
    --ms 1,8,64,256 2>&1 | tail -22
  stamp prefetch
  ;;
ncu)
  # The peer's kernel next to ours at the prefill points (issue 10): what differs.
  bash bench/ncu_peer.sh qwen3_bf16 4096
  stamp ncu-qwen3
  NCU_LINES=50 bash bench/ncu_peer.sh dsv3_fp8blk 4096
  stamp ncu-dsv3
  ;;
suite)
  SUITE_JOBS=8 SUITE_TIMEOUT=330 bash bench/device_check.sh suite
  stamp suite
  KIT_TIMEOUT=200 bash bench/device_check.sh kit
  stamp kit
  ;;
esac
