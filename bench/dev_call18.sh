#!/usr/bin/env bash
# GPU calls prepared at the end of session 17 (its device went after one call), one per
# argument; each fits one 600 s call. Build main (`cargo build --release`), carry
# target/release/libmoeplug.so, target/release/moeplug and .peers.
#   check:  the whole suite (tests/gpu/test_fused_quant.py is new) and the kit with peers on
#           main, then the A/B of session 17's two opt-ins on the fp8 cases, M = 1-4096:
#           default, MOEPLUG_ROUTE_QUANT1=1, both with MOEPLUG_FUSED_QUANT2=1
#   edges:  the decode rule's edges after its byte threshold went to 192 MiB (Qwen3 fp8 at
#           M = 8 now on wgmma, predicted ~0.95x stream's time), wgmma against stream
#   ncu:    every kernel of one launch (duration, DRAM bytes and rate): DeepSeek fp8 M = 1
#           (wgmma, six kernels) and Qwen3 fp8 M = 1 (stream, five)
#   stall:  DeepSeek fp8 M = 1's two wgmma stages: tensor-pipe activity and stall reasons (is
#           the swap-AB decode step of bench/NOTES.md session 17 worth building?)
source "$(dirname "$0")/dev_common.sh"
case ${1:-check} in
check)
  suite_and_kit
  ROUNDS=2 AB_TIMEOUT=70 bash bench/ab.sh "" "MOEPLUG_ROUTE_QUANT1=1" \
    "MOEPLUG_ROUTE_QUANT1=1 MOEPLUG_FUSED_QUANT2=1" -- \
    --cases dsv3_fp8blk,qwen3_fp8blk --ms 1,8,64,256,1024,4096 2>&1 | tail -15 | tee -a "$sum"
  stamp quant | tee -a "$sum"
  ;;
edges)
  edges_ab
  ;;
ncu)
  ncu_launch deepseek-v3:fp8_block128:1 6 150
  ncu_launch qwen3-30b-a3b:fp8_block128:1 5 150
  stamp ncu | tee -a "$sum"
  ;;
stall)
  NCU_WHAT=breakdown NCU_TIMEOUT=300 NCU_LINES=80 \
    NCU_GREP='moe_stage|Duration|tensor|stalled_(long|barrier|wait|math|mio|short|lg)|dram__bytes_read' \
    bash bench/ncu_profile.sh deepseek-v3:fp8_block128:1 2>&1 | tail -80 | tee -a "$sum"
  stamp stall | tee -a "$sum"
  ;;
esac
