#!/usr/bin/env bash
# Next session's first GPU call (session 27 ran out of device time before a kit on its last
# rule). Carry target/release/libmoeplug.so, target/release/moeplug and .peers. In order:
#  1. the long-K stream rule, two rounds: [0] this tree (gpt-oss bf16 M = 8-256 on the stream
#     family with two weight steps in flight) against [1] the wgmma family it replaced;
#     predicted 0.95-0.97x (call 48's one round);
#  2. memcheck over 16-bit stream launches (the suite's gpt-oss shape is MXFP4; the kit checks
#     gpt-oss bf16 on the stream family against float64), beside the whole GPU suite;
#  3. the kit (predicted gpt-oss bf16 M = 8 / 64 / 256 at ~1.00 / 0.99 / 1.00, call 47's
#     1.05 / 1.03 / 1.03; the other rows as call 47).
source "$(dirname "$0")/dev_common.sh"
ROUNDS=2 AB_TIMEOUT=90 OUT=/tmp/ab1 bash bench/ab.sh "" "MOEPLUG_GPU_FAMILY=wgmma" \
  -- --cases gptoss_bf16 --ms 8,64,256 2>&1 | tail -5 | tee -a "$sum"
stamp ab | tee -a "$sum"
san mem_stream memcheck SAN_SELECT='test_formats_x_act_dtypes\[.*bf16-bf16|test_deterministic\[.*bf16|test_expert_mask' SAN_TIMEOUT=150
SUITE_TIMEOUT=200 suite_summary
report sanitizer
rm -rf "$OUT"/mem_stream
KIT_TIMEOUT=170 kit_summary
