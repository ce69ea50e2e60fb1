#!/usr/bin/env bash
# What the tests need on a fresh machine (scripts/test.sh runs this first; .ci/run too, before
# its lints): the Debian tools, and ./.venv with python/requirements-test.txt.
set -uo pipefail
cd "$(dirname "$0")/.."

# System tools the C/C++/CMake and Python tests need; as root on Debian they are installed
# (a fresh machine), otherwise they are named and the tests that need them fail.
need=()
command -v cc >/dev/null || need+=(gcc)
command -v c++ >/dev/null || need+=(g++)
command -v readelf >/dev/null || need+=(binutils)
command -v pkg-config >/dev/null || need+=(pkg-config)
command -v cmake >/dev/null || need+=(cmake)
# The C tests under valgrind and AddressSanitizer (gcc's libasan) in tests/sanitizers.rs.
command -v valgrind >/dev/null || need+=(valgrind)
echo 'int main(void){return 0;}' | cc -fsanitize=address -x c -o /dev/null - 2>/dev/null || need+=(libasan8)
python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || need+=(python3-venv)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "== apt-get install ${need[*]}"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}"
  else
    echo "warning: missing ${need[*]} (Debian packages): the tests that need them will fail" >&2
  fi
fi

# CPU-only torch with gloo for the expert-parallel example's test (tests/python.rs): Debian's
# build, 190 MB with its deps; PyPI's x86_64 torch needs ~2 GB of CUDA wheels just to import.
if ! /usr/bin/python3 -c 'import torch' >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "== apt-get install python3-torch"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
      --no-install-recommends python3-torch=1.13.1+dfsg-4
  else
    echo "warning: no torch for /usr/bin/python3 (Debian python3-torch): the EP test will fail" >&2
  fi
fi

venv=.venv
requirements=python/requirements-test.txt
stamp="$venv/.moeplug-requirements"  # the requirements this venv was last filled from
if ! cmp -s "$requirements" "$stamp" ||
  ! "$venv/bin/python" -c 'import numpy, ml_dtypes, pytest' >/dev/null 2>&1; then
  echo "== python venv $venv ($requirements)"
  { [ -x "$venv/bin/python" ] || python3 -m venv "$venv"; } &&
    "$venv/bin/python" -m pip install -q --disable-pip-version-check -r "$requirements" &&
    cp "$requirements" "$stamp" || {
    echo "scripts/setup.sh: could not set up $venv" >&2
    exit 1
  }
fi
