#!/usr/bin/env bash
# Host emulation of the tensor-core kernel families against the fp32 family, no GPU: each
# selected configuration is compiled twice as host C++ (its family and FAMILY_FP32, same
# defines) under scripts/emu/gpu_emulator.h, which runs every GPU thread as a std::thread and
# emulates the matrix instructions from the ISA's definitions: MFMA (HIP, in the header),
# mma.sync m16n8k16 / m16n8k32 (CUDA, scripts/emu/mma_sm80_host.cuh) and wgmma m64nNk16 /
# m64nNk32 with cp.async (CUDA sm_90, scripts/emu/mma_sm90_host.cuh). Both run one fused_moe on
# the same seeded inputs (scripts/emu/emulate_fused_moe.cpp); the family's result must match
# the fp32 family's within REL_L2 (stage-2 rows and output), and be finite wherever the fp32
# family's is. The fp32 family is the reference: the GPU suite checks it against the CPU
# backend on the H200.
# What this checks: the family's tile mapping, fragment indexing, scales, padding and
# epilogues. What it cannot check: that the hardware's fragment layouts are what the ISA
# documents (the self-test before first use does that on a real device), or timing.
#
# Configurations (examples/kernel_configs.rs):
#   hip   for each arch, the first MFMA configuration of every (weight format, act dtype, fp16
#         activations, fnuz, weight layout), so every operand path (fp8 MFMA, f16, bf16 with
#         and without the hi/lo split) and every scale folding is run;
#   cuda  the first configuration of every (family, tile rows, weight format, act dtype, fp16
#         activations, stream's K splits) among those of the mma.sync families (tile32,
#         stream) the heuristics can select on the archs (--emulate), with the block columns
#         and threads of the host's spec; and of wgmma (sm_90, TMA and warp specialisation
#         off in every selectable block shape, and as listed where it has TMA) the first of
#         every (tile rows, WG_N, weight format, act dtype, fp16 activations, blocks per SM,
#         WG_TMA, WG_WS, WG_GROUP, WG_RS, WG_KSPLIT, WG_DECODERS, WG_PACK_COPIES, WG_BULK_PACKS),
#         with the spec's dynamic shared memory and tensor-map geometry.
# Prints one line per configuration; exits 1 on any failure.
#
# usage: scripts/emulate_check.sh hip [ARCH...]      (default gfx942 gfx950)
#        scripts/emulate_check.sh cuda [ARCH...]     (default sm_80 sm_89 sm_90)
#   MOEPLUG_ZIG_PYTHON  python with ziglang installed (default .venv/bin/python)
#   EMULATE_ONLY        an extended regex: only the configurations whose defines match
#   MOEPLUG_EMULATE_FAMILIES  cuda: only these families (space-separated names, e.g. wgmma;
#                       default every emulated one)
set -euo pipefail
cd "$(dirname "$0")/.."

