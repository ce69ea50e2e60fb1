#!/usr/bin/env bash
# GPU calls of session 17, one per argument; each fits one 600 s call. Build main
# (`cargo build --release`), carry target/release/libmoeplug.so, target/release/moeplug, .peers.
#   check:  the whole suite and the kit with peers (PDL with early weight reads on the stream and
#           wgmma families, the default), then the A/B of the PDL modes at decode:
#           MOEPLUG_PDL=0 (plain), =wait (every kernel waits first), default (early)
#   second: after check (the stream family's early reads lost, now waits; wgmma kept early):
#           the PDL test, the kit, edges (one round) and ncu in one call
#   edges:  the decode rule's edges, wgmma against stream (M = 1-16)
source "$(dirname "$0")/dev_common.sh"
case ${1:-check} in
check)
  suite_and_kit
  ROUNDS=2 AB_TIMEOUT=55 bash bench/ab.sh "MOEPLUG_PDL=0" "MOEPLUG_PDL=wait" "" -- \
    --ms 1,8,64,256 2>&1 | tail -23 | tee -a "$sum"
  stamp pdl | tee -a "$sum"
  ;;
second)
  timeout 120 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_pdl.py 2>&1 | tail -3 | tee -a "$sum"
  stamp test_pdl | tee -a "$sum"
  KIT_TIMEOUT=120 bash bench/device_check.sh kit | tail -34 | tee -a "$sum"
  stamp kit | tee -a "$sum"
  ROUNDS=1 edges_ab
  # every kernel of the second launch (dsv3 on wgmma: six, with moe_reduce; qwen3 on stream: five)
  ncu_launch deepseek-v3:fp8_block128:1 6 100
  ncu_launch qwen3-30b-a3b:fp8_block128:8 5 100
  stamp ncu | tee -a "$sum"
  ;;
edges)
  edges_ab
  ;;
esac
