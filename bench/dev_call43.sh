#!/usr/bin/env bash
# Session 25's last GPU call, on its final kernels. Carry target/release/libmoeplug.so,
# target/release/moeplug, .peers. In order: memcheck / racecheck over the MXFP4 launches at
# M = 1024 (the swap-AB kernel's new decode), the whole GPU suite, the kit.
source "$(dirname "$0")/dev_common.sh"
san mem_swap memcheck SAN_SELECT='test_large_m\[.*mxfp4|test_real_shapes\[gpt-oss-120b-1024\]' SAN_TIMEOUT=200
san race_swap racecheck SAN_SELECT='test_large_m\[.*mxfp4' SAN_TIMEOUT=200
report sanitizer
rm -rf "$OUT"/mem_swap "$OUT"/race_swap
suite_summary
KIT_TIMEOUT=170 kit_summary
