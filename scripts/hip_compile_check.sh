#!/usr/bin/env bash
# Offline compile check of every kernel configuration the HIP backend can select, for AMD GPU
# archs (default gfx942 and gfx950), without ROCm: clang 22 from PyPI's ziglang wheel, a
# stand-in for hipRTC's pre-include (scripts/hip/hiprtc_prelude.h) and Debian's
# rocm-device-libs bitcode (ocml for erff/expf). The configurations and the hipRTC options come
# from the host code (src/backend/gpu/kernel_configs.rs via examples/kernel_configs.rs).
# The example writes each translation unit exactly as the backend compiles it (ABI prelude
# included) with the kernel headers. Each configuration is compiled to assembly, assembled and
# linked into a code object as hipRTC would hand the loader (one job per core); the object
# must be for the arch and hold a descriptor for every kernel. An MFMA-family configuration
# must also have, in both GEMM kernels (moe_stage1, moe_stage2), the matrix-core instruction
# the host names for it (kernel_configs::expected_mfma: the operand type it should use on that
# arch), and no scratch (spills), as the NVRTC check refuses spills.
# Prints every configuration with its kernel count and MFMA instruction count; exits 1 on any
# error.
#
# usage: scripts/hip_compile_check.sh [ARCH...]
#   MOEPLUG_ZIG_PYTHON  python with ziglang installed (default .venv/bin/python)
#   ROCM_DEVICE_LIBS    rocm-device-libs bitcode dir (default Debian's)
#   MOEPLUG_HIP_CHECK_EVERY=N  compile only every N-th configuration (a quick local look)
#   MOEPLUG_HIP_CHECK_ONLY=WORD  compile only the configurations whose name has WORD (e.g. mfma)
set -euo pipefail
cd "$(dirname "$0")/.."

