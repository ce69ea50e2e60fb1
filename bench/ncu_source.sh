#!/usr/bin/env bash
# Where a kernel's warps stall, per SASS instruction: Nsight Compute's source counters (warp-state
# sampling) of one kernel of one case, exported on the device and cut to the instructions with
# the most samples (the whole report stays behind: it is large).
#   NCU_KERNEL=moe_stage1 bash bench/ncu_source.sh "model:format:M"
# Writes $OUT/ncu_source.txt: the header, then the TOP (default 80) instructions by samples, in
# address order, with every numeric column that is not all zeros. MOEPLUG_* settings pass
# through to the library (e.g. MOEPLUG_GPU_FAMILY=wgmma).
set -uo pipefail
export MOEPLUG_LIBRARY=${MOEPLUG_LIBRARY:-$PWD/target/release/libmoeplug.so} PYTHONUNBUFFERED=1  # a library given is kept
export MOEPLUG_CACHE_DIR=/tmp/moeplug-cache MOEPLUG_SELFTEST=0
export BENCH_E="gpt-oss-120b=128,deepseek-v3=256,qwen3-30b-a3b=128" BENCH_ITERS=1 BENCH_SETS=1
IFS=: read -r model fmt m <<<"$1"
rep=/tmp/ncu_source
BENCH_RUNS="$model:$fmt" BENCH_M=$m timeout ${NCU_TIMEOUT:-150} ncu --clock-control none \
  -k regex:${NCU_KERNEL:-moe_stage1} --launch-skip ${NCU_SKIP:-1} --launch-count 1 \
  --section SourceCounters --section WarpStateStats -o "$rep" -f \
  python3 bench/gpu_fused_moe.py 2>&1 | grep -E "==PROF==|moe_stage|rror" | head -5
ncu --import "$rep.ncu-rep" --page source --csv --print-source sass > /tmp/ncu_source.csv 2>&1
python3 - /tmp/ncu_source.csv "${TOP:-80}" > "$OUT/ncu_source.txt" <<'PY'
import csv, sys
rows = list(csv.reader(open(sys.argv[1], errors="replace")))
head_at = next((i for i, r in enumerate(rows) if any("Sampling" in c for c in r)), None)
if head_at is None:
    print("no sampling columns; first lines:"); print("\n".join(",".join(r) for r in rows[:20])); sys.exit()
head, body = rows[head_at], [r for r in rows[head_at + 1:] if len(r) == len(rows[head_at])]
def num(v):
    try: return float(v.replace(",", ""))
    except ValueError: return 0.0
total = next(i for i, c in enumerate(head) if "Sampling" in c)
# the address and source columns, and every numeric column with a nonzero value
text = [i for i, c in enumerate(head) if "Source" in c or "Address" in c]
keep = text + [i for i in range(len(head)) if i not in text and any(num(r[i]) for r in body)]
all_samples = sum(num(r[total]) for r in body) or 1.0
print(f"{len(body)} instructions, {all_samples:.0f} samples in '{head[total]}'")
print(" | ".join(head[i] for i in keep))
top = sorted(body, key=lambda r: -num(r[total]))[: int(sys.argv[2])]
order = {id(r): k for k, r in enumerate(body)}
for r in sorted(top, key=lambda r: order[id(r)]):
    print(" | ".join(r[i] for i in keep))
PY
rm -f "$rep.ncu-rep"
head -3 "$OUT/ncu_source.txt"
