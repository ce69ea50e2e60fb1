#!/usr/bin/env bash
# Last GPU call of session 4: the launch-field suite on the final defaults, compute-sanitizer
# memcheck over the wgmma family's new kernels (TMA, warp-specialised, MXFP4 decode: the
# determinism tests forced onto wgmma), then the fused-combine suite with the time left.
set -uo pipefail
export MOEPLUG_LIBRARY=$PWD/target/release/libmoeplug.so MOEPLUG_CACHE_DIR=/tmp/moeplug-cache PYTHONUNBUFFERED=1
timeout 130 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_launch_fields.py 2>&1 \
  | tee $OUT/fields.log | grep -E "^FAILED|passed|failed" | tail -8
MOEPLUG_GPU_FAMILY=wgmma SAN_SELECT='test_fused_moe.py::test_deterministic' SAN_TIMEOUT=140 \
  bash bench/sanitize.sh memcheck 2>&1 | tail -8
timeout 60 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_fused_combine.py 2>&1 \
  | tee $OUT/combine.log | grep -E "^FAILED|passed|failed" | tail -5
