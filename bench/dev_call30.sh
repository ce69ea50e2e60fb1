#!/usr/bin/env bash
# Session 23's first measuring call. Carry target/release/libmoeplug.so,
# target/release/moeplug, target/old/libmoeplug.so (the library before the change) and .peers.
#  1. the whole GPU suite on the change (128-row wgmma tiles whose second warpgroup has no
#     rows copy only rows 0..63);
#  2. the kit with peers;
#  3. A/B, the library before the change against after, at M = 1024 / 4096;
#  4. ncu, the peer's kernels next to ours: gpt-oss bf16 M = 8 (stage times and DRAM rates:
#     ours were 87 / 85 % of the H100's DRAM rate alone) and gpt-oss MXFP4 M = 1024
#     (instructions, tensor pipe, stalls).
# Predicted (bench/NOTES.md, session 23): MXFP4 M = 1024 0.97-0.99x (the copies skipped are
# predicated, not branched: no issue slot saved, only the LSU's zero fills), others ±1 %.
source "$(dirname "$0")/dev_common.sh"
SUITE_JOBS=8 SUITE_TIMEOUT=200 bash bench/device_check.sh suite 2>&1 | grep -E '^suite|process|FAILED|ERROR' | tee -a "$sum"
rm -f "$OUT"/suite_*.log "$OUT"/suite_ids.txt
stamp suite | tee -a "$sum"
KIT_TIMEOUT=150 bash bench/device_check.sh kit 2>&1 | tail -34 | tee -a "$sum"
stamp kit | tee -a "$sum"
OUT=/tmp/ab1 ROUNDS=2 AB_TIMEOUT=60 bash bench/ab.sh "MOEPLUG_LIBRARY=$PWD/target/old/libmoeplug.so" "" \
  -- --cases gptoss_mxfp4,qwen3_bf16,gptoss_bf16 --ms 1024,4096 2>&1 | tail -8 | tee -a "$sum"
stamp ab | tee -a "$sum"
NCU_TIMEOUT=120 bash bench/ncu_peer.sh gptoss_bf16 8 2>&1 | tee -a "$sum"
stamp ncu_bf16 | tee -a "$sum"
NCU_TIMEOUT=150 bash bench/ncu_peer.sh gptoss_mxfp4 1024 2>&1 | tee -a "$sum"
stamp ncu_mx4 | tee -a "$sum"
