#!/usr/bin/env bash
# GPU calls prepared in session 15 (no device was lent that session), one per argument; each
# fits one 600 s call. Build with bench/patches/stream-fp8-wgmma.patch applied (both opt-ins in
# one library):
#   first: the GPU tests of both opt-ins (the fp8 stream step on wgmma, MOEPLUG_STREAM_WGMMA=1;
#          64-row wgmma tiles on the TMA kernels, MOEPLUG_WGMMA_BM=64), then the A/B of the
#          fp8 stream step against the default at M = 1-256 (the two fp8 cases)
#   tiles: the A/B of 64-row against 128-row wgmma tiles at M = 256-4096 (the four cases that
#          run wgmma there with TMA; MXFP4 takes neither)
#   crossover: wgmma on 64-row tiles against the default family where stream runs today
#          (8-16 pairs per expert), one round
#   ncu:   where prefill binds (bench/NOTES.md, session 15): L2 bytes per second and the
#          tensor pipe of DeepSeek-V3 fp8 at M = 4096, the stall reasons of gpt-oss MXFP4 at 1024
#   check: the whole suite and the kit with peers (after adopting what was measured)
#   san:   racecheck and memcheck over the new kernels' tests, memcheck over the default
#          wgmma kernels (their epilogues' column-pair stores)
# Carry target/release/libmoeplug.so, target/release/moeplug and .peers.
source "$(dirname "$0")/dev_common.sh"
run_tests() { # seconds, label, env, pytest args
  local secs=$1 label=$2 envs=$3
  shift 3
  env $envs MOEPLUG_LIBRARY=$PWD/target/release/libmoeplug.so timeout "$secs" python3 -m pytest \
    -q -p no:cacheprovider "$@" >"$OUT/tests_$label.log" 2>&1
  echo "tests $label [$envs]: rc=$? $(tail -1 "$OUT/tests_$label.log")" | tee -a "$sum"
  grep -E "^(FAILED|ERROR)" "$OUT/tests_$label.log" | head -5 | tee -a "$sum"
}
stream_wgmma="MOEPLUG_GPU_FAMILY=stream MOEPLUG_STREAM_WGMMA=1"
short_tiles="MOEPLUG_GPU_FAMILY=wgmma MOEPLUG_WGMMA_BM=64"
case ${1:-first} in
first)
  run_tests 110 stream_wgmma "$stream_wgmma" tests/gpu/test_fused_moe.py -k fp8
  run_tests 110 short_tiles "$short_tiles" tests/gpu/test_fused_moe.py \
    -k "deterministic or formats_x or real_shapes or large_m"
  stamp tests | tee -a "$sum"
  ROUNDS=2 AB_TIMEOUT=70 bash bench/ab.sh "" "MOEPLUG_STREAM_WGMMA=1" -- \
    --cases qwen3_fp8blk,dsv3_fp8blk --ms 1,8,64,256 2>&1 | tail -10 | tee -a "$sum"
  stamp ab | tee -a "$sum"
  ;;
tiles)
  ROUNDS=2 AB_TIMEOUT=120 bash bench/ab.sh "" "MOEPLUG_WGMMA_BM=64" -- \
    --cases qwen3_bf16,dsv3_fp8blk,qwen3_fp8blk,gptoss_bf16 --ms 256,512,1024,2048,4096 2>&1 |
    tail -22 | tee -a "$sum"
  stamp ab | tee -a "$sum"
  ;;
crossover)
  ROUNDS=1 AB_TIMEOUT=60 bash bench/ab.sh "" "MOEPLUG_GPU_FAMILY=wgmma MOEPLUG_WGMMA_BM=64" -- \
    --ms 128,256,512 2>&1 | tail -17 | tee -a "$sum"
  stamp crossover | tee -a "$sum"
  ;;
ncu)
  NCU_WHAT=breakdown NCU_TIMEOUT=260 NCU_LINES=80 \
    NCU_GREP='moe_stage|Duration|lts__t_bytes|lts__throughput|pipe_tensor|dram__bytes|stalled_(long|wait|barrier|math|short|mio|no_inst)' \
    bash bench/ncu_profile.sh deepseek-v3:fp8_block128:4096 gpt-oss-120b:mxfp4:1024 2>&1 |
    tee -a "$sum"
  stamp ncu | tee -a "$sum"
  ;;
check)
  suite_and_kit
  ;;
san)
  # The new kernels under racecheck and memcheck: each opt-in's deterministic and large-M
  # tests (every format it takes), two sanitizers of each tool at once.
  for tool in racecheck memcheck; do
    san "${tool}_stream_wgmma" "$tool" MOEPLUG_GPU_FAMILY=stream MOEPLUG_STREAM_WGMMA=1 \
      SAN_SELECT='test_fused_moe\.py::test_(deterministic|large_m).*fp8' SAN_TIMEOUT=${T:-500}
    san "${tool}_short_tiles" "$tool" MOEPLUG_GPU_FAMILY=wgmma MOEPLUG_WGMMA_BM=64 \
      SAN_SELECT='test_fused_moe\.py::test_(deterministic|large_m)' SAN_TIMEOUT=${T:-500}
  done
  # The column-pair stores of the default wgmma epilogues (8-byte aligned partials).
  san memcheck_pairs memcheck MOEPLUG_GPU_FAMILY=wgmma \
    SAN_SELECT='test_fused_moe\.py::test_(deterministic|large_m)' SAN_TIMEOUT=${T:-500}
  report "$1"
  ;;
esac
