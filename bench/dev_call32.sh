#!/usr/bin/env bash
# Session 24's first kernel call: the MXFP4 swap-AB kernel (MOEPLUG_WGMMA_SWAP=1,
# moe_gemm_wgmma_swap.cuh: register-operand weights on the warp-specialised kernel, 256 weight
# rows per block, 64-row tiles, 128 codes per thread per step). Carry
# target/release/libmoeplug.so, target/release/moeplug, .peers. In order:
#  1. the MXFP4 GPU tests (test_wgmma_mxfp4_ws.py runs the swap kernel against the CPU
#     backend, float64 and the tile kernel);
#  2. A/B on gpt-oss MXFP4: the tile kernel (wgmma forced) / swap (wgmma forced) / the default
#     (stream below M = 1024) at M = 256 .. 4096;
#  3. ncu of the swap kernel's stage 1 at M = 1024.
# Predicted (bench/NOTES.md, session 24): ~550 thread instructions per 128 codes against the
# tile kernel's ~900, so stage 1 at M = 1024 1.10 -> ~0.7 ms (H200) and the launch ~0.75x.
source "$(dirname "$0")/dev_common.sh"
SUITE_ARGS="-k mxfp4" SUITE_JOBS=8 SUITE_TIMEOUT=200 bash bench/device_check.sh suite 2>&1 | grep -E '^suite|process|FAILED|ERROR|Error|assert' | head -40 | tee -a "$sum"
for f in "$OUT"/suite_*.log; do grep -qE " in [0-9.]+s" "$f" && rm -f "$f"; done
rm -f "$OUT"/suite_ids.txt
stamp mx4_tests | tee -a "$sum"
OUT=/tmp/ab1 ROUNDS=2 AB_TIMEOUT=90 bash bench/ab.sh "MOEPLUG_GPU_FAMILY=wgmma" \
  "MOEPLUG_GPU_FAMILY=wgmma MOEPLUG_WGMMA_SWAP=1" "" -- --cases gptoss_mxfp4 --ms 64,256,512,1024,4096 2>&1 | tail -8 | tee -a "$sum"
stamp ab | tee -a "$sum"
MOEPLUG_GPU_FAMILY=wgmma MOEPLUG_WGMMA_SWAP=1 NCU_WHAT=breakdown NCU_KERNELS=moe_stage NCU_SKIP=0 NCU_COUNT=2 \
  NCU_TIMEOUT=100 NCU_LINES=120 NCU_GREP='moe_stage|Duration|DRAM Th|stalled|tensor|inst_executed' \
  bash bench/ncu_profile.sh gpt-oss-120b:mxfp4:1024 2>&1 \
  | grep -E 'moe_stage|Duration|tensor_cycles|inst_executed|stalled_(barrier|membar|long|short|wait|math|mio|not_sel|selected|dispatch)' | tee -a "$sum"
stamp ncu | tee -a "$sum"
