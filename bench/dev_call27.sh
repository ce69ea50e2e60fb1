#!/usr/bin/env bash
# The next GPU call (sessions 21-22). Build main and target/old/libmoeplug.so (e9e7571:
# `git worktree add /tmp/wt-old e9e7571`, then `CARGO_TARGET_DIR=/tmp/old-target cargo build
# --release` there, copy the library); carry target/release/libmoeplug.so,
# target/release/moeplug, target/old/libmoeplug.so and .peers.
# What main has that no GPU has run (bench/NOTES.md, sessions 21-22): wgmma descriptors by add
# and activation copies without selects (every wgmma kernel), stage-2 partials in the output's
# 16-bit type (the wgmma family), the MXFP4 tile kernel's pack load after its fence, MXFP4 on
# the warp-specialised kernel (opt-in, MOEPLUG_WGMMA_BLOCKS=1; scales through the ring) and
# with two decoding warpgroups (MOEPLUG_WGMMA_DECODERS=2). In order:
#  1. the whole suite on the new defaults;
#  2. the MXFP4 tests on the warp-specialised kernel, then with the decoding warpgroups;
#  3. A/B: e9e7571 / main, every case at M = 64, 1024, 4096;
#  4. A/B of MXFP4: main / warp-specialised / with decoding warpgroups / register operand
#     (its pack loads now after the fence too), M = 256, 1024, 4096;
#  5. ncu (stall reasons) of MXFP4 stage 1 at M = 1024: the tile kernel, the decoders kernel.
source "$(dirname "$0")/dev_common.sh"
SUITE_JOBS=8 SUITE_TIMEOUT=240 bash bench/device_check.sh suite 2>&1 | grep -E '^suite|process|FAILED|ERROR' | tee -a "$sum"
rm -f "$OUT"/suite_*.log "$OUT"/suite_ids.txt
stamp suite | tee -a "$sum"
for v in "MOEPLUG_WGMMA_BLOCKS=1" "MOEPLUG_WGMMA_BLOCKS=1 MOEPLUG_WGMMA_DECODERS=2"; do
  env $v SUITE_ARGS="-k mxfp4" SUITE_JOBS=8 SUITE_TIMEOUT=120 bash bench/device_check.sh suite 2>&1 | grep -E '^suite|process|FAILED|ERROR' | tee -a "$sum"
  rm -f "$OUT"/suite_*.log "$OUT"/suite_ids.txt
  stamp "mx4 tests: $v" | tee -a "$sum"
done
OUT=/tmp/ab1 ROUNDS=2 AB_TIMEOUT=100 bash bench/ab.sh \
  "MOEPLUG_LIBRARY=$PWD/target/old/libmoeplug.so MOEPLUG_CACHE_DIR=/tmp/c-old" "" \
  -- --ms 64,1024,4096 2>&1 | tail -17 | tee -a "$sum"
stamp ab | tee -a "$sum"
OUT=/tmp/ab2 ROUNDS=2 AB_TIMEOUT=80 bash bench/ab.sh "" "MOEPLUG_WGMMA_BLOCKS=1" \
  "MOEPLUG_WGMMA_BLOCKS=1 MOEPLUG_WGMMA_DECODERS=2" "MOEPLUG_WGMMA_RS=1" -- --cases gptoss_mxfp4 \
  --ms 256,1024,4096 \
  2>&1 | tail -5 | tee -a "$sum"
stamp ab_mx4 | tee -a "$sum"
for v in "" "MOEPLUG_WGMMA_BLOCKS=1 MOEPLUG_WGMMA_DECODERS=2"; do
  env $v NCU_WHAT=breakdown NCU_KERNELS=moe_stage1 NCU_SKIP=1 NCU_COUNT=1 NCU_TIMEOUT=100 NCU_LINES=80 \
    NCU_GREP='moe_stage|Duration|DRAM Th|stalled|tensor' bash bench/ncu_profile.sh gpt-oss-120b:mxfp4:1024 2>&1 \
    | grep -E 'moe_stage|Duration|tensor|stalled_(barrier|membar|long|short|wait|math|mio|lg|not_sel|selected|dispatch|no_inst|branch|sleeping|drain|tex)' | tee -a "$sum"
  stamp "ncu: $v" | tee -a "$sum"
done
