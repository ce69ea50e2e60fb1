#!/usr/bin/env bash
# compute-sanitizer over the GPU suite (issue 14), sharded so that each shard fits one GPU
# call. One call runs one tool over the shards named by SHARD:
#   SHARD=1/4 bash bench/sanitize.sh memcheck           # shard 1 of 4 of ALL of tests/gpu
#   SHARD=1,2/4 bash bench/sanitize.sh memcheck         # shards 1 and 2 of 4, one after the other
#   SHARD=1/2 bash bench/sanitize.sh racecheck          # the racecheck subset (SAN_SELECT), 1 of 2
#   bash bench/sanitize.sh initcheck                    # SHARD defaults to 1/1
# Prints per shard: tool, shard, tests, pytest's passed/failed line, the summed
# "ERROR SUMMARY: N errors" of every process, seconds, rc; the whole log under $OUT.
#
# Env (all optional):
#   SHARD=i[,j...]/n    which shards of how many (default 1/1; n sets the shard size)
#   SAN_SELECT=ERE      node ids to run, as an extended regex over `pytest --collect-only`
#                       ids (default: all for memcheck, a subset for racecheck/initcheck below)
#   SAN_EXCLUDE=ERE     node ids left out of each shard after sharding (the shards keep the
#                       assignment they have without it: a shard's slow tests run on their own)
#   SAN_KERNELS=filter  --kernel-name filter (memcheck and racecheck default regex=^(moe|prep)_:
#                       only our kernels are instrumented, torch's run unchecked at full speed);
#                       empty = every kernel, initcheck's default (below)
#   SAN_TIMEOUT=s       per shard (default 540: one 600 s call)
#   SAN_JOBS=k          shards run at once (default 1), each its own sanitizer and pytest
#   SAN_PRINT_LIMIT=n   reports printed per process (default 20)
#   SAN_SELFTEST=0      skip the self-test before first use in every process (MOEPLUG_SELFTEST=0)
#                       and deselect tests/gpu/test_selftest.py, which needs it
#   MOEPLUG_CACHE_DIR   kernel disk cache shared by all shards (default /tmp/moeplug-cache):
#                       kernels compiled by one shard (or by bench/device_check.sh) are read back
#                       by the next; the self-test's kernels come from it as well.
#
# Why it is slow, and what is done about it: the sanitizer instruments every kernel launched
# by the process (torch's elementwise, copy, randn and reference-matmul kernels are most of
# the suite's launches) and serializes launches; host code (NVRTC, the float64 references,
# pytest) runs at normal speed. The kernel filter restricts instrumentation to moe_* / prep_*,
# the cache keeps NVRTC out of every shard but the first. racecheck and initcheck are several
# times slower than memcheck on shared-memory-heavy kernels, so they run a subset by default.
set -uo pipefail
tool=${1:-memcheck}
case $tool in memcheck | racecheck | initcheck | synccheck) ;; *)
  echo "usage: SHARD=i/n bash bench/sanitize.sh memcheck|racecheck|initcheck|synccheck" >&2
  exit 2
  ;;
esac
OUT=${OUT:-/tmp/sanitize-out}
mkdir -p "$OUT"
export MOEPLUG_LIBRARY=${MOEPLUG_LIBRARY:-$PWD/target/release/libmoeplug.so} PYTHONUNBUFFERED=1
export MOEPLUG_CACHE_DIR=${MOEPLUG_CACHE_DIR:-/tmp/moeplug-cache}
# CUPTI (torch.profiler) has no events under the sanitizer: tests that count launches by it
# say so and skip that part (tests/gpu/test_fused_combine.py).
export MOEPLUG_UNDER_SANITIZER=1
shard=${SHARD:-1/1}
which=${shard%/*} n=${shard#*/}
SUBSET='test_fused_moe\.py::(test_deterministic|test_cuda_graph|test_formats_x_act_dtypes\[7-)'
SUBSET+='|test_prep_device\.py::(test_prepare_moe|test_quantize_mx|test_side_stream)'
SUBSET+='|test_launch_fields\.py::test_gelu_tanh|test_bad_device_ptrs\.py'
if [ "$tool" = memcheck ]; then select=${SAN_SELECT:-.}; else select=${SAN_SELECT:-$SUBSET}; fi
# initcheck learns which bytes are initialized from the writes it sees: a buffer that torch's
# (uninstrumented) randn or cast kernels wrote reads as uninitialized in our kernels. Under the
# filter it reported every input of the first fused_moe (moe_route's topk ids, moe_stage1's
# weight packs, session 8), so it instruments every kernel unless told otherwise.
if [ "$tool" = initcheck ]; then kernels=${SAN_KERNELS-}; else kernels=${SAN_KERNELS-'regex=^(moe|prep)_'}; fi

san=(compute-sanitizer --tool "$tool" --error-exitcode 3 --print-limit "${SAN_PRINT_LIMIT:-20}"
  --target-processes all)
# The library refuses bad input by design, and some of those refusals are failed driver calls
# (an unknown device id, a pointer query of a freed buffer): the tests assert the status.
san+=(--report-api-errors no)
if [ -n "$kernels" ]; then
  # The help text first, then grep: `--help | grep -q` under pipefail fails whenever grep's
  # early exit gives compute-sanitizer a SIGPIPE, and every kernel was then instrumented.
  san_help=$(compute-sanitizer --help 2>&1)
  if [[ $kernels == regex=* ]] && ! grep -q "regex" <<<"$san_help"; then
    echo "note: this compute-sanitizer has no regex kernel filter: every kernel is instrumented"
  else
    san+=(--kernel-name "$kernels")
  fi
