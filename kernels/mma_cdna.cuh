// Wave-level matrix-core (MFMA) primitives of AMD CDNA3 (gfx942, MI300) and CDNA4 (gfx950,
// MI355), fp32 accumulation: the AMD counterpart of mma_sm80.cuh. One function per
// instruction shape and operand type, on clang's AMDGPU builtins (hipRTC compiles them).
//
// Fragments of the 16x16 output shapes, wave64 (AMD matrix instruction calculator; CDNA3 ISA
// §7.1): lane = 16 * kq + li with li = mfma_li(lane) in 0..15 and kq = mfma_kq(lane) in 0..3.
//   A (16 x K, row-major): lane holds row li, K elements kq * K/4 .. kq * K/4 + K/4 - 1
//   B (K x 16):           lane holds column li, the same K elements
//   C (16 x 16):          lane holds column li, rows 4 kq .. 4 kq + 3 (c[0..3])
// So with A = activation rows and B = weight rows (one weight row per B column), lane (li, kq)
// ends with rows 4 kq + j of the output for weight row li.
#pragma once
#include "moeplug_port.h"

// MFMA exists only in wave64 mode: the fragments above assume 64 lanes per wave.
#define MFMA_WAVE 64
#if defined(__AMDGCN_WAVEFRONT_SIZE__) && __AMDGCN_WAVEFRONT_SIZE__ != MFMA_WAVE
#error "MFMA kernels need wave64"
#endif

// The fp8 format the fp8 MFMA reads: e4m3fnuz on CDNA3 (gfx942), OCP e4m3fn on CDNA4
// (gfx950). 1 / 0 / undefined (no fp8 MFMA on this arch).
#if defined(__gfx942__)
#define MFMA_FP8_FNUZ 1
#elif defined(__gfx950__)
#define MFMA_FP8_FNUZ 0
#endif

typedef float mfma_f32x4 __attribute__((ext_vector_type(4)));
typedef short mfma_i16x4 __attribute__((ext_vector_type(4)));
typedef _Float16 mfma_f16x4 __attribute__((ext_vector_type(4)));

__device__ __forceinline__ int mfma_li(int lane) { return lane & 15; }
__device__ __forceinline__ int mfma_kq(int lane) { return lane >> 4; }

// v_mfma_f32_16x16x16_bf16: a, b hold 4 bf16 each (element j in bits 16 j .. 16 j + 15).
__device__ __forceinline__ void mfma_bf16_16x16x16(mfma_f32x4& c, u64 a, u64 b) {
  c = __builtin_amdgcn_mfma_f32_16x16x16bf16_1k(__builtin_bit_cast(mfma_i16x4, a),
                                                 __builtin_bit_cast(mfma_i16x4, b), c, 0, 0, 0);
}

// v_mfma_f32_16x16x16_f16: a, b hold 4 fp16 each.
__device__ __forceinline__ void mfma_f16_16x16x16(mfma_f32x4& c, u64 a, u64 b) {
  c = __builtin_amdgcn_mfma_f32_16x16x16f16(__builtin_bit_cast(mfma_f16x4, a),
                                             __builtin_bit_cast(mfma_f16x4, b), c, 0, 0, 0);
}

#ifdef MFMA_FP8_FNUZ
// v_mfma_f32_16x16x32_fp8_fp8: a, b hold 8 fp8 codes each (element j in byte j), of the
// arch's flavour (MFMA_FP8_FNUZ).
__device__ __forceinline__ void mfma_fp8_16x16x32(mfma_f32x4& c, u64 a, u64 b) {
  c = __builtin_amdgcn_mfma_f32_16x16x32_fp8_fp8((long)a, (long)b, c, 0, 0, 0);
}
#endif
