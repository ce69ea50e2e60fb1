#!/usr/bin/env bash
# Host emulation of the MFMA kernel family against the fp32 family, no GPU: each selected
# MFMA configuration is compiled twice as host C++ (FAMILY_MFMA and FAMILY_FP32, same defines,
# the arch's predefined macro set) under scripts/hip/wave_emulator.h, which runs every GPU
# thread as a std::thread and emulates MFMA from the ISA's definition. Both run one fused_moe
# on the same seeded inputs (scripts/hip/emulate_fused_moe.cpp); the MFMA result must match
# the fp32 family's within REL_L2 (stage-2 rows and output), and be finite wherever the fp32
# family's is. The fp32 family is the reference: the GPU suite checks it against the CPU
# backend on the H200.
# What this checks: the family's tile mapping, fragment indexing, scales, padding and
# epilogues. What it cannot check: that the hardware's fragment layouts are what the ISA
# documents (the self-test before first use does that on a real device).
#
# Configurations: for each arch, the first MFMA configuration of every (weight format, act
# dtype, fp16 activations, fnuz, weight layout) from examples/kernel_configs.rs, so every
# operand path (fp8 MFMA, f16, bf16 with and without the hi/lo split) and every scale folding
# is run. Prints one line per configuration; exits 1 on any failure.
#
# usage: scripts/hip_emulate_check.sh [ARCH...]      (default gfx942 gfx950)
#   MOEPLUG_ZIG_PYTHON  python with ziglang installed (default .venv/bin/python)
set -euo pipefail
cd "$(dirname "$0")/.."

archs=("$@")
[ ${#archs[@]} -gt 0 ] || archs=(gfx942 gfx950)
py=${MOEPLUG_ZIG_PYTHON:-.venv/bin/python}
REL_L2=2e-3

zig() { "$py" -m ziglang "$@"; }
if ! zig c++ --version >/dev/null 2>&1; then
  echo "hip_emulate_check: no ziglang in $py (pip install ziglang)" >&2
  exit 1
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
configs=$(cargo run -q --release --example kernel_configs -- "$work/src" "${archs[@]}")
# moe_route's dynamic shared array as a static one (wave_emulator.h).
sed -i 's/extern __shared__ int sm\[\];/__shared__ int sm[EMU_ROUTE_SHARED];/' "$work/src/moe_common.cuh"
grep -q EMU_ROUTE_SHARED "$work/src/moe_common.cuh" || {
  echo "hip_emulate_check: moe_route's shared array not found in moe_common.cuh" >&2
  exit 1
}

build() {  # out arch defines...
  local out=$1 arch=$2
  shift 2
  zig c++ -std=c++20 -O1 -pthread -w -I "$work/src" -I scripts/hip "-D__${arch}__" "$@" \
    -o "$out" scripts/hip/emulate_fused_moe.cpp
}

# Relative L2 of b against a over both arrays (python: no numpy needed), and non-finite
# values of b where a is finite.
compare() {
  python3 - "$1" "$2" "$REL_L2" <<'PY'
import array, math, sys
a, b = array.array("f"), array.array("f")
a.frombytes(open(sys.argv[1], "rb").read())
b.frombytes(open(sys.argv[2], "rb").read())
if len(a) != len(b) or not a:
    print(f"sizes differ: {len(a)} vs {len(b)}"); sys.exit(1)
bad = sum(1 for x, y in zip(a, b) if math.isfinite(x) and not math.isfinite(y))
fin = [(x, y) for x, y in zip(a, b) if math.isfinite(x) and math.isfinite(y)]
num = math.sqrt(sum((x - y) ** 2 for x, y in fin))
den = math.sqrt(sum(x * x for x, _ in fin)) or 1.0
rel = num / den
print(f"rel_l2={rel:.2e} non_finite={bad} values={len(a)}")
sys.exit(0 if bad == 0 and rel <= float(sys.argv[3]) else 1)
PY
}

# One configuration per (weight format, act dtype, fp16 activations, fnuz, MFMA instruction):
# the instruction tells the arch apart where it changes the operand path. Weight layouts
# alternate between the keys (AITER 16x16 for even ones, plain for odd ones, the other where
# a key has only one).
declare -A first
keys=()
while IFS=$'\t' read -r kind what _src arch expect options; do
  [ "$kind" = compile ] && [ "$what" = "fused_moe mfma" ] || continue
  defines=$(tr ' ' '\n' <<<"$options" | grep '^-D' | tr '\n' ' ')
  key=$expect
  for d in WFMT ACT_Q ACT_F16 FP8_FNUZ; do
    key+=" $(grep -o -- "-D$d=[0-9]*" <<<"$defines")"
  done
  layout=$(grep -o -- "-DWLAYOUT=[0-9]*" <<<"$defines")
  [ -n "${first[$key]+x}" ] || keys+=("$key")
  first[$key]=1
  [ -n "${first[$key|$layout]+x}" ] || first[$key|$layout]="$arch|$defines"
done <<<"$configs"

n=0
failed=0
aiter="-DWLAYOUT=$(grep -o 'WL_AITER_16X16 [0-9]*' "$work/src/fused_moe.cu" | cut -d' ' -f2)"
for i in "${!keys[@]}"; do
  key=${keys[$i]}
  pick=""
  if [ $((i % 2)) -eq 0 ] && [ -n "${first[$key|$aiter]+x}" ]; then
    pick=${first[$key|$aiter]}
  else
    for k in "${!first[@]}"; do
      if [[ $k == "$key|"* ]] && { [ -z "$pick" ] || [ "$k" != "$key|$aiter" ]; }; then
        pick=${first[$k]}
      fi
    done
  fi
  arch=${pick%%|*}
  defines=${pick#*|}
  n=$((n + 1))
  # The same configuration in the fp32 family (by the prelude's name for it).
  fp32=$(sed 's/-DFAMILY=[0-9]*/-DFAMILY=FAMILY_FP32/' <<<"$defines")
  # shellcheck disable=SC2086 # one define per word
  build "$work/mfma" "$arch" $defines 2>"$work/log.mfma" &
  build "$work/fp32" "$arch" $fp32 2>"$work/log.fp32" &
  if ! wait -n || ! wait -n; then
    wait
    cat "$work/log.mfma" "$work/log.fp32" >"$work/log"
    echo "FAILED    $arch $defines: does not build"
    sed 's/^/    /' "$work/log" | head -20
    failed=$((failed + 1))
    continue
  fi
  "$work/mfma" "$work/mfma.out" &
  "$work/fp32" "$work/fp32.out" &
  if ! wait -n || ! wait -n; then
    wait
    echo "FAILED    $arch $defines: a run failed"
    failed=$((failed + 1))
    continue
  fi
  if result=$(compare "$work/fp32.out" "$work/mfma.out"); then
    echo "ok        $arch $result  $defines"
  else
    echo "FAILED    $arch $result  $defines"
    failed=$((failed + 1))
  fi
done

echo "hip emulate check: $n MFMA configurations for ${archs[*]} against the fp32 family, $failed failed"
[ "$n" -gt 0 ] && [ "$failed" -eq 0 ]
