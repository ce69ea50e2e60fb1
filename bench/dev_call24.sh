#!/usr/bin/env bash
# Third GPU call of session 20 (what is left of the budget). Build main; carry
# target/release/libmoeplug.so, target/release/moeplug and .peers.
#  1. the K-split fix: each warpgroup owns every other stage of an even ring (call 23's split
#     alternated steps over a 7-stage ring: a warpgroup could wait on a stage two phases ahead,
#     and the kit's launches failed); the tests that run it and the MXFP4 ones;
#  2. A/B of the split (default) against MOEPLUG_WGMMA_KSPLIT=0, bf16 cases, M = 4-1024;
#  3. the kit.
source "$(dirname "$0")/dev_common.sh"
export MOEPLUG_LIBRARY=$PWD/target/release/libmoeplug.so
pt() { timeout 220 python3 -m pytest -q -p no:cacheprovider -rf "$@" 2>&1 | grep -E "passed|failed|^FAILED|^ERROR" | tail -6; }
pt tests/gpu/test_wgmma_ksplit.py tests/gpu/test_fused_quant.py tests/gpu/test_wgmma_grid.py >/tmp/t1.txt &
pt tests/gpu -k mxfp4 >/tmp/t2.txt &
pt tests/gpu/test_selftest.py tests/gpu/test_fused_moe.py -k "selftest or real_shapes" >/tmp/t3.txt &
wait
cat /tmp/t1.txt /tmp/t2.txt /tmp/t3.txt | tee -a "$sum"
rm -f "$OUT"/suite_*.log "$OUT"/suite_ids.txt
stamp tests | tee -a "$sum"
OUT=/tmp/ab1 ROUNDS=2 AB_TIMEOUT=120 bash bench/ab.sh "MOEPLUG_WGMMA_KSPLIT=0" "" -- \
  --cases qwen3_bf16,gptoss_bf16 --ms 4,8,16,32,64,128,256,512,1024 2>&1 | tail -20 | tee -a "$sum"
stamp ksplit | tee -a "$sum"
KIT_TIMEOUT=200 bash bench/device_check.sh kit 2>&1 | grep -A40 '^case ' | tee -a "$sum"
stamp kit | tee -a "$sum"
