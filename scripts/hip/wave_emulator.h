// Host stand-in for the HIP device environment, for scripts/hip_emulate_check.sh: the kernels of
// kernels/fused_moe.cu compiled as ordinary C++ and run with one std::thread per GPU thread.
// A block's 256 threads share the __shared__ arrays (function statics: one block runs at a
// time) and meet at __syncthreads on a std::barrier; a wave's 64 threads meet in each MFMA,
// which is emulated from the ISA's definition of the operation (D = A x B + C on the 16 x 16
// fragments described in kernels/mma_cdna.cuh), independently of the kernels' code.
// This checks the family's indexing, scales and epilogues against the fp32 family on the same
// inputs; it cannot check that the hardware's fragments are what the ISA documents.
// moe_route's dynamic shared array (`extern __shared__ int sm[]`) has no host form: the check
// script compiles a copy of moe_common.cuh where it is a static array of EMU_ROUTE_SHARED ints.
// Never shipped.
#pragma once
#include <math.h>
#include <string.h>

#include <barrier>

#define __HIPCC_RTC__ 1
#define __global__
#define __device__
#define __host__
#define __shared__ static
#define __forceinline__ inline
#define __align__(n) __attribute__((aligned(n)))
#define __launch_bounds__(...)
#define EMU_ROUTE_SHARED 65536

struct emu_uint3 {
  unsigned x, y, z;
};
extern thread_local emu_uint3 threadIdx, blockIdx;
extern std::barrier<>* emu_block_barrier;
extern std::barrier<>* emu_wave_barrier[4];

static inline void __syncthreads() { emu_block_barrier->arrive_and_wait(); }

struct alignas(16) uint4 {
  unsigned x, y, z, w;
};
static inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) {
  return uint4{x, y, z, w};
}
static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }
static inline float __uint_as_float(unsigned u) { return __builtin_bit_cast(float, u); }
static inline unsigned __float_as_uint(float f) { return __builtin_bit_cast(unsigned, f); }
static inline int atomicAdd(int* p, int v) { return __atomic_fetch_add(p, v, __ATOMIC_RELAXED); }
static inline unsigned atomicMax(unsigned* p, unsigned v) {
  return __atomic_fetch_max(p, v, __ATOMIC_RELAXED);
}

// ---- MFMA, from the ISA ------------------------------------------------------------------
typedef float emu_f32x4 __attribute__((ext_vector_type(4)));
typedef short emu_i16x4 __attribute__((ext_vector_type(4)));
typedef _Float16 emu_f16x4 __attribute__((ext_vector_type(4)));

struct EmuWave {
  float a[64][8], b[64][8];  // each lane's A and B elements (4 or 8 per lane)
};
extern EmuWave emu_waves[4];

static inline float emu_bf16(unsigned short h) { return __builtin_bit_cast(float, (unsigned)h << 16); }

// The fp8 value of code c: e4m3fn (bias 7, S.1111.111 NaN) or e4m3fnuz (bias 8, 0x80 NaN).
static inline float emu_fp8(unsigned c, bool fnuz) {
  int e = (c >> 3) & 15, m = c & 7;
  float s = (c & 0x80) ? -1.0f : 1.0f;
  if (fnuz ? c == 0x80 : (c & 0x7f) == 0x7f) return NAN;
  int bias = fnuz ? 8 : 7;
  return s * (e ? ldexpf(1.0f + m / 8.0f, e - bias) : ldexpf(m / 8.0f, 1 - bias));
}

// D (16 x 16) = A (16 x K) x B (K x 16) + C, K = 4 kpl: lane l = li + 16 kq holds A[li][k] and
// B[k][li] for k = kq kpl .. kq kpl + kpl - 1, and D[4 kq + j][li] for j = 0..3.
static inline emu_f32x4 emu_mfma(const float* a, const float* b, emu_f32x4 c, int kpl) {
  int lane = threadIdx.x % 64, w = threadIdx.x / 64;
  EmuWave& wave = emu_waves[w];
  for (int j = 0; j < kpl; ++j) wave.a[lane][j] = a[j], wave.b[lane][j] = b[j];
  emu_wave_barrier[w]->arrive_and_wait();
  int li = lane % 16, kq = lane / 16;
  emu_f32x4 d;
  for (int j = 0; j < 4; ++j) {
    int row = 4 * kq + j;
    float acc = c[j];
    for (int k = 0; k < 4 * kpl; ++k)
      acc += wave.a[row + 16 * (k / kpl)][k % kpl] * wave.b[li + 16 * (k / kpl)][k % kpl];
    d[j] = acc;
  }
  emu_wave_barrier[w]->arrive_and_wait();  // the wave's operands are read before reuse
  return d;
}

static inline emu_f32x4 emu_mfma_bf16(emu_i16x4 a, emu_i16x4 b, emu_f32x4 c) {
  float fa[4], fb[4];
  for (int j = 0; j < 4; ++j) fa[j] = emu_bf16(a[j]), fb[j] = emu_bf16(b[j]);
  return emu_mfma(fa, fb, c, 4);
}
static inline emu_f32x4 emu_mfma_f16(emu_f16x4 a, emu_f16x4 b, emu_f32x4 c) {
  float fa[4], fb[4];
  for (int j = 0; j < 4; ++j) fa[j] = (float)a[j], fb[j] = (float)b[j];
  return emu_mfma(fa, fb, c, 4);
}
static inline emu_f32x4 emu_mfma_fp8(long a, long b, emu_f32x4 c, bool fnuz) {
  float fa[8], fb[8];
  for (int j = 0; j < 8; ++j)
    fa[j] = emu_fp8((a >> (8 * j)) & 255, fnuz), fb[j] = emu_fp8((b >> (8 * j)) & 255, fnuz);
  return emu_mfma(fa, fb, c, 8);
}

#define __builtin_amdgcn_mfma_f32_16x16x16bf16_1k(a, b, c, x, y, z) emu_mfma_bf16(a, b, c)
#define __builtin_amdgcn_mfma_f32_16x16x16f16(a, b, c, x, y, z) emu_mfma_f16(a, b, c)
#if defined(__gfx942__)
#define __builtin_amdgcn_mfma_f32_16x16x32_fp8_fp8(a, b, c, x, y, z) emu_mfma_fp8(a, b, c, true)
#elif defined(__gfx950__)
#define __builtin_amdgcn_mfma_f32_16x16x32_fp8_fp8(a, b, c, x, y, z) emu_mfma_fp8(a, b, c, false)
#endif
