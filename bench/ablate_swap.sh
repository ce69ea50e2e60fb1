#!/usr/bin/env bash
# Timing ablations of the swap-AB MXFP4 kernel (results wrong by construction; time them with
# AB_ANY_RESULT=1 bench/ab.sh): builds, from the working tree's kernels, one library per
# variant into target/<variant>/libmoeplug.so, and restores the source.
#   no_mma     the MMAs replaced by an XOR of each fragment into a sink (decode and loads alone)
#   no_decode  the decode replaced by the raw pack words (MMAs and loads alone)
#   bash bench/ablate_swap.sh no_mma no_decode
# Session 25 (bench/NOTES.md, call 41) ran the two by hand; the edits below are the same.
set -euo pipefail
cd "$(dirname "$0")/.."
src=kernels/moe_gemm_wgmma_swap.cuh
keep=$(mktemp)
cp "$src" "$keep"
trap 'cp "$keep" "$src"; rm -f "$keep"; cargo build --release -q' EXIT
for v in "$@"; do
  python3 - "$src" "$keep" "$v" <<'PY'
import re, sys
src, orig, variant = sys.argv[1:]
s = open(orig).read()
if variant == "no_mma":
    mma = re.compile(r"        if constexpr \(N == 32\)\n.*?wgmma_bf16_rs_n128\([^\n]*\n", re.S)
    s, n = mma.subn("        sink ^= f[m][s][0] ^ f[m][s][1] ^ f[m][s][2] ^ f[m][s][3];\n", s)
    s = s.replace("  u32 pk[1 + AHEAD][2][2][4];  // [buffer][m][h][word]\n",
                  "  u32 pk[1 + AHEAD][2][2][4];  // [buffer][m][h][word]\n  u32 sink = 0u;\n", 1)
    s = s.replace("    wgmma_wait<1>();  // group grp - 1 is done: its fragment set may be rewritten\n  }\n}",
                  "    wgmma_wait<1>();  // group grp - 1 is done: its fragment set may be rewritten\n  }\n"
                  "  acc[0][0] += (float)(sink & 1u);\n}", 1)
    assert n == 1 and "sink & 1u" in s, "no_mma: the kernel changed; update bench/ablate_swap.sh"
elif variant == "no_decode":
    dec = re.compile(r"      u32 o\[4\];\n      mx_e2m1_bytes2\([^\n]*\n      mx_e2m1_bytes2\([^\n]*\n")
    s, n = dec.subn("      u32 o[4] = {v[0], v[1] ^ f1, v[2], v[3]};\n", s)
    assert n == 1, "no_decode: the kernel changed; update bench/ablate_swap.sh"
else:
    sys.exit(f"unknown variant {variant}")
open(src, "w").write(s)
PY
  cargo build --release -q
  mkdir -p "target/$v"
  cp target/release/libmoeplug.so "target/$v/"
  echo "target/$v/libmoeplug.so"
done
