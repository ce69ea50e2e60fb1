#!/usr/bin/env bash
# One GPU call for the stream family's L2 prefetch (MOEPLUG_STREAM_PREFETCH, bench/NOTES.md
# session 6): the decode suite on two prefetch settings (correctness first), then moeplug alone
# through the kit on every setting, decode points only.
#   bash bench/prefetch_ab.sh [kit args...]     (default: the decode cases, M = 1, 8, 64, 256)
set -uo pipefail
export MOEPLUG_LIBRARY=$PWD/target/release/libmoeplug.so MOEPLUG_CACHE_DIR=/tmp/moeplug-cache PYTHONUNBUFFERED=1
for pf in 2 tile; do
  MOEPLUG_STREAM_PREFETCH=$pf timeout 90 python3 -m pytest -q -p no:cacheprovider \
    tests/gpu/test_fused_moe.py -k "deterministic or formats_x" 2>&1 \
    | tee "$OUT/suite_pf_$pf.log" | grep -E "^FAILED|passed|failed" | tail -6
done
[ $# -gt 0 ] || set -- --ms 1,8,64,256
bash bench/variants.sh "MOEPLUG_STREAM_PREFETCH=0" "MOEPLUG_STREAM_PREFETCH=2" \
  "MOEPLUG_STREAM_PREFETCH=4" "MOEPLUG_STREAM_PREFETCH=tile" \
  "MOEPLUG_STREAM_PREFETCH=4 MOEPLUG_STREAM_BM=32" -- "$@"
