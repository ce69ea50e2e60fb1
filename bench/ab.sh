#!/usr/bin/env bash
# A/B of environment variants of moeplug alone through the peer kit, repeated and interleaved
# (v1 v2 ... v1 v2 ...) so that drift between runs lands on every variant alike, one GPU call:
#   ROUNDS=3 bash bench/ab.sh "ENV=V ..." "ENV=V ..." -- [kit args]
# Prints per (case, M) each variant's median graph time over the rounds, its spread
# (max / min - 1) and its ratio to the first variant (bench/ab_summary.py). A difference below
# the spreads is not a result.
set -uo pipefail
export MOEPLUG_LIBRARY=$PWD/target/release/libmoeplug.so PYTHONUNBUFFERED=1 MOEPLUG_CACHE_DIR=/tmp/moeplug-cache
out=${OUT:-/tmp/ab}
mkdir -p "$out"
rm -f "$out"/ab_*_*.json "$out"/ab_*_*.log  # a previous A/B in the same folder is not this one
variants=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do variants+=("$1"); shift; done
shift || true
for r in $(seq 1 "${ROUNDS:-3}"); do
  for i in "${!variants[@]}"; do
    echo "=== round $r variant $i: ${variants[$i]}"
    env ${variants[$i]} timeout "${AB_TIMEOUT:-150}" python3 .peers/bench_peer.py --peers moeplug \
      --budget-s $(( ${AB_TIMEOUT:-150} - 30 )) --json-out "$out/ab_${i}_$r.json" "$@" \
      >"$out/ab_${i}_$r.log" 2>&1 || echo "    variant $i round $r: rc=$? (see $out/ab_${i}_$r.log)"
  done
done
python3 "$(dirname "$0")/ab_summary.py" "$out" "${variants[@]}"
