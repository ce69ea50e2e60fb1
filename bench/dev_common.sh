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
