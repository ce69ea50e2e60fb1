#!/usr/bin/env bash
# The next GPU call (session 20), one call that does the most (device time is scarce). Build
# main (`cargo build --release`); carry target/release/libmoeplug.so, target/release/moeplug
# and .peers. In order, most wanted first:
#  1. the suite (tests/gpu/test_wgmma_grid.py is new: a block per work item against the
#     persistent kernel, bit for bit) on session 19's final commit;
#  2. the kit: the route kernel's quantization rewrite (DeepSeek fp8 M = 1 106 -> ~100 us
#     predicted) and the block-per-item rule (gpt-oss bf16 M = 4096 ~0.88) on the defaults;
#  3. ncu, DRAM bytes of DeepSeek fp8 M = 4096's stages under the other grid and the other tile
#     height: if a block per item or 128-row tiles (1.5 tiles per expert, not 2.5) bring
#     stage 1's 14.1 GB toward its 7.5 GB of weights, tiles read their expert's weights each
#     on their own (the L2-partition reading; bench/NOTES.md session 19);
#  4. every kernel of one DeepSeek fp8 M = 1 launch (the route kernel: 11.5 us before);
#  5. the top-k combine fused into stage 2 (no moe_reduce launch) at the stream family's
#     decode points, last measured before PDL (session 4: 3-12 % slower).
source "$(dirname "$0")/dev_common.sh"
SUITE_JOBS=8 SUITE_TIMEOUT=300 bash bench/device_check.sh suite 2>&1 | grep -E '^suite|process|FAILED|ERROR'
rm -f "$OUT"/suite_*.log "$OUT"/suite_ids.txt  # few files under $OUT, or none come back
stamp suite | tee -a "$sum"
KIT_TIMEOUT=200 bash bench/device_check.sh kit 2>&1 | grep -A40 '^case ' | tee -a "$sum"
stamp kit | tee -a "$sum"
for v in "MOEPLUG_WGMMA_PERSISTENT=1" "MOEPLUG_WGMMA_PERSISTENT=0" "MOEPLUG_WGMMA_BM=128"; do
  echo "=== $v" | tee -a "$sum"
  env $v NCU_WHAT=breakdown NCU_TIMEOUT=90 bash bench/ncu_profile.sh deepseek-v3:fp8_block128:4096 \
    2>&1 | grep -E '^  moe_stage|Duration|dram__bytes' | tee -a "$sum"
done
stamp ncu4096 | tee -a "$sum"
ncu_launch deepseek-v3:fp8_block128:1 4 90
stamp ncu | tee -a "$sum"
ROUNDS=2 AB_TIMEOUT=80 OUT=/tmp/ab bash bench/ab.sh "" "MOEPLUG_FUSED_COMBINE=1" -- \
  --cases qwen3_bf16,qwen3_fp8blk,gptoss_bf16,gptoss_mxfp4 --ms 1,8,64 2>&1 | tail -14 | tee -a "$sum"
stamp combine | tee -a "$sum"
