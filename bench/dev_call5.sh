#!/usr/bin/env bash
# One GPU call: the warp-specialised wgmma kernel (forced-wgmma suite subset, then moeplug alone
# at M = 1024 / 4096 with and without it) and the device-pointer tests.
set -uo pipefail
export MOEPLUG_LIBRARY=$PWD/target/release/libmoeplug.so MOEPLUG_CACHE_DIR=/tmp/moeplug-cache PYTHONUNBUFFERED=1
MOEPLUG_GPU_FAMILY=wgmma timeout 150 python3 -m pytest -x -q -p no:cacheprovider tests/gpu/test_fused_moe.py \
  -k "formats_x or large or real or determ" 2>&1 | tee $OUT/ws_suite.log | tail -15
ok=${PIPESTATUS[0]}
echo "ws subset rc=$ok"
if [ "$ok" = 0 ]; then
  bash bench/variants.sh "MOEPLUG_WGMMA_WS=1" "MOEPLUG_WGMMA_WS=0" -- --ms 1024,4096 >/dev/null 2>&1
  grep -E "=== |_bf16|_fp8|_mxfp4" $OUT/variants.log | grep -v "gpt-oss\|qwen3-\|deepseek-" | grep -E "^=== | [0-9]+\.[0-9]+ "
fi
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_bad_device_ptrs.py tests/gpu/test_prep_device.py \
  2>&1 | tee $OUT/ptr.log | tail -15
