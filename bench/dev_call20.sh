#!/usr/bin/env bash
# GPU call of session 19 (device time is scarce: one call does it all). Build main
# (`cargo build --release`) and the pre-skip library (acbf0bb) into target/old/libmoeplug.so;
# carry both, target/release/moeplug and .peers. In order, most wanted first:
#  1. A/B at M = 1024 / 4096 on the 128-row cases: main; the library before the idle-warpgroup
#     skip (1e34268), with its opt-in folds on as main has them by default; main with a block per
#     work item instead of the persistent stride; main with the work order's groups of 1 tile
#     (default 8). The SM clock and power are sampled.
#  2. the kit on the new defaults (both folds on);
#  3. the suite on them;
#  4. ncu: DRAM and L2 bytes of DeepSeek fp8 M = 4096's two GEMM stages; every kernel of one
#     DeepSeek fp8 M = 1 launch.
source "$(dirname "$0")/dev_common.sh"
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv,noheader \
  -lms 250 >/tmp/clocks.csv &
smi=$!
OUT=/tmp/ab ROUNDS=2 AB_TIMEOUT=120 bash bench/ab.sh "" \
  "MOEPLUG_LIBRARY=$PWD/target/old/libmoeplug.so MOEPLUG_CACHE_DIR=/tmp/c-old MOEPLUG_ROUTE_QUANT1=1 MOEPLUG_FUSED_QUANT2=1" \
  "MOEPLUG_WGMMA_PERSISTENT=0" "MOEPLUG_WGMMA_GROUP=1" -- \
  --cases dsv3_fp8blk,gptoss_bf16,qwen3_bf16,qwen3_fp8blk,gptoss_mxfp4 --ms 1024,4096 2>&1 | tail -18 | tee -a "$sum"
kill $smi
python3 - <<'PY' | tee -a "$sum"
import csv
rows = [r for r in csv.reader(open('/tmp/clocks.csv')) if len(r) == 4]
mhz = sorted(float(r[1].split()[0]) for r in rows)
w = sorted(float(r[2].split()[0]) for r in rows if 'W' in r[2])
print(f"clocks: {len(mhz)} samples, SM MHz min {mhz[0]:.0f} p10 {mhz[len(mhz)//10]:.0f} median {mhz[len(mhz)//2]:.0f}; power W median {w[len(w)//2]:.0f} p90 {w[9*len(w)//10]:.0f} max {w[-1]:.0f}")
PY
stamp ab | tee -a "$sum"
KIT_TIMEOUT=200 bash bench/device_check.sh kit 2>&1 | grep -A40 '^case '
stamp kit
SUITE_JOBS=8 SUITE_TIMEOUT=300 bash bench/device_check.sh suite 2>&1 | grep -E '^suite|process|FAILED|ERROR'
rm -f "$OUT"/suite_*.log "$OUT"/suite_ids.txt  # few files under $OUT, or none come back
stamp suite
NCU_WHAT=breakdown NCU_TIMEOUT=120 bash bench/ncu_profile.sh deepseek-v3:fp8_block128:4096 \
  2>&1 | grep -E 'moe_stage|Duration|dram__bytes|lts__t_bytes|pipe_tensor|Memory Throughput' \
  | head -40 | tee -a "$sum"
tail -5 "$OUT/ncu.log"
stamp ncu4096 | tee -a "$sum"
ncu_launch deepseek-v3:fp8_block128:1 4 90
stamp ncu | tee -a "$sum"