fi
if [ "${SAN_SELFTEST:-1}" = 0 ]; then export MOEPLUG_SELFTEST=0; fi
echo "=== $(compute-sanitizer --version | tail -1); $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
echo "=== ${san[*]}"

# Warm the cache (and open the device once) without the sanitizer: the self-test's kernels.
python3 -c "import sys; sys.path.insert(0, 'tests/gpu'); import _abi; _abi.get_caps(2, 0)" ||
  echo "warning: the CUDA backend did not open outside the sanitizer"

# The node ids of the whole suite, then the selection, then round-robin shards (neighbouring
# parametrizations of one slow test land in different shards).
python3 -m pytest --collect-only -q -p no:cacheprovider tests/gpu 2>/dev/null | grep "::" >"$OUT/all_ids.txt"
grep -E -- "$select" "$OUT/all_ids.txt" >"$OUT/selected_ids.txt" || true
if [ "${SAN_SELFTEST:-1}" = 0 ]; then
  grep -v "test_selftest\.py" "$OUT/selected_ids.txt" >"$OUT/tmp_ids.txt"
  mv "$OUT/tmp_ids.txt" "$OUT/selected_ids.txt"
fi
echo "=== $(wc -l <"$OUT/all_ids.txt") tests in tests/gpu, $(wc -l <"$OUT/selected_ids.txt") selected for $tool, $n shards"

# One shard: its sanitizer run, then its report in $OUT/report_<tool>_<i>of<n>.txt (errors
# and rc on the first line).
run_shard() {
  local i=$1 ids log start rc secs errors summaries result report
  mapfile -t ids < <(awk -v i="$i" -v n="$n" '(NR - 1) % n == i - 1' "$OUT/selected_ids.txt" |
    grep -vE -- "${SAN_EXCLUDE:-^$}")
  log=$OUT/sanitize_${tool}_${i}of${n}.log
  report=$OUT/report_${tool}_${i}of${n}.txt
  if [ ${#ids[@]} -eq 0 ]; then
    printf '0 0\n--- %s shard %s/%s: no tests\n' "$tool" "$i" "$n" >"$report"
    return
  fi
  start=$(date +%s)
  # -v: one line per finished test, so a shard that times out still says how far it got.
  timeout "${SAN_TIMEOUT:-540}" "${san[@]}" python3 -m pytest -v -p no:cacheprovider "${ids[@]}" >"$log" 2>&1
  rc=$?
  secs=$(($(date +%s) - start))
  # One summary per process (pytest and its subprocesses): sum them. racecheck reports
  # "RACECHECK SUMMARY: N hazards displayed (E errors, W warnings)", the others
  # "ERROR SUMMARY: N errors".
  if [ "$tool" = racecheck ]; then
    errors=$(grep -oE "RACECHECK SUMMARY: .*\([0-9]+ error" "$log" | grep -oE "[0-9]+ error" |
      awk '{s += $1} END {print s + 0}')
    summaries=$(grep -c "RACECHECK SUMMARY" "$log")
  else
    errors=$(grep -oE "ERROR SUMMARY: [0-9]+ error" "$log" | awk '{s += $3} END {print s + 0}')
    summaries=$(grep -c "ERROR SUMMARY" "$log")
  fi
  [ "$summaries" -eq 0 ] && [ $rc -eq 0 ] && rc=4
  result=$(grep -v "^========= " "$log" | grep -E "[0-9]+ (passed|failed|errors?|skipped).* in [0-9.]+s" | tail -1 | sed "s/^=* *//; s/ *=*$//")
  {
    echo "$errors $rc"
    echo "--- $tool shard $i/$n: ${#ids[@]} tests, ${result:-no pytest summary}"
    echo "    ERROR SUMMARY: $errors errors ($summaries sanitizer summaries), ${secs} s, rc=$rc"
    [ "$summaries" -eq 0 ] && echo "    no sanitizer summary: the sanitizer did not finish (see $log)"
    if [ $rc -eq 124 ]; then
      echo "    TIMED OUT after ${SAN_TIMEOUT:-540} s: use more shards (SHARD=i/$((n * 2)))"
      # The tests it finished (clean so far: no report above) and the one it was in.
      local done_ids
      done_ids=$(grep -oE "^tests/gpu/[^ ]+ (PASSED|SKIPPED|FAILED|ERROR)" "$log" | cut -d' ' -f1)
      echo "    finished $(grep -c . <<<"$done_ids") of ${#ids[@]}; not finished:"
      printf '%s\n' "${ids[@]}" | grep -vxF -f <(printf '%s\n' "$done_ids") | sed 's/^/      /'
    fi
    grep -E "^========= (Invalid|Uninitialized|Race|Error|Barrier|.*hazard)" "$log" | sort | uniq -c | head -10
    # A failed test names itself and its assertion (pytest's short summary).
    grep -E "^(FAILED|ERROR) tests/" "$log" | cut -c1-300 | head -5
  } >"$report"
}

# SAN_JOBS shards at once (separate processes on the one GPU; the sanitizer's cost is mostly
# on the host, which has the cores), then the reports in shard order.
running=0
for i in ${which//,/ }; do
  run_shard "$i" &
  running=$((running + 1))
  if [ $running -ge "${SAN_JOBS:-1}" ]; then
    wait -n
    running=$((running - 1))
  fi
done
wait
total_errors=0
worst=0
for i in ${which//,/ }; do
  report=$OUT/report_${tool}_${i}of${n}.txt
  read -r errors rc <"$report"
  tail -n +2 "$report"
  total_errors=$((total_errors + errors))
  [ "$rc" -gt $worst ] && worst=$rc
done
echo "=== $tool shards $which/$n: $total_errors errors in total"
exit $worst
