// MXFP4 -> bf16 in registers with bit operations (CUDA sm_80+ tensor-core families): 8 e2m1
// codes of a 32-bit word become bf16 pairs by shifts and masks, and the e8m0 scale is folded in
// by exact bf16 multiplies (MX scales are powers of two).
#pragma once
#include "moeplug_port.h"

// Code pair P of `v` (P = 0..3: codes P and P + 4 of its 8 e2m1 codes) is a bf16 pair times
// 2^-126: each code's sign at bit 15 of its half, its exponent and mantissa bits at bits 8..6
// (the bottom of the bf16 exponent; exact, subnormal for 0.5), so that the multiply by
// 2^126 * scale restores the value. mx_e2m1_pair2<S> gives pairs 2 S and 2 S + 1.
//
// Written directly, a pair is two shifts and two masks. Here one word y holds the magnitude
// bits of codes 2 S, 2 S + 1 (and + 4) at the bottom of each half and their signs 6 bits
// higher (where no magnitude bit is), so each pair is one left shift and one mask of y: 6-7
// instructions per two pairs instead of 8. Left shifts, so that ptxas can put them on the FMA
// pipe (IMAD.SHL) beside the LOP3s; rotations, which would save the S = 1 shift, cannot go
// there.
template <int S>
__device__ __forceinline__ void mx_e2m1_pair2(u32 v, u32& lo, u32& hi) {
  constexpr u32 MAGS = 0x00770077u, PAIR = 0x81C081C0u;  // y's magnitude bits; a pair's bits
  u32 mags = S ? v >> 8 : v, sgns = S ? v >> 2 : v << 6, y;
#ifdef MP_HOST
  y = (mags & MAGS) | (sgns & ~MAGS);
#else
  // As asm: written in C, the compiler distributes the shifts below over this select and is
  // back at two shifts and two masks per pair (SASS).
  asm("lop3.b32 %0, %1, %2, %3, 0xE4;" : "=r"(y) : "r"(mags), "r"(sgns), "n"(MAGS));
#endif
  lo = (y << 6) & PAIR;
  hi = (y << 2) & PAIR;
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

// The two bf16 multipliers that turn a decoded code pair into code * 2^(b - 127): one
// multiply by 2^(b - 1) when that is a normal bf16 (b <= 128), else 2^126 then 2^(b - 127)
// (b = 255: NaN, as the CPU's decoding).
__device__ __forceinline__ void mx_factors(u32 b, u32& f1, u32& f2) {
  u32 h1 = b <= 128u ? (b + 126u) << 7 : 0x7E80u;
  u32 h2 = b <= 128u ? 0x3F80u : b == 255u ? 0x7FC0u : b << 7;
  f1 = h1 | h1 << 16;
  f2 = h2 | h2 << 16;
}

// Whether one of the four e8m0 scales (bytes) of x exceeds 128, i.e. needs mx_factors' second
// multiply: bit 7 set and a low bit set (the low 7 bits plus 0x7F carry into bit 7 exactly
// when one of them is set, never into the next byte).
__device__ __forceinline__ bool mx_any_scale_above_128(u32 x) {
  return (((x & 0x7F7F7F7Fu) + 0x7F7F7F7Fu) & x & 0x80808080u) != 0u;
}

// mx_factors' f1 where b <= 128 (then f2 is 1), in one IMAD: ((b + 126) << 7) in both halves.
__device__ __forceinline__ u32 mx_factor_small(u32 b) { return b * 0x00800080u + 0x3F003F00u; }

// mx_factor_small of the scale bytes HI and HI + 2 of x, one per half (HI = 0: bytes 0 and 2),
// for mx_half_dup: two multipliers from one IMAD, without a byte extract per scale.
template <int HI>
__device__ __forceinline__ u32 mx_factor_small_pair(u32 x) {
  return ((HI ? x >> 8 : x) & 0x00FF00FFu) * 0x80u + 0x3F003F00u;
}

// Half H of x in both halves. Written as 16-bit moves so that ptxas folds it into the bf16
// multiply that reads it (an .H0_H0 / .H1_H1 operand, SASS) rather than issue a PRMT.
template <int H>
__device__ __forceinline__ u32 mx_half_dup(u32 x) {
#ifdef MP_HOST
  return (H ? x >> 16 : x & 0xFFFFu) * 0x10001u;
#else
  u32 d;
  if (H)
    asm("{ .reg .b16 l, h; mov.b32 {l, h}, %1; mov.b32 %0, {h, h}; }" : "=r"(d) : "r"(x));
  else
    asm("{ .reg .b16 l, h; mov.b32 {l, h}, %1; mov.b32 %0, {l, l}; }" : "=r"(d) : "r"(x));
  return d;
#endif
}

// Codes 2 j, 2 j + 1 of the word `v` for j = 0..3 (natural K order, for operand tiles that are
// read with the activations' order), decoded and scaled as above.
__device__ __forceinline__ void mx_e2m1_word(u32 v, u32 f1, u32 f2, bool twice, u32 out[4]) {
  u32 p04, p15, p26, p37;
  mx_e2m1_pair2<0>(v, p04, p15);
  mx_e2m1_pair2<1>(v, p26, p37);
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

// Two code pairs of two bytes: u holds byte X at byte 0 and byte Y at byte 2 (bytes 1 and 3 are
// ignored). out[0] = X's codes (low nibble in the low half), out[1] = Y's, decoded and scaled
// as above. Only mx_e2m1_pair2<0>'s left shifts: with the PRMT that places the two bytes, 6
// integer-pipe instructions per two registers, against 7.5 for mx_e2m1_word after a 4-byte
// gather (wg_rs_codes) in register-operand kernels, whose threads keep one byte of each pack
// word.
__device__ __forceinline__ void mx_e2m1_bytes2(u32 u, u32 f1, u32 f2, bool twice, u32 out[2]) {
  u32 lo, hi;  // [X low, Y low], [X high, Y high]
  mx_e2m1_pair2<0>(u, lo, hi);
  out[0] = __byte_perm(lo, hi, 0x5410);
  out[1] = __byte_perm(lo, hi, 0x7632);
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    out[j] = mx_bf16x2_mul(out[j], f1);
    if (twice) out[j] = mx_bf16x2_mul(out[j], f2);
  }
}
