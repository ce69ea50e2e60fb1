#!/usr/bin/env bash
# The kit on the session's final kernels (swap-AB MXFP4 default; a block per item for 40+ K
# steps at decode too). Carry target/release/libmoeplug.so, target/release/moeplug, .peers.
source "$(dirname "$0")/dev_common.sh"
KIT_TIMEOUT=170 kit_summary
