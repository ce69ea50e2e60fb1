#!/usr/bin/env bash
# Nsight Compute over moeplug's GEMM kernels, one case per line, one GPU call:
#   bash bench/ncu_profile.sh "model:format:M" ...
# Each case runs bench/gpu_fused_moe.py with the real expert counts and profiles the stage-1
# and stage-2 kernels of the first timed launch (after the one warm-up launch). Logs to $OUT.
set -uo pipefail
export MOEPLUG_LIBRARY=${MOEPLUG_LIBRARY:-$PWD/target/release/libmoeplug.so} PYTHONUNBUFFERED=1  # a library given is kept
export MOEPLUG_CACHE_DIR=/tmp/moeplug-cache MOEPLUG_SELFTEST=0
export BENCH_E="gpt-oss-120b=128,deepseek-v3=256,qwen3-30b-a3b=128" BENCH_ITERS=1 BENCH_SETS=1
# NCU_WHAT=breakdown: which L2 / L1 sub-unit is the busy one, tensor-pipe activity and stalls
# (NCU_EXTRA: more metrics, comma-separated).
# NCU_KERNELS (regex, default moe_stage), NCU_SKIP / NCU_COUNT (launches of those kernels skipped
# and profiled, default 2 / 2): e.g. NCU_KERNELS=moe_ NCU_SKIP=6 NCU_COUNT=6 for every kernel
# of one launch that has six.
sections="--section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
  --section Occupancy --section LaunchStats --section SchedulerStats"
if [ "${NCU_WHAT:-}" = breakdown ]; then
  sections="--section SpeedOfLight --metrics breakdown:lts__throughput.avg.pct_of_peak_sustained_elapsed,\
breakdown:l1tex__throughput.avg.pct_of_peak_sustained_elapsed,\
regex:sm__pipe_tensor.*cycles_active.avg.pct_of_peak_sustained_active,\
regex:smsp__average_warps_issue_stalled_.*_per_issue_active.ratio,\
lts__t_bytes.sum.per_second,lts__t_sectors_srcunit_tex_op_read.sum,\
lts__t_requests_srcunit_tex_op_read.sum,dram__bytes_read.sum,dram__bytes_write.sum${NCU_EXTRA:+,$NCU_EXTRA}"
fi
for c in "$@"; do
  IFS=: read -r model fmt m <<<"$c"
  echo "=== $c" | tee -a "$OUT/ncu.log"
  BENCH_RUNS="$model:$fmt" BENCH_M=$m timeout ${NCU_TIMEOUT:-150} ncu --clock-control none \
    -k regex:${NCU_KERNELS:-moe_stage} --launch-skip ${NCU_SKIP:-2} --launch-count ${NCU_COUNT:-2} \
    $sections \
    python3 bench/gpu_fused_moe.py 2>&1 | tee -a "$OUT/ncu.log" \
    | grep -E "${NCU_GREP:-moe_stage|Duration|Throughput|Pipe|Registers|Achieved Occ|Theoretical Occ|Stall|L2 Hit|Eligible|Issued Warp|No Eligible|Block Limit|Dynamic Shared|One or More}" | head -${NCU_LINES:-60}
done
