#!/usr/bin/env bash
# The next session's first GPU call (written in session 23, which had no device time left):
# the whole suite and the kit on the final commit (24fcb8a's kernels = 3f0460a's), on
# whichever card comes. Carry target/release/libmoeplug.so, target/release/moeplug, .peers.
# suite_summary gives each process 300 s: on a cold H200 two of eight processes took 196-198 s in call 30 and one
# ran past 200 s.
source "$(dirname "$0")/dev_common.sh"
suite_summary
kit_summary
# The decode points still over the peer on the H200 (call 30: gpt-oss bf16 M = 1 / 64, Qwen3
# fp8 M = 8 / 64): the warp-specialised kernel persistent (one block per SM walking the items,
# the default below 32 pairs per expert) against a block per item, whose blocks overlap each
# other's item boundaries (call 30's ncu: our stages at 80-81 % of the DRAM rate, the peer's
# many small blocks at 85-89 %).
OUT=/tmp/ab2 ROUNDS=2 AB_TIMEOUT=80 bash bench/ab.sh "" "MOEPLUG_WGMMA_PERSISTENT=0" \
  -- --cases gptoss_bf16,qwen3_fp8blk,qwen3_bf16 --ms 1,8,64,256 2>&1 | tail -14 | tee -a "$sum"
stamp ab_persistent | tee -a "$sum"
# The register-operand MXFP4 kernel today, the base of the next prefill kernel (NOTES, session
# 23): on 64- and 128-row tiles against the shared-memory tile kernel (last timed in session
# 12 on 64-row tiles, call 27 on 128); the wgmma family forced (M < 1024 runs stream by default).
OUT=/tmp/ab3 ROUNDS=1 AB_TIMEOUT=60 bash bench/ab.sh "MOEPLUG_GPU_FAMILY=wgmma" \
  "MOEPLUG_GPU_FAMILY=wgmma MOEPLUG_WGMMA_RS=1 MOEPLUG_WGMMA_BM=64" \
  "MOEPLUG_GPU_FAMILY=wgmma MOEPLUG_WGMMA_RS=1" -- --cases gptoss_mxfp4 --ms 256,512,1024,4096 2>&1 | tail -6 | tee -a "$sum"
stamp ab_rs | tee -a "$sum"
