#!/usr/bin/env bash
# Nsight Compute over the peer's GEMM kernel and moeplug's, at one kit point, same sections:
#   bash bench/ncu_peer.sh CASE M      e.g. qwen3_bf16 4096
# Both run through the kit (.peers/bench_peer.py: same shapes and inputs); ncu profiles the
# second and third GEMM launches of each (stage 1 and stage 2 of an eager call, after one
# warm-up launch pair). What to compare: tensor-pipe activity, L2 / L1 throughput and which
# sub-unit binds, sectors per request, stall reasons, occupancy.
set -uo pipefail
export MOEPLUG_LIBRARY=$PWD/target/release/libmoeplug.so PYTHONUNBUFFERED=1
export MOEPLUG_CACHE_DIR=/tmp/moeplug-cache MOEPLUG_SELFTEST=0
case=$1 m=$2
peer=vllm-triton
[ "$case" = gptoss_mxfp4 ] && peer=triton_kernels
metrics="breakdown:lts__throughput.avg.pct_of_peak_sustained_elapsed,\
regex:sm__pipe_tensor.*cycles_active.avg.pct_of_peak_sustained_active,\
regex:smsp__average_warps_issue_stalled_.*_per_issue_active.ratio,\
lts__t_sectors_srcunit_tex_op_read.sum,lts__t_requests_srcunit_tex_op_read.sum,\
lts__t_sector_hit_rate.pct,l1tex__t_sector_hit_rate.pct,dram__bytes_read.sum,\
sm__warps_active.avg.pct_of_peak_sustained_active,launch__grid_size,launch__block_size,\
launch__registers_per_thread,launch__shared_mem_per_block_dynamic,smsp__inst_executed.sum"
# BENCH_ONLY=1: moeplug alone.
whos=("$peer" moeplug)
[ "${BENCH_ONLY:-0}" = 1 ] && whos=(moeplug)
for who in "${whos[@]}"; do
  if [ "$who" = moeplug ]; then kernels='regex:moe_stage'; else kernels='regex:(fused_moe_kernel|_matmul_ogs|matmul)'; fi
  echo "=== $who $case M=$m"
  timeout "${NCU_TIMEOUT:-150}" ncu --clock-control none -k "$kernels" --launch-skip 2 --launch-count 2 \
    --section SpeedOfLight --metrics "$metrics" \
    python3 .peers/bench_peer.py --peers "$who" --cases "$case" --ms "$m" --warmup-ms 1 --rep-ms 1 \
    --budget-s 100 2>&1 | tee "$OUT/ncu_${who}_${case}_$m.log" |
    grep -E "${NCU_GREP:-fused_moe_kernel|matmul|moe_stage|Duration|Throughput|pipe_tensor|stalled_(long|barrier|wait|math|mio|short|not_sel|lg)|sectors|requests|hit_rate|dram__bytes|warps_active|grid_size|block_size|registers|shared_mem|inst_executed}" |
    head -"${NCU_LINES:-80}"
done
