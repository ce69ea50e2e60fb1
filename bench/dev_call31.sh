#!/usr/bin/env bash
# The next session's first GPU call (written in session 23, which had no device time left):
# the whole suite and the kit on the final commit (24fcb8a's kernels = 3f0460a's), on
# whichever card comes. Carry target/release/libmoeplug.so, target/release/moeplug, .peers.
# SUITE_TIMEOUT 300: on a cold H200 two of eight processes took 196-198 s in call 30 and one
# ran past 200 s.
source "$(dirname "$0")/dev_common.sh"
SUITE_JOBS=8 SUITE_TIMEOUT=300 bash bench/device_check.sh suite 2>&1 | grep -E '^suite|process|FAILED|ERROR' | tee -a "$sum"
rm -f "$OUT"/suite_ids.txt
# Keep the log of a process without a result line (device_check.sh says NO RESULT).
for f in "$OUT"/suite_*.log; do grep -qE " in [0-9.]+s" "$f" && rm -f "$f"; done
stamp suite | tee -a "$sum"
KIT_TIMEOUT=150 bash bench/device_check.sh kit 2>&1 | tail -34 | tee -a "$sum"
stamp kit | tee -a "$sum"
