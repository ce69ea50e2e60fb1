#!/usr/bin/env bash
# Session 26's kit on the final kernels. Carry target/release/libmoeplug.so,
# target/release/moeplug, .peers.
source "$(dirname "$0")/dev_common.sh"
KIT_TIMEOUT=200 kit_summary
