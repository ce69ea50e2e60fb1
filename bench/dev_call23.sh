#!/usr/bin/env bash
# Second GPU call of session 20. Build main (`cargo build --release`); carry
# target/release/libmoeplug.so, target/release/moeplug and .peers. In order:
#  1. the whole suite (tests/gpu/test_wgmma_ksplit.py is new; bf16 decode now splits K by
#     default; the MXFP4 stream kernel's scale offsets);
#  2. A/B of the wgmma warpgroups splitting K (default where heuristics::wgmma_ksplit says) against
#     MOEPLUG_WGMMA_KSPLIT=0 on the bf16 cases, M = 4-1024. Predicted from the wave model
#     (ncu: Qwen3 fp8 M = 8 stage 1 at 72 %, stage 2 at 68 % of the DRAM rate, gpt-oss bf16 M = 8
#     at 87 / 85 %): Qwen3 bf16 M = 8 0.85-0.90x, gpt-oss bf16 M = 8 / 64 0.93-0.97x;
#  3. fp8 block-128: the split with the fused stage-2 quantization off, against the default
#     (quantization fused, no split) and against the quantization alone off;
#  4. every kernel of Qwen3 bf16 M = 8 (split) under ncu;
#  5. the kit.
source "$(dirname "$0")/dev_common.sh"
SUITE_JOBS=8 SUITE_TIMEOUT=300 bash bench/device_check.sh suite 2>&1 | grep -E '^suite|process|FAILED|ERROR' | tee -a "$sum"
rm -f "$OUT"/suite_*.log "$OUT"/suite_ids.txt
stamp suite | tee -a "$sum"
OUT=/tmp/ab1 ROUNDS=2 AB_TIMEOUT=120 bash bench/ab.sh "" "MOEPLUG_WGMMA_KSPLIT=0" -- \
  --cases qwen3_bf16,gptoss_bf16 --ms 4,8,16,32,64,128,256,512,1024 2>&1 | tail -20 | tee -a "$sum"
stamp ksplit | tee -a "$sum"
OUT=/tmp/ab2 ROUNDS=2 AB_TIMEOUT=100 bash bench/ab.sh "" "MOEPLUG_FUSED_QUANT2=0 MOEPLUG_WGMMA_KSPLIT=1" \
  "MOEPLUG_FUSED_QUANT2=0" -- --cases qwen3_fp8blk,dsv3_fp8blk --ms 8,16,64,256 2>&1 | tail -11 | tee -a "$sum"
stamp fp8 | tee -a "$sum"
ncu_launch qwen3-30b-a3b:bf16:8 4 80
stamp ncu | tee -a "$sum"
KIT_TIMEOUT=200 bash bench/device_check.sh kit 2>&1 | grep -A40 '^case ' | tee -a "$sum"
stamp kit | tee -a "$sum"
