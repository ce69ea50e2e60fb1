#!/usr/bin/env bash
# Written in session 28, whose device time ran out before it could start (the next session's
# first GPU call). Carry target/release/libmoeplug.so, target/release/moeplug and .peers. The
# library is byte-identical to 96716f8's (call 49's stream loop change was refuted and
# reverted). In order:
#  1. where the gpt-oss MXFP4 stream step stalls, per SASS instruction (ncu source counters,
#     stage 1 at M = 64 and 256). Session 27 read "long scoreboard 1.74 per issue" at M = 256
#     and call 49 found that 4-9 % fewer issued instructions do not pay. The question: are the
#     long-scoreboard samples on the consumers of the weight packs (loaded one step ahead from
#     DRAM) or of the activation packs (loaded in the step, from the L1 / L2)? If the latter,
#     staging the tile's activation rows in shared memory once per block is the next build
#     (46 KiB per block for 8 tokens x K 2880, two blocks per SM fit);
#  2. one round, gpt-oss MXFP4 at M = 256 / 512 (8 / 16 pairs per expert, on stream): [0] as
#     chosen against [1] the wgmma family (its swap-AB kernel, 64-row token tiles), which
#     takes over from 32 pairs, a threshold measured on an older wgmma kernel (sessions
#     12-13). Predicted: [1] slower at both (~1.3x at 256, ~1.1x at 512): the swap kernel
#     decodes each weight once per tile as stream does, and at M = 1024 it takes 1108 µs for
#     the bytes that stream reads in 793 at M = 256;
#  3. the kit on the final kernels: the table of record.
source "$(dirname "$0")/dev_common.sh"
for m in 64 256; do
  TOP=60 NCU_KERNEL=moe_stage1 bash bench/ncu_source.sh "gpt-oss-120b:mxfp4:$m"
  mv "$OUT/ncu_source.txt" "$OUT/ncu_source_mxfp4_$m.txt"
  stamp "ncu_source M=$m" | tee -a "$sum"
done
ROUNDS=1 AB_TIMEOUT=60 OUT=/tmp/ab1 bash bench/ab.sh "" "MOEPLUG_GPU_FAMILY=wgmma" \
  -- --cases gptoss_mxfp4 --ms 256,512 2>&1 | tail -4 | tee -a "$sum"
stamp ab | tee -a "$sum"
KIT_TIMEOUT=170 kit_summary
