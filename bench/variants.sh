#!/usr/bin/env bash
# Several diagnostic variants of moeplug alone through the peer kit, one GPU call, one round
# each (bench/ab.sh with ROUNDS=1; set ROUNDS for repeats):
#   bash bench/variants.sh "ENV=V ..." "ENV=V ..." -- [kit args]
ROUNDS=${ROUNDS:-1} exec bash "$(dirname "$0")/ab.sh" "$@"
