#!/usr/bin/env bash
# dev_call51 trimmed to the device time left in session 29 (~400 s after eleven failed or
# refused starts): the X_SHARED A/B, the MXFP4 GPU tests with it on, then the kit with it on
# for whatever time is left. Carry target/release/libmoeplug.so, target/release/moeplug, .peers.
source "$(dirname "$0")/dev_common.sh"
AB_TIMEOUT=50 mxfp4_ab "" "MOEPLUG_STREAM_X_SHARED=1"
MOEPLUG_STREAM_X_SHARED=1 SUITE_ARGS="-k mxfp4" SUITE_TIMEOUT=90 suite_summary
MOEPLUG_STREAM_X_SHARED=1 KIT_TIMEOUT=120 kit_summary
