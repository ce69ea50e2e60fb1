#!/usr/bin/env bash
# GPU calls of session 11, one per argument:
#   ab:    128 x 256 wgmma blocks (MOEPLUG_WGMMA_N=256) and the grouped work order
#          (MOEPLUG_WGMMA_GROUP) at M = 1024 / 4096, with the wgmma tests under both; the
#          stream / tile32 / wgmma crossovers at M = 256-1024 with the fitted K split; ncu of
#          the peer's kernel and ours at Qwen3 bf16 M = 4096
#   tma:   the weight map with 256-byte box rows against target/old, then 128 x 256 blocks
#   prefetch: the stream L2 prefetch at M = 1-256 with the longer walks
#   ncu:   Nsight Compute of the peer's GEMM kernel and ours at M = 4096 (bench/ncu_peer.sh)
#   suite: the whole GPU suite (8 processes) and the kit with peers on target/release
source "$(dirname "$0")/dev_common.sh"
case ${1:-suite} in
ab)
  # 128 x 256 blocks (warp-specialised, setmaxnreg) and the grouped order: correctness first,
  # under a timeout (a hang shows as rc=124), then the A/B at M = 1024 / 4096.
  MOEPLUG_GPU_FAMILY=wgmma MOEPLUG_WGMMA_N=256 MOEPLUG_WGMMA_GROUP=8 \
    MOEPLUG_LIBRARY=$PWD/target/release/libmoeplug.so timeout 120 python3 -m pytest -q \
    -p no:cacheprovider -x tests/gpu/test_fused_moe.py -k "deterministic or formats_x or real_shapes" \
    2>&1 | tail -4
  echo "rc=${PIPESTATUS[0]}"
  stamp wide-tests
  ROUNDS=2 AB_TIMEOUT=45 bash bench/ab.sh "" "MOEPLUG_WGMMA_N=256" "MOEPLUG_WGMMA_GROUP=8" \
    "MOEPLUG_WGMMA_N=256 MOEPLUG_WGMMA_GROUP=8" -- --ms 1024,4096 2>&1 | tail -15
  stamp wide-group
  ROUNDS=1 AB_TIMEOUT=45 bash bench/ab.sh "" "MOEPLUG_GPU_FAMILY=stream" \
    "MOEPLUG_GPU_FAMILY=stream MOEPLUG_STREAM_BM=32" "MOEPLUG_GPU_FAMILY=wgmma" -- \
    --ms 256,512,1024 2>&1 | tail -17
  stamp crossover
  NCU_LINES=60 timeout 150 bash bench/ncu_peer.sh qwen3_bf16 4096
  stamp ncu
  ;;
tma)
  # The weight map with 256-byte box rows (target/old: 16-byte rows), then 128 x 256 blocks
  # and the grouped order on it. Results go to $OUT/summary.txt as well: a long ncu log
  # must not push them out of the call's output tail.
  sum=$OUT/summary.txt
  for v in "" "MOEPLUG_WGMMA_N=256 MOEPLUG_WGMMA_GROUP=8"; do
    env MOEPLUG_GPU_FAMILY=wgmma $v MOEPLUG_LIBRARY=$PWD/target/release/libmoeplug.so timeout 120 \
      python3 -m pytest -q -p no:cacheprovider -x tests/gpu/test_fused_moe.py \
      -k "deterministic or formats_x or real_shapes" >"$OUT/wgmma_tests.log" 2>&1
    echo "wgmma tests [$v]: rc=$? $(tail -1 "$OUT/wgmma_tests.log")" | tee -a "$sum"
    grep -E "^(FAILED|ERROR)" "$OUT/wgmma_tests.log" | head -3 | tee -a "$sum"
  done
  stamp tests | tee -a "$sum"
  ROUNDS=2 AB_TIMEOUT=45 bash bench/ab.sh "MOEPLUG_LIBRARY=$PWD/target/old/libmoeplug.so" "" \
    "MOEPLUG_WGMMA_N=256" "MOEPLUG_WGMMA_N=256 MOEPLUG_WGMMA_GROUP=8" -- --ms 1024,4096 2>&1 |
    tail -15 | tee -a "$sum"
  stamp ab | tee -a "$sum"
  BENCH_ONLY=1 NCU_LINES=200 timeout 100 bash bench/ncu_peer.sh qwen3_bf16 4096 >/dev/null 2>&1
  grep -E "moe_stage|Duration|tag_requests.avg|requests_srcunit|sectors_srcunit|pipe_tensor_cycles|dram__bytes_read" \
    "$OUT/ncu_moeplug_qwen3_bf16_4096.log" | tee -a "$sum"
  stamp ncu | tee -a "$sum"
  ROUNDS=1 AB_TIMEOUT=60 bash bench/ab.sh "MOEPLUG_GPU_FAMILY=stream" "MOEPLUG_GPU_FAMILY=wgmma" \
    "MOEPLUG_GPU_FAMILY=wgmma MOEPLUG_WGMMA_N=256" -- --ms 128,256,512 2>&1 | tail -17 | tee -a "$sum"
  stamp crossover | tee -a "$sum"
  ;;
prefetch)
  ROUNDS=2 AB_TIMEOUT=35 bash bench/ab.sh "" "MOEPLUG_STREAM_PREFETCH=2" "MOEPLUG_STREAM_PREFETCH=4" -- \
    --ms 1,8,64,256 2>&1 | tail -22
  stamp prefetch
  ;;
ncu)
  # The peer's kernel next to ours at the prefill points (issue 10): what differs.
  bash bench/ncu_peer.sh qwen3_bf16 4096
  stamp ncu-qwen3
  NCU_LINES=50 bash bench/ncu_peer.sh dsv3_fp8blk 4096
  stamp ncu-dsv3
  ;;
suite)
  suite_and_kit
  ;;
esac
