#!/usr/bin/env bash
# Session 28's second GPU call: the kit on the final kernels (call 49's A/B refuted its stream
# loop change, which is reverted: the library is byte-identical to 96716f8's). Carry
# target/release/libmoeplug.so, target/release/moeplug and .peers.
source "$(dirname "$0")/dev_common.sh"
KIT_TIMEOUT=170 kit_summary
