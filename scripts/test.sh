#!/usr/bin/env bash
# Every test: Rust unit and integration tests, the C/C++ programs and install layout, the
# Python package (pytest, pip install into a fresh venv), the doc-tests.
#
# usage: scripts/test.sh [cargo test arguments...]
#
# Set-up first (scripts/setup.sh): missing Debian tools are installed when run as root (else
# named), and ./.venv is created from python/requirements-test.txt when missing or incomplete.
# Every suite runs (--no-fail-fast); the last line sums them all:
# `N passed, N failed, N skipped` (skipped: ignored Rust tests and skipped pytest tests, e.g.
# the GPU ones on a machine without a GPU).
# A suite that cannot run is a failure, never a skip. Exit status: 0 only if all passed.
set -uo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh || { echo "0 passed, 1 failed"; exit 1; }
# A suite that cannot run fails here (the Python tests, the NVRTC kernel compile check, the C
# tests under AddressSanitizer and valgrind); plain `cargo test` skips them with a warning.
export MOEPLUG_REQUIRE_PYTHON=${MOEPLUG_REQUIRE_PYTHON:-1} \
  MOEPLUG_REQUIRE_NVRTC=${MOEPLUG_REQUIRE_NVRTC:-1} \
  MOEPLUG_REQUIRE_SANITIZERS=${MOEPLUG_REQUIRE_SANITIZERS:-1}
venv=.venv  # made by scripts/setup.sh
# NVRTC from the venv's PyPI wheel, for the kernel compile check (tests/kernel_compile.rs).
nvrtc_dir=$(ls -d "$PWD/$venv"/lib/python3*/site-packages/nvidia/cu13/lib 2>/dev/null | head -1)
[ -n "$nvrtc_dir" ] && export LD_LIBRARY_PATH="$nvrtc_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

log=$(mktemp) junit=$(mktemp --suffix=.xml)
trap 'rm -f "$log" "$junit"' EXIT
rm -f "$junit"
MOEPLUG_PYTHON="$PWD/$venv/bin/python" MOEPLUG_PYTEST_JUNIT="$junit" \
  cargo test --release --no-fail-fast "$@" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}

# Rust: every `test result:` line of the harness (one per test binary and the doc-tests).
read -r rust_passed rust_failed rust_ignored rust_suites < <(
  sed -n 's/^test result: [A-Za-z]*\. \([0-9]*\) passed; \([0-9]*\) failed; \([0-9]*\) ignored.*/\1 \2 \3/p' "$log" |
    awk '{p+=$1; f+=$2; i+=$3; n++} END {print p+0, f+0, i+0, n+0}')
# Python: pytest's own per-test counts (the Rust wrapper above counts once more, as itself).
if [ -s "$junit" ]; then
  read -r py_passed py_failed py_skipped < <("$venv/bin/python" - "$junit" <<'PY'
import sys, xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
suites = [root] if root.tag == "testsuite" else list(root)
n = sum(int(s.get("tests", 0)) for s in suites)
f = sum(int(s.get("failures", 0)) + int(s.get("errors", 0)) for s in suites)
s = sum(int(s.get("skipped", 0)) for s in suites)
print(n - f - s, f, s)
PY
  )
  py_line="python: $py_passed passed, $py_failed failed, $py_skipped skipped (pytest)"
elif grep -q '^test python_package_tests ' "$log"; then
  py_passed=0 py_failed=1 py_skipped=0
  py_line="python: did not run (counted as 1 failed)"
else
  py_passed=0 py_failed=0 py_skipped=0
  py_line="python: not selected by the cargo test arguments"
fi

passed=$((rust_passed + py_passed))
failed=$((rust_failed + py_failed))
skipped=$((rust_ignored + py_skipped))
# A build error or a crashed test binary prints no `test result:` line: never a pass.
if [ "$status" -ne 0 ] && [ "$failed" -eq 0 ]; then failed=1; fi
echo
echo "== summary"
echo "rust:   $rust_passed passed, $rust_failed failed, $rust_ignored ignored ($rust_suites suites)"
echo "$py_line"
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
