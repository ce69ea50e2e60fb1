// moeplug portability header: the few types and conversions the kernels need, for NVRTC
// (CUDA) and hipRTC (HIP). No standard headers: run-time compilers ship none by default.
#pragma once

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;
typedef long long i64;

#define MP_KERNEL extern "C" __global__

#if defined(__HIPCC_RTC__) || defined(__HIP_DEVICE_COMPILE__)
#define MP_HIP 1
#endif

__device__ __forceinline__ float mp_bf16_to_f32(u16 h) { return __uint_as_float(((u32)h) << 16); }

// Round to nearest even; NaN stays a (quiet) NaN.
__device__ __forceinline__ u16 mp_f32_to_bf16(float f) {
  u32 u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (u16)((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (u16)(u >> 16);
}

// MP_HOST: compiled as host C++ by the emulator (scripts/emu), which has _Float16 but no PTX.
#if defined(MP_HIP) || defined(MP_HOST)
__device__ __forceinline__ float mp_f16_to_f32(u16 h) {
  _Float16 v = __builtin_bit_cast(_Float16, h);
  return (float)v;
}
__device__ __forceinline__ u16 mp_f32_to_f16(float f) {
  return __builtin_bit_cast(u16, (_Float16)f);
}
#else
__device__ __forceinline__ float mp_f16_to_f32(u16 h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}
__device__ __forceinline__ u16 mp_f32_to_f16(float f) {
  u16 h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
}
#endif

// e8m0 block scale: 2^(b-127); 0 is 2^-127, 255 is NaN (AITER's decoding).
__device__ __forceinline__ float mp_e8m0_to_f32(u32 b) {
  if (b == 0) return __uint_as_float(0x00400000u);
  if (b == 255) return __uint_as_float(0x7f800001u);
  return __uint_as_float(b << 23);
}

// OCP e2m1 code (low 4 bits).
// Built from bits (no table: a run-time indexed array lands in local memory).
__device__ __forceinline__ float mp_e2m1_to_f32(u32 c) {
  u32 e = (c >> 1) & 3u, m = c & 1u;
  u32 mag = e ? ((e + 126u) << 23) | (m << 22) : (m ? 0x3f000000u : 0u);  // 0, 0.5 subnormal
  return __uint_as_float(mag | ((c & 8u) << 28));
}

// fp8 e4m3fn (bias 7, S.1111.111 NaN) or, with fnuz, e4m3fnuz (bias 8, 0x80 NaN).
__device__ __forceinline__ float mp_fp8_to_f32(u32 b, bool fnuz) {
  u32 exp = (b >> 3) & 15u, man = b & 7u;
  float sign = (b & 0x80u) ? -1.0f : 1.0f;
  if (fnuz) {
    if (b == 0x80u) return __uint_as_float(0x7fc00000u);
    if (exp == 0) return sign * (float)man * 0.0009765625f;  // man/8 * 2^-7
    return sign * __uint_as_float(((exp - 8u + 127u) << 23) | (man << 20));
  }
  if (exp == 15u && man == 7u) return __uint_as_float(0x7fc00000u);
  if (exp == 0) return sign * (float)man * 0.001953125f;  // man/8 * 2^-6
  return sign * __uint_as_float(((exp - 7u + 127u) << 23) | (man << 20));
}

// ---- encoders (activation quantization; the CPU's src/moe/actquant.rs bit for bit) --------

// f32 -> fp8 code: round to nearest even on the 3-bit mantissa grid, saturating at +-max
// (448 e4m3fn, 240 e4m3fnuz); NaN -> the NaN code; fnuz has no negative zero.
__device__ __forceinline__ u32 mp_f32_to_fp8(float x, bool fnuz) {
  if (x != x) return fnuz ? 0x80u : 0x7fu;
  u32 sign = (__float_as_uint(x) >> 31) << 7;
  float a = fabsf(x);
  u32 max_code = fnuz ? 0x7fu : 0x7eu;
  if (a >= (fnuz ? 240.0f : 448.0f)) return sign | max_code;
  int bias = fnuz ? 8 : 7, min_e = 1 - bias;
  int e = (int)((__float_as_uint(a) >> 23) & 255u) - 127;
  if (e < min_e) e = min_e;  // subnormals share the smallest normal binade's quantum
  // a / 2^(e-3) is exact (a power-of-two scaling): one rounding, to nearest even.
  float q = rintf(a * __uint_as_float((u32)(127 + 3 - e) << 23));
  // q in [8, 16] for normal binades, [0, 16] for the smallest: one formula for both.
  u32 code = (u32)((e + bias - 1) << 3) + (u32)q;
  if (code > max_code) code = max_code;
  if (code == 0) return fnuz ? 0u : sign;
  return sign | code;
}

// f32 -> e2m1 code: nearest magnitude, ties to the even code, |x| >= 6 saturates, NaN -> 3.
__device__ __forceinline__ u32 mp_f32_to_e2m1(float x) {
  if (x != x) return 3u;
  u32 sign = (__float_as_uint(x) >> 31) << 3;
  float a = fabsf(x);
  const float mid[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
  u32 code = 0;
#pragma unroll
  for (int i = 0; i < 7; ++i)
    if (a > mid[i] || (a == mid[i] && (i & 1))) code = i + 1;  // a tie stays on the even code
  return sign | code;
}

// e8m0 RoundUp (AITER's default): the smallest power of two >= amax / max_pos; NaN/inf -> 255.
__device__ __forceinline__ u32 mp_e8m0_round_up(float amax, float max_pos) {
  float v = amax / max_pos;  // IEEE division (NVRTC default -prec-div=true)
  u32 bits = __float_as_uint(v);
  u32 exp = (bits >> 23) & 255u, mant = bits & 0x7fffffu;
  if (exp == 255u) return 255u;
  return exp + (mant != 0u ? 1u : 0u);
}