archs=("$@")
[ ${#archs[@]} -gt 0 ] || archs=(gfx942 gfx950)
py=${MOEPLUG_ZIG_PYTHON:-.venv/bin/python}
bitcode=${ROCM_DEVICE_LIBS:-/usr/lib/x86_64-linux-gnu/amdgcn/bitcode}

zig() { "$py" -m ziglang "$@"; }

if ! zig clang --version >/dev/null 2>&1; then
  echo "hip_compile_check: no ziglang in $py (pip install ziglang)" >&2
  exit 1
fi
if [ ! -f "$bitcode/ocml.bc" ]; then
  echo "hip_compile_check: no $bitcode/ocml.bc (apt-get install rocm-device-libs)" >&2
  exit 1
fi
echo "compiler: $(zig clang --version | head -1)"
cpus=$(zig clang -target amdgcn-amd-amdhsa --print-supported-cpus 2>&1)
for a in "${archs[@]}"; do
  grep -qw "$a" <<<"$cpus" || { echo "hip_compile_check: clang does not know $a" >&2; exit 1; }
done

# The device libraries hipRTC links: ocml/ockl and the control constants of a default
# (no fast-math) compile for wave64.
links=()
for b in ocml ockl oclc_daz_opt_off oclc_unsafe_math_off oclc_finite_only_off \
  oclc_correctly_rounded_sqrt_on oclc_wavefrontsize64_on; do
  links+=(-Xclang -mlink-builtin-bitcode -Xclang "$bitcode/$b.bc")
done

# ELF e_flags machine of a code object (EF_AMDGPU_MACH_*).
mach_of() {
  case "$1" in
    gfx942) echo 0x4c ;;
    gfx950) echo 0x4f ;;
    *) echo "" ;;
  esac
}
# __oclc_ISA_version: major * 1000 + minor * 100 + stepping (hex digits), gfx942 -> 9402.
isa_version() {
  local d=${1#gfx}
  echo $((10#${d:0:${#d}-2} * 1000 + 16#${d: -2:1} * 100 + 16#${d: -1}))
}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
configs=$(cargo run -q --release --example kernel_configs -- "$work/src" "${archs[@]}")

# One configuration: hipRTC options -> assembly -> object -> code object, then the checks.
# Writes one result line to $out.result ("ok ..." or "FAILED ...", then the reasons).
check_one() {
  local out=$1 what=$2 src=$3 arch=$4 expect=$5 options=$6
  local defines problems=() flags want kernels symbols nkernels mfma scratch per_kernel k n
  defines=$(tr ' ' '\n' <<<"$options" | grep '^-D' | tr '\n' ' ' || true)
  # shellcheck disable=SC2086 # options are the host's hipRTC options, one word each
  if ! zig clang -x hip --cuda-device-only -nogpulib -nogpuinc \
    -include scripts/hip/hiprtc_prelude.h -DMP_OCLC_ISA_VERSION="$(isa_version "$arch")" \
    -I "$(dirname "$src")" $options "${links[@]}" -S -o "$out.s" "$src" 2>"$out.log" ||
    ! zig clang -target amdgcn-amd-amdhsa -mcpu="$arch" -c "$out.s" -o "$out.o" 2>>"$out.log" ||
    ! zig ld.lld -shared --no-undefined -o "$out.hsaco" "$out.o" 2>>"$out.log"; then
    { echo "FAILED    $what $arch $defines"; sed 's/^/    /' "$out.log" | head -40; } >"$out.result"
    return
  fi
  flags=$(readelf -h "$out.hsaco" | awk '/Flags:/ {print $2}' | tr -d ,)
  want=$(mach_of "$arch")
  if [ -n "$want" ] && [ $((flags & 0xff)) -ne $((want)) ]; then
    problems+=("code object e_flags $flags is not $arch ($want)")
  fi
  kernels=$(awk '$1 == ".amdhsa_kernel" {print $2}' "$out.s")
  symbols=$(readelf -sW "$out.hsaco" | awk '{print $8}')
  for k in $kernels; do
    grep -qx "$k.kd" <<<"$symbols" || problems+=("no kernel descriptor $k.kd")
  done
  nkernels=$(wc -w <<<"$kernels")
  [ "$nkernels" -gt 0 ] || problems+=("no kernels")
  mfma=$(grep -cE '^[[:space:]]*v_(mfma|smfmac)' "$out.s" || true)
  scratch=$(awk '$1 == ".amdhsa_private_segment_fixed_size" && $2 > m {m = $2} END {print m + 0}' "$out.s")
  if [ "$expect" != - ]; then
    # Instructions per function: a function runs from its label to its .Lfunc_end.
    per_kernel=$(awk -v insn="$expect" '
      /^[A-Za-z_][A-Za-z0-9_]*:/ {fn = $1; sub(/:$/, "", fn)}
      /^\.Lfunc_end/ {fn = ""}
      fn != "" && $1 == insn {n[fn]++}
      END {for (f in n) print f, n[f]}' "$out.s")
    for k in moe_stage1 moe_stage2; do
      n=$(awk -v k="$k" '$1 == k {print $2}' <<<"$per_kernel")
      [ "${n:-0}" -gt 0 ] || problems+=("$k has no $expect")
    done
    [ "$scratch" -eq 0 ] || problems+=("scratch ${scratch}B (spills) in an MFMA configuration")
  fi
  if [ ${#problems[@]} -gt 0 ]; then
    { echo "FAILED    $what $arch $defines"; printf '    %s\n' "${problems[@]}"; } >"$out.result"
  else
    printf 'ok        %-16s %-7s kernels=%d mfma=%d scratch=%dB expect=%s  %s\n' \
      "$what" "$arch" "$nkernels" "$mfma" "$scratch" "$expect" "$defines" >"$out.result"
    echo "$what $arch" >"$out.tag"
  fi
  rm -f "$out.s" "$out.o" "$out.hsaco" "$out.log"
}

jobs_max=$(nproc 2>/dev/null || echo 2)
every=${MOEPLUG_HIP_CHECK_EVERY:-1}
n=0
seen=0
while IFS=$'\t' read -r kind what src arch expect options; do
  if [ "$kind" = exclude ]; then
    echo "excluded  $what: $src"
    continue
  fi
  [[ $what == *"${MOEPLUG_HIP_CHECK_ONLY:-}"* ]] || continue
  seen=$((seen + 1))
  [ $(((seen - 1) % every)) -eq 0 ] || continue
  n=$((n + 1))
  check_one "$work/$n" "$what" "$src" "$arch" "$expect" "$options" &
  while [ "$(jobs -rp | wc -l)" -ge "$jobs_max" ]; do wait -n || true; done
done <<<"$configs"
wait

failed=0
total_mfma=0
for i in $(seq 1 "$n"); do
  cat "$work/$i.result"
  case $(head -c 6 "$work/$i.result") in
    FAILED) failed=$((failed + 1)) ;;
    *) total_mfma=$((total_mfma + $(sed -n 's/.* mfma=\([0-9]*\) .*/\1/p' "$work/$i.result"))) ;;
  esac
done

echo "hip compile check: $n configurations for ${archs[*]}, $failed failed, $total_mfma MFMA instructions in all"
echo "compiled per family and arch:"
cat "$work"/*.tag 2>/dev/null | sort | uniq -c || true
[ "$n" -gt 0 ] && [ "$failed" -eq 0 ]
