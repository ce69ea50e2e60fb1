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

#ifdef MP_HIP
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
__device__ __forceinline__ float mp_e2m1_to_f32(u32 c) {
  const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  float m = mag[c & 7];
  return (c & 8) ? -m : m;
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
