// MXFP4 -> bf16 in registers with bit operations (CUDA sm_80+ tensor-core families): 8 e2m1
// codes of a 32-bit word become bf16 pairs by shifts and masks, and the e8m0 scale is folded in
// by exact bf16 multiplies (MX scales are powers of two).
#pragma once
#include "moeplug_port.h"

// Codes p and p + 4 of the 8 e2m1 codes in `v` as a bf16 pair times 2^-126 (the code's
// exponent and mantissa bits placed at the bottom of the bf16 exponent; exact, subnormal for
// 0.5): the multiply by 2^126 * scale restores the value.
template <int P>
__device__ __forceinline__ u32 mx_e2m1_pair(u32 v) {
  u32 mag = P <= 1 ? v << (6 - 4 * P) : v >> (4 * P - 6);
  u32 sgn = v << (12 - 4 * P);
  return (mag & 0x01C001C0u) | (sgn & 0x80008000u);
}

__device__ __forceinline__ u32 mx_bf16x2_mul(u32 a, u32 b) {
#ifdef MP_HOST  // the emulator (scripts/emu): bf16 x bf16 is exact in f32, one rounding
  float lo = mp_bf16_to_f32((u16)a) * mp_bf16_to_f32((u16)b);
  float hi = mp_bf16_to_f32((u16)(a >> 16)) * mp_bf16_to_f32((u16)(b >> 16));
  return (u32)mp_f32_to_bf16(lo) | (u32)mp_f32_to_bf16(hi) << 16;
#else
  u32 d;
  // fma with -0 is an exact multiply on sm_80 (mul.bf16x2 needs sm_90); bf16 keeps subnormals.
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(0x80008000u));
  return d;
#endif
}

// The two bf16 multipliers that turn mx_e2m1_pair's output into code * 2^(b - 127): one
// multiply by 2^(b - 1) when that is a normal bf16 (b <= 128), else 2^126 then 2^(b - 127)
// (b = 255: NaN, as the CPU's decoding).
__device__ __forceinline__ void mx_factors(u32 b, u32& f1, u32& f2) {
  u32 h1 = b <= 128u ? (b + 126u) << 7 : 0x7E80u;
  u32 h2 = b <= 128u ? 0x3F80u : b == 255u ? 0x7FC0u : b << 7;
  f1 = h1 | h1 << 16;
  f2 = h2 | h2 << 16;
}

// Codes 2 j, 2 j + 1 of the word `v` for j = 0..3 (natural K order, for operand tiles that are
// read with the activations' order), decoded and scaled as above.
__device__ __forceinline__ void mx_e2m1_word(u32 v, u32 f1, u32 f2, bool twice, u32 out[4]) {
  u32 p04 = mx_e2m1_pair<0>(v), p15 = mx_e2m1_pair<1>(v);
  u32 p26 = mx_e2m1_pair<2>(v), p37 = mx_e2m1_pair<3>(v);
  out[0] = __byte_perm(p04, p15, 0x5410);  // codes 0, 1
  out[1] = __byte_perm(p26, p37, 0x5410);  // codes 2, 3
  out[2] = __byte_perm(p04, p15, 0x7632);  // codes 4, 5
  out[3] = __byte_perm(p26, p37, 0x7632);  // codes 6, 7
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    out[j] = mx_bf16x2_mul(out[j], f1);
    if (twice) out[j] = mx_bf16x2_mul(out[j], f2);
  }
}
