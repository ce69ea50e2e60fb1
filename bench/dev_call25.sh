#!/usr/bin/env bash
# The next GPU call (session 21), best on an H200 (issue 8 and 10's acceptance card; session
# 20 had only H100s). Build main; carry target/release/libmoeplug.so, target/release/moeplug
# and .peers. In order:
#  1. the whole suite on session 20's final commit (the K split's opt-in, the MXFP4 stream
#     scale offsets: run on the H100 in session 20, not yet on an H200);
#  2. the kit: the H200 table for session 20's defaults (H100: MXFP4 M = 256 1.22 -> 1.13);
#  3. the K split's A/B on the H200 (H100: 0.99-1.06x; opt-in stays unless the H200 differs);
#  4. gpt-oss bf16 M = 8 per kernel (H100: stages at 87 / 85 % of the DRAM rate alone).
source "$(dirname "$0")/dev_common.sh"
SUITE_JOBS=8 SUITE_TIMEOUT=300 bash bench/device_check.sh suite 2>&1 | grep -E '^suite|process|FAILED|ERROR' | tee -a "$sum"
rm -f "$OUT"/suite_*.log "$OUT"/suite_ids.txt
stamp suite | tee -a "$sum"
KIT_TIMEOUT=200 bash bench/device_check.sh kit 2>&1 | grep -A40 '^case ' | tee -a "$sum"
stamp kit | tee -a "$sum"
OUT=/tmp/ab1 ROUNDS=2 AB_TIMEOUT=120 bash bench/ab.sh "" "MOEPLUG_WGMMA_KSPLIT=1" -- \
  --cases qwen3_bf16,gptoss_bf16 --ms 4,8,16,64,256 2>&1 | tail -12 | tee -a "$sum"
stamp ksplit | tee -a "$sum"
ncu_launch gpt-oss-120b:bf16:8 4 80
stamp ncu | tee -a "$sum"
