#!/usr/bin/env bash
# GPU call of session 20 (device time is scarce: one call does it all). Build main
# (`cargo build --release`) and c7491c4 into target/old/libmoeplug.so; carry both,
# target/release/moeplug and .peers. In order, most wanted first:
#  1. the MXFP4 tests (every family) on the stream kernel's split scale offsets;
#  2. A/B MXFP4 at M = 1-256: c7491c4 against main (the scale offset's row part once per block:
#     two-column-tile steps 573 -> 508 instructions, one-column 440 -> 425; predicted, if the
#     decode is issue-bound, M = 256 0.90-0.93x, M = 8-64 0.97-0.99x);
#  3. A/B of the wgmma column block at decode, where a persistent launch has few items per SM
#     (Qwen3 bf16 M = 8: stage 2 has ~400 items of N = 256 on 132 SMs, 3.03 waves -> 4): bf16
#     N = 128 against the default 256, fp8 N = 256 against the default 128;
#  4. every kernel of one launch under ncu: Qwen3 fp8 M = 8, gpt-oss bf16 M = 8, MXFP4 M = 256;
#  5. the kit.
source "$(dirname "$0")/dev_common.sh"
SUITE_JOBS=4 SUITE_TIMEOUT=200 SUITE_ARGS="-k mxfp4" bash bench/device_check.sh suite 2>&1 | grep -E '^suite|process|FAILED|ERROR'
rm -f "$OUT"/suite_*.log "$OUT"/suite_ids.txt
stamp tests | tee -a "$sum"
OUT=/tmp/ab1 ROUNDS=2 AB_TIMEOUT=90 bash bench/ab.sh \
  "MOEPLUG_LIBRARY=$PWD/target/old/libmoeplug.so MOEPLUG_CACHE_DIR=/tmp/c-old" "" -- \
  --cases gptoss_mxfp4 --ms 1,8,64,256,512 2>&1 | tail -7 | tee -a "$sum"
stamp mxfp4 | tee -a "$sum"
OUT=/tmp/ab2 ROUNDS=2 AB_TIMEOUT=100 bash bench/ab.sh "" "MOEPLUG_WGMMA_N=128" -- \
  --cases qwen3_bf16,gptoss_bf16 --ms 8,16,32,64,128,256 2>&1 | tail -14 | tee -a "$sum"
OUT=/tmp/ab3 ROUNDS=2 AB_TIMEOUT=100 bash bench/ab.sh "" "MOEPLUG_WGMMA_N=256" -- \
  --cases qwen3_fp8blk,dsv3_fp8blk --ms 8,16,64,256 2>&1 | tail -10 | tee -a "$sum"
stamp wgmma_n | tee -a "$sum"
ncu_launch qwen3-30b-a3b:fp8_block128:8 4 80
ncu_launch gpt-oss-120b:bf16:8 4 80
ncu_launch gpt-oss-120b:mxfp4:256 4 80
stamp ncu | tee -a "$sum"
KIT_TIMEOUT=200 bash bench/device_check.sh kit 2>&1 | grep -A40 '^case ' | tee -a "$sum"
stamp kit | tee -a "$sum"
