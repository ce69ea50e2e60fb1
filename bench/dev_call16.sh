#!/usr/bin/env bash
# GPU calls prepared at the end of session 16 (its device budget went on refused starts), one
# per argument; each fits one 600 s call. Build main (`cargo build --release`), carry
# target/release/libmoeplug.so, target/release/moeplug and .peers.
#   check:  the whole suite and the kit with peers on the decode rule of 0bd76f3 (never run on
#           the GPU: bench/NOTES.md session 16 has its predicted kit), then the A/B of the
#           grouped work order on 64-row tiles (16 tiles spans the rows 8 did on 128-row tiles)
#   edges:  the decode rule's two misses and its edges, wgmma against stream (M = 1-16)
#   ncu:    where DeepSeek fp8 at M = 1 and Qwen3 fp8 at M = 8 spend their time (per kernel)
source "$(dirname "$0")/dev_common.sh"
case ${1:-check} in
check)
  suite_and_kit
  ROUNDS=1 AB_TIMEOUT=60 bash bench/ab.sh "" "MOEPLUG_WGMMA_GROUP=16" "MOEPLUG_WGMMA_GROUP=0" -- \
    --cases qwen3_bf16,dsv3_fp8blk,qwen3_fp8blk,gptoss_bf16 --ms 256,1024,4096 2>&1 |
    tail -13 | tee -a "$sum"
  stamp groups | tee -a "$sum"
  ;;
edges)
  ROUNDS=2 AB_TIMEOUT=80 bash bench/ab.sh "MOEPLUG_GPU_FAMILY=stream" "MOEPLUG_GPU_FAMILY=wgmma" -- \
    --cases qwen3_bf16,dsv3_fp8blk,qwen3_fp8blk,gptoss_bf16 --ms 1,2,4,8,16 2>&1 |
    tail -22 | tee -a "$sum"
  stamp edges | tee -a "$sum"
  ;;
ncu)
  NCU_WHAT=breakdown NCU_TIMEOUT=260 NCU_LINES=80 \
    NCU_GREP='moe_|Duration|dram__bytes|dram__throughput' \
    bash bench/ncu_profile.sh deepseek-v3:fp8_block128:1 qwen3-30b-a3b:fp8_block128:8 2>&1 |
    tee -a "$sum"
  stamp ncu | tee -a "$sum"
  ;;
esac
