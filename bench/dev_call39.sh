#!/usr/bin/env bash
# The next session's second GPU call (after dev_call38.sh; session 24 wrote both). Carry
# target/release/libmoeplug.so, target/release/moeplug, .peers. In order:
#  1. compute-sanitizer (memcheck, racecheck) over the MXFP4 launches at M = 1024 that now run
#     the swap-AB kernel (issue 10 asks the new family sanitizer clean);
#  2. where the swap-AB kernel's warps stall, per SASS instruction (stage 1, M = 1024 and 4096):
#     to test session 24's guess that a register-operand wgmma holds its warp until the tensor
#     core takes the fragment (decode and MMA add: ~2700 cycles a step on 64-row tiles, ~4000
#     on 128).
source "$(dirname "$0")/dev_common.sh"
san mem_swap memcheck SAN_SELECT='test_large_m\[.*mxfp4|test_real_shapes\[gpt-oss-120b-1024\]' SAN_TIMEOUT=300
san race_swap racecheck SAN_SELECT='test_large_m\[.*mxfp4' SAN_TIMEOUT=300
report sanitizer
for m in 1024 4096; do
  NCU_KERNEL=moe_stage1 TOP=60 bash bench/ncu_source.sh gpt-oss-120b:mxfp4:$m 2>&1 | tail -3 | tee -a "$sum"
  mv "$OUT/ncu_source.txt" "$OUT/ncu_source_$m.txt"
done
stamp ncu_source | tee -a "$sum"
