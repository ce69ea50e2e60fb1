#!/usr/bin/env bash
# Several diagnostic variants of moeplug alone through the peer kit, one GPU call:
#   bash bench/variants.sh "ENV=V ..." "ENV=V ..." -- [kit args]
set -uo pipefail
export MOEPLUG_LIBRARY=$PWD/target/release/libmoeplug.so PYTHONUNBUFFERED=1 MOEPLUG_CACHE_DIR=/tmp/moeplug-cache
variants=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do variants+=("$1"); shift; done
shift || true
for v in "${variants[@]}"; do
  echo "=== variant: $v" | tee -a "${OUT:-/tmp}/variants.log"
  env $v timeout 150 python3 .peers/bench_peer.py --peers moeplug --budget-s 120 "$@" 2>&1 \
    | sed -n '/^case /,$p' | awk '{print $1, $2, $5, $8}' | tee -a "${OUT:-/tmp}/variants.log"
done
