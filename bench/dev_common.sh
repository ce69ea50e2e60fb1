# Shared by the per-session GPU call scripts (bench/dev_call*.sh): sourced, not run.
set -uo pipefail
export MOEPLUG_CACHE_DIR=/tmp/moeplug-cache PYTHONUNBUFFERED=1
t0=$(date +%s)
stamp() { echo "--- $1 at $(($(date +%s) - t0)) s"; }
# The whole GPU suite (8 processes), then the kit with peers, on target/release.
suite_and_kit() {
  SUITE_JOBS=8 SUITE_TIMEOUT=330 bash bench/device_check.sh suite
  stamp suite
  KIT_TIMEOUT=200 bash bench/device_check.sh kit
  stamp kit
}
sum=$OUT/summary.txt
# The whole GPU suite in 8 processes (SUITE_TIMEOUT s each, default 300) into the summary,
# keeping only the logs of processes without a result line (device_check.sh: NO RESULT), so
# that what comes back stays under the transfer limit.
suite_summary() {
  SUITE_JOBS=8 SUITE_TIMEOUT=${SUITE_TIMEOUT:-300} bash bench/device_check.sh suite 2>&1 \
    | grep -E '^suite|process|FAILED|ERROR' | tee -a "$sum"
  rm -f "$OUT"/suite_ids.txt
  for f in "$OUT"/suite_*.log; do grep -qE " in [0-9.]+s" "$f" && rm -f "$f"; done
  stamp suite | tee -a "$sum"
}
# The MXFP4 warp-specialised tests alone (test_wgmma_mxfp4_ws.py: every MXFP4 wgmma kernel
# against the CPU backend and the tile kernel) into the summary.
mx4_ws_tests() {
  SUITE_ARGS="-k mxfp4_ws" SUITE_JOBS=1 SUITE_TIMEOUT=200 bash bench/device_check.sh suite 2>&1 \
    | grep -E '^suite|process|FAILED|Error|assert' | head -20 | tee -a "$sum"
  tail -2 "$OUT"/suite*.log | tee -a "$sum"
  rm -f "$OUT"/suite*
  stamp mx4_tests | tee -a "$sum"
}
# The kit with peers (KIT_TIMEOUT s, default 150): its summary table into the summary.
kit_summary() {
  KIT_TIMEOUT=${KIT_TIMEOUT:-150} bash bench/device_check.sh kit 2>&1 | tail -34 | tee -a "$sum"
  stamp kit | tee -a "$sum"
}
# One sanitizer run in its own OUT folder, in the background; its report goes to $OUT/<name>.txt.
san() {  # name, tool, env...
  local name=$1 tool=$2
  shift 2
  (env OUT="$OUT/$name" "$@" bash bench/sanitize.sh "$tool" 2>&1 | grep -v "^===" >"$OUT/$name.txt") &
}
# After the runs: every run's report into the summary.
report() {
  wait
  for f in "$OUT"/*.txt; do [ "$f" = "$sum" ] || grep -v "^--- .* at " "$f"; done | tee -a "$sum"
  stamp "$1" | tee -a "$sum"
}
# The decode rule's edges: wgmma against stream at M = 1-16 (both forced), ROUNDS rounds.
edges_ab() {
  ROUNDS=${ROUNDS:-2} AB_TIMEOUT=80 bash bench/ab.sh "MOEPLUG_GPU_FAMILY=stream" \
    "MOEPLUG_GPU_FAMILY=wgmma" -- --cases qwen3_bf16,dsv3_fp8blk,qwen3_fp8blk,gptoss_bf16 \
    --ms 1,2,4,8,16 2>&1 | tail -22 | tee -a "$sum"
  stamp edges | tee -a "$sum"
}
# Every kernel of one launch under ncu (duration, DRAM rate): case "model:format:M", the
# launch's kernel count, and the seconds ncu may take.
ncu_launch() {  # case, kernels, timeout
  NCU_KERNELS=moe_ NCU_SKIP=$2 NCU_COUNT=$2 NCU_TIMEOUT=$3 NCU_LINES=60 \
    NCU_GREP='  moe_|Duration|DRAM Throughput|Memory Throughput' \
    bash bench/ncu_profile.sh "$1" 2>&1 | tail -60 | tee -a "$sum"
}
# Pipe utilisation and stalls of one launch's stage 1 (the first timed one): case
# "model:format:M", then the lines kept (default 60). Pass MOEPLUG_LIBRARY to profile another
# library (ncu_profile.sh keeps it).
ncu_pipes() {  # case, lines
  NCU_WHAT=breakdown NCU_SKIP=1 NCU_COUNT=1 NCU_KERNELS=moe_stage1 \
    NCU_EXTRA="regex:sm__inst_executed_pipe_.*.avg.pct_of_peak_sustained_active,regex:sm__pipe_(tensor|shared).*cycles_active.avg.pct_of_peak_sustained_active" \
    NCU_GREP="Duration|pipe|stalled|lts__t_bytes|dram__bytes|l1tex__throughput|lts__throughput" \
    NCU_LINES=120 bash bench/ncu_profile.sh "$1" 2>&1 | grep -v " 0$" | head -"${2:-60}" | tee -a "$sum"
}
# gpt-oss MXFP4 decode: an A/B of the variants given (env strings, the first the base) at
# M = 1 / 8 / 64 / 256, ROUNDS rounds (default 2), into the summary.
mxfp4_ab() {
  ROUNDS=${ROUNDS:-2} AB_TIMEOUT=${AB_TIMEOUT:-60} OUT=/tmp/ab1 bash bench/ab.sh "$@" \
    -- --cases gptoss_mxfp4 --ms 1,8,64,256 2>&1 | tail -6 | tee -a "$sum"
  stamp ab_mxfp4 | tee -a "$sum"
}
# gpt-oss MXFP4 at M = 256 / 512, one round: as chosen (stream) against the wgmma family.
mxfp4_wgmma_check() {
  ROUNDS=1 AB_TIMEOUT=60 OUT=/tmp/ab2 bash bench/ab.sh "" "MOEPLUG_GPU_FAMILY=wgmma" \
    -- --cases gptoss_mxfp4 --ms 256,512 2>&1 | tail -4 | tee -a "$sum"
  stamp ab_wgmma | tee -a "$sum"
}
# Where the gpt-oss MXFP4 stream stage 1 stalls at M = 256 (ncu source counters).
mxfp4_ncu_stage1() {
  TOP=60 NCU_KERNEL=moe_stage1 bash bench/ncu_source.sh "gpt-oss-120b:mxfp4:256"
  mv "$OUT/ncu_source.txt" "$OUT/ncu_source_mxfp4_256.txt"
  stamp "ncu_source" | tee -a "$sum"
}