target=${1:-}
shift || true
archs=("$@")
case $target in
hip) [ ${#archs[@]} -gt 0 ] || archs=(gfx942 gfx950) ;;
cuda) [ ${#archs[@]} -gt 0 ] || archs=(sm_80 sm_89 sm_90) ;;
*)
  echo "usage: scripts/emulate_check.sh hip|cuda [ARCH...]" >&2
  exit 2
  ;;
esac
py=${MOEPLUG_ZIG_PYTHON:-.venv/bin/python}
REL_L2=2e-3

zig() { "$py" -m ziglang "$@"; }
if ! zig c++ --version >/dev/null 2>&1; then
  echo "emulate_check: no ziglang in $py (pip install ziglang)" >&2
  exit 1
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if [ "$target" = cuda ]; then
  configs=$(cargo run -q --release --example kernel_configs -- --emulate "$work/src" "${archs[@]}")
else
  configs=$(cargo run -q --release --example kernel_configs -- "$work/src" "${archs[@]}")
fi
# moe_route's dynamic shared array as a static one (gpu_emulator.h).
sed -i 's/extern __shared__ int sm\[\];/__shared__ int sm[EMU_ROUTE_SHARED];/' "$work/src/moe_common.cuh"
grep -q EMU_ROUTE_SHARED "$work/src/moe_common.cuh" || {
  echo "emulate_check: moe_route's shared array not found in moe_common.cuh" >&2
  exit 1
}
# The wgmma kernels' dynamic shared array as the launch's buffer (gpu_emulator.h).
if [ "$target" = cuda ]; then
  for f in moe_gemm_wgmma.cuh moe_gemm_wgmma_swap.cuh; do
    sed -i 's/extern __shared__ u8 wg_smem_raw\[\];/u8* const wg_smem_raw = emu_dyn_shared;/' \
      "$work/src/$f"
    if grep -q 'extern __shared__' "$work/src/$f" || ! grep -q emu_dyn_shared "$work/src/$f"; then
      echo "emulate_check: the wgmma kernels' shared array not rewritten in $f" >&2
      exit 1
    fi
  done
fi

# The stream kernels' activation ring (SW_XSHARED) likewise.
if [ "$target" = cuda ]; then
  f=moe_gemm_stream.cuh
  sed -i 's/extern __shared__ __align__(128) u8 sw_xs\[\];/u8* const sw_xs = emu_dyn_shared;/' \
    "$work/src/$f"
  if grep -q 'extern __shared__' "$work/src/$f" || ! grep -q emu_dyn_shared "$work/src/$f"; then
    echo "emulate_check: the stream kernels' shared array not rewritten in $f" >&2
    exit 1
  fi
fi

build() {  # out arch defines...
  local out=$1 arch=$2 mode
  shift 2
  # HIP: the arch's predefined macro; CUDA: the kernels read no arch macro (the host's
  # defines say everything), EMU_CUDA picks 32-lane warps and mma.sync.
  if [ "$target" = cuda ]; then mode=-DEMU_CUDA; else mode="-D__${arch}__"; fi
  zig c++ -std=c++20 -O1 -pthread -w -I "$work/src" -I scripts/emu "$mode" "$@" \
    -o "$out" scripts/emu/emulate_fused_moe.cpp
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

# picks: "arch|family|defines|fp32 twin defines", one per configuration run.
picks=()
select_hip() {
  # One configuration per (weight format, act dtype, fp16 activations, fnuz, MFMA
  # instruction): the instruction tells the arch apart where it changes the operand path.
  # Weight layouts alternate between the keys (AITER 16x16 for even ones, plain for odd ones,
  # the other where a key has only one).
  declare -A first
  local keys=() kind what _src arch expect options defines key layout
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
  local aiter i pick k
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
    defines=${pick#*|}
    # The same configuration in the fp32 family (by the prelude's name for it).
    picks+=("${pick%%|*}|mfma|$defines|$(sed 's/-DFAMILY=[0-9]*/-DFAMILY=FAMILY_FP32/' <<<"$defines")")
  done
}
select_cuda() {
  # The first configuration of every (family, tile rows, weight format, act dtype, fp16
  # activations; stream: and its K splits): the list rotates the other options (activation, gate mode,
  # layouts, bias, mask, fp16 output) over them.
  declare -A seen
  local kind arch family defines twin key d
  while IFS=$'\t' read -r kind arch family defines twin; do
    [ "$kind" = emulate ] || continue
    if [ -n "${MOEPLUG_EMULATE_FAMILIES:-}" ] && [[ " $MOEPLUG_EMULATE_FAMILIES " != *" $family "* ]]; then
      continue
    fi
    key=$family
    for d in BM WFMT ACT_Q ACT_F16 SW_KW1 SW_KW2 SW_PF SW_PF_TILE SW_AHEAD QUANT1_IN_ROUTE FUSED_QUANT2; do
      key+=" $(grep -o -- "-D$d=[0-9]*" <<<"$defines" || true)"
    done
    # wgmma: and its weight rows per MMA, blocks per SM, TMA, warp specialisation, work
    # order, register-operand weights, K split, decoding warpgroups, pack copies and bulk
    # pack copies (absent from the other families).
    for d in WG_N WG_MIN_BLOCKS WG_TMA WG_WS WG_GROUP WG_RS WG_KSPLIT WG_DECODERS WG_PACK_COPIES \
      WG_BULK_PACKS; do
      key+=" $(grep -o -- "-D$d=[0-9]*" <<<"$defines" || true)"
    done
    [ -z "${seen[$key]+x}" ] || continue
    seen[$key]=1
    picks+=("$arch|$family|$defines|$twin")
  done <<<"$configs"
}
"select_$target"
# EMULATE_ONLY=ERE: only the selected configurations whose defines match (while developing).
if [ -n "${EMULATE_ONLY:-}" ]; then
  kept=()
  for pick in "${picks[@]}"; do
    if grep -qE -- "$EMULATE_ONLY" <<<"${pick#*|*|}"; then kept+=("$pick"); fi
  done
  picks=("${kept[@]}")
fi

n=0
failed=0
# The fp32 twin's output by its arch and defines: configurations that differ only in what
# the fp32 family does not read (the wgmma block shapes) share one run of it.
declare -A twin_out
for pick in "${picks[@]}"; do
  IFS='|' read -r arch family defines fp32 <<<"$pick"
  n=$((n + 1))
  ref=${twin_out[$arch|$fp32]:-}
  pids=()
  # shellcheck disable=SC2086 # one define per word
  build "$work/family" "$arch" $defines 2>"$work/log.family" &
  pids+=($!)
  : >"$work/log.fp32"
  if [ -z "$ref" ]; then
    # shellcheck disable=SC2086
    build "$work/fp32" "$arch" $fp32 2>"$work/log.fp32" &
    pids+=($!)
  fi
  ok=1
  for pid in "${pids[@]}"; do wait "$pid" || ok=0; done
  if [ $ok -eq 0 ]; then
    cat "$work/log.family" "$work/log.fp32" >"$work/log"
    echo "FAILED    $arch $family $defines: does not build"
    sed 's/^/    /' "$work/log" | head -20
    failed=$((failed + 1))
    continue
  fi
  pids=()
  "$work/family" "$work/family.out" &
  pids+=($!)
  if [ -z "$ref" ]; then
    "$work/fp32" "$work/fp32.$n.out" &
    pids+=($!)
  fi
  ok=1
  for pid in "${pids[@]}"; do wait "$pid" || ok=0; done
  if [ $ok -eq 0 ]; then
    echo "FAILED    $arch $family $defines: a run failed"
    failed=$((failed + 1))
    continue
  fi
  if [ -z "$ref" ]; then
    ref="$work/fp32.$n.out"
    twin_out[$arch|$fp32]=$ref
  fi
  if result=$(compare "$ref" "$work/family.out"); then
    echo "ok        $arch $family $result  $defines"
  else
    echo "FAILED    $arch $family $result  $defines"
    failed=$((failed + 1))
  fi
done

echo "$target emulate check: $n configurations for ${archs[*]} against the fp32 family, $failed failed"
[ "$n" -gt 0 ] && [ "$failed" -eq 0 ]
