#!/usr/bin/env bash
# GPU calls of session 19, one per argument. Build main (`cargo build --release`) and the
# pre-skip library (acbf0bb) into target/old/libmoeplug.so; carry both, target/release/moeplug
# and .peers.
#   skip: the idle-warpgroup skip (1e34268) against the library before it (with its opt-in
#         folds on, now the defaults), M = 1024 / 4096 on the 128-row cases, with the SM clock
#         and power sampled; the kit on the new defaults (both folds on); DeepSeek fp8 M = 1
#         per kernel under ncu; DeepSeek M = 4096's DRAM bytes per
#         stage; the decode rule's edges
source "$(dirname "$0")/dev_common.sh"
case ${1:-skip} in
skip)
  nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv,noheader \
    -lms 250 >/tmp/clocks.csv &
  smi=$!
  OUT=/tmp/ab ROUNDS=2 AB_TIMEOUT=120 bash bench/ab.sh "" \
    "MOEPLUG_LIBRARY=$PWD/target/old/libmoeplug.so MOEPLUG_CACHE_DIR=/tmp/c-old MOEPLUG_ROUTE_QUANT1=1 MOEPLUG_FUSED_QUANT2=1" -- \
    --cases dsv3_fp8blk,gptoss_bf16,qwen3_bf16,gptoss_mxfp4 --ms 1024,4096 2>&1 | tail -12 | tee -a "$sum"
  kill $smi
  python3 - <<'PY' | tee -a "$sum"
import csv
rows = [r for r in csv.reader(open('/tmp/clocks.csv')) if len(r) == 4]
mhz = sorted(float(r[1].split()[0]) for r in rows)
w = sorted(float(r[2].split()[0]) for r in rows if 'W' in r[2])
print(f"clocks: {len(mhz)} samples, SM MHz min {mhz[0]:.0f} p10 {mhz[len(mhz)//10]:.0f} median {mhz[len(mhz)//2]:.0f}; power W median {w[len(w)//2]:.0f} p90 {w[9*len(w)//10]:.0f} max {w[-1]:.0f}")
PY
  stamp skip | tee -a "$sum"
  KIT_TIMEOUT=200 bash bench/device_check.sh kit 2>&1 | grep -A40 '^case '
  stamp kit
  ncu_launch deepseek-v3:fp8_block128:1 6 100
  tail -25 "$OUT/ncu.log"
  stamp ncu | tee -a "$sum"
  # DRAM and L2 bytes of DeepSeek fp8 M = 4096's two GEMM stages: does prefill re-read weights?
  NCU_WHAT=breakdown NCU_TIMEOUT=150 bash bench/ncu_profile.sh deepseek-v3:fp8_block128:4096 \
    2>&1 | grep -E 'moe_stage|Duration|dram__bytes|lts__t_bytes|pipe_tensor|Memory Throughput' \
    | head -40 | tee -a "$sum"
  stamp ncu4096 | tee -a "$sum"
  ROUNDS=1 edges_ab
  ;;
esac
