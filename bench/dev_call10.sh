#!/usr/bin/env bash
# GPU calls of session 10, one per argument:
#   suite: the whole GPU suite (8 processes) and the kit with peers on target/release
#   ab:    A/B of the stream family's K split and of target/v3 (fp8 block scales one step
#          ahead), the wgmma / stream crossover of fp8 block-128 at M = 256 / 512, and ncu
#          stall reasons of Qwen3 fp8 block-128 at M = 64
#   splitk: each stream stage's K split on its own, M = 1-256
#   final: suite, kit, and the new K split against target/old at M = 2, 16, 32, 128
#   mxfp4: the fill-every-slot rule for MXFP4 against target/fit1 at M = 1, 2, 4
source "$(dirname "$0")/dev_common.sh"
case ${1:-suite} in
suite)
  suite_and_kit
  ;;
ab)
  ROUNDS=2 AB_TIMEOUT=100 bash bench/ab.sh "" "MOEPLUG_STREAM_SPLIT_K=4" "MOEPLUG_STREAM_SPLIT_K=2" \
    "MOEPLUG_LIBRARY=$PWD/target/v3/libmoeplug.so" -- --ms 1,8,64 2>&1 | tail -45
  stamp ab
  ROUNDS=1 AB_TIMEOUT=80 bash bench/ab.sh "MOEPLUG_GPU_FAMILY=stream" "MOEPLUG_GPU_FAMILY=wgmma" -- \
    --cases dsv3_fp8blk,qwen3_fp8blk --ms 256,512 2>&1 | tail -12
  stamp crossover
  NCU_WHAT=breakdown BENCH_ACT=fp8_block128 NCU_LINES=80 \
    NCU_GREP='moe_stage|Duration|stalled|dram__bytes_read|pipe_tensor' \
    bash bench/ncu_profile.sh qwen3-30b-a3b:fp8_block128:64
  stamp ncu
  ;;
splitk)
  # Each stage's K split alone (0: the heuristic's choice for the other stage).
  ROUNDS=2 AB_TIMEOUT=60 bash bench/ab.sh "" "MOEPLUG_STREAM_SPLIT_K=8,0" "MOEPLUG_STREAM_SPLIT_K=4,0" \
    "MOEPLUG_STREAM_SPLIT_K=2,0" "MOEPLUG_STREAM_SPLIT_K=1,0" "MOEPLUG_STREAM_SPLIT_K=0,8" \
    "MOEPLUG_STREAM_SPLIT_K=0,4" "MOEPLUG_STREAM_SPLIT_K=0,2" "MOEPLUG_STREAM_SPLIT_K=0,1" -- \
    --ms 1,8,64,256 2>&1 | tail -32
  stamp splitk
  ;;
final)
  # The fitted K split: whole suite, kit with peers, and an A/B against the previous split
  # (target/old) at M the fit never saw.
  suite_and_kit
  ROUNDS=2 AB_TIMEOUT=60 bash bench/ab.sh "MOEPLUG_LIBRARY=$PWD/target/old/libmoeplug.so" "" -- \
    --ms 2,16,32,128 2>&1 | tail -22
  stamp heldout
  ;;
mxfp4)
  # MXFP4 keeps every resident slot filled (target/fit1: without that rule).
  ROUNDS=3 AB_TIMEOUT=40 bash bench/ab.sh "MOEPLUG_LIBRARY=$PWD/target/fit1/libmoeplug.so" "" -- \
    --cases gptoss_mxfp4,qwen3_bf16 --ms 1,2,4 2>&1 | tail -9
  stamp mxfp4
  ;;
esac
