// Host stand-in for the GPU device environment, for scripts/emulate_check.sh: the kernels of
// kernels/fused_moe.cu compiled as ordinary C++ (MP_HOST) and run with one std::thread per GPU
// thread. A block's threads share the __shared__ arrays (function statics: one block runs at a
// time) and meet at __syncthreads on a std::barrier; the lanes of a warp (CUDA, 32) or wave
// (HIP, 64) meet in each matrix instruction, which is emulated from the ISA's definition of the
// operation, independently of the kernels' code: MFMA below (HIP), mma.sync in
// mma_sm80_host.cuh (CUDA, included by kernels/mma_sm80.cuh under MP_HOST).
// This checks a family's indexing, scales and epilogues against the fp32 family on the same
// inputs; it cannot check that the hardware's fragments are what the ISA documents.
// moe_route's dynamic shared array (`extern __shared__ int sm[]`) has no host form: the check
// script compiles a copy of moe_common.cuh where it is a static array of EMU_ROUTE_SHARED ints.
// Build with -DEMU_CUDA for the CUDA families (NVIDIA arch defines), without it for HIP.
// Never shipped.
#pragma once
#include <math.h>
#include <string.h>

#include <barrier>

#define MP_HOST 1
#ifdef EMU_CUDA
#define EMU_LANES 32
#else
#define __HIPCC_RTC__ 1
#define EMU_LANES 64
#endif
#define __global__
#define __device__
#define __host__
#define __shared__ static
#define __forceinline__ inline
#define __align__(n) __attribute__((aligned(n)))
#define __launch_bounds__(...)
#define EMU_ROUTE_SHARED 65536
#define EMU_MAX_GROUPS 32  // warps (waves) of the widest block (moe_route: 1024 threads)

struct emu_uint3 {
  unsigned x, y, z;
};
extern thread_local emu_uint3 threadIdx, blockIdx;
extern std::barrier<>* emu_block_barrier;
// One barrier per warp (wave) of the running block: the lanes of a matrix instruction.
extern std::barrier<>* emu_group_barrier[EMU_MAX_GROUPS];

// The 128-byte lines the stream family asks the L2 for, and those its weight loads read
// (emulate_fused_moe.cpp): every prefetched line must be read by the warp (one line) or the
// block (a bulk range) that asked, or the prefetch addresses are wrong (on a GPU they would
// only cost bandwidth, silently).
void emu_note_prefetch_line(const void* p);
void emu_note_prefetch_range(const void* p, unsigned long bytes);
void emu_note_stream_load(const void* p);

static inline void __syncthreads() { emu_block_barrier->arrive_and_wait(); }
// The block's count of non-zero predicates, returned to every thread.
extern int emu_block_count;
static inline int __syncthreads_count(int pred) {
  if (pred) __atomic_fetch_add(&emu_block_count, 1, __ATOMIC_RELAXED);
  __syncthreads();
  int n = __atomic_load_n(&emu_block_count, __ATOMIC_RELAXED);
  __syncthreads();  // every thread has read it
  if (threadIdx.x == 0) emu_block_count = 0;
  __syncthreads();  // reset before the next use
  return n;
}

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
// PTX prmt (default mode): byte i of the result is byte s_i of the 8-byte {y, x}.
static inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
  unsigned long long v = (unsigned long long)y << 32 | x, r = 0;
  for (int i = 0; i < 4; ++i) r |= ((v >> (8 * ((s >> (4 * i)) & 7))) & 0xff) << (8 * i);
  return (unsigned)r;
}

// ---- element decoders, from the formats' definitions ----------------------------------------
static inline float emu_bf16(unsigned short h) { return __builtin_bit_cast(float, (unsigned)h << 16); }
static inline float emu_f16(unsigned short h) { return (float)__builtin_bit_cast(_Float16, h); }

// The fp8 value of code c: e4m3fn (bias 7, S.1111.111 NaN) or e4m3fnuz (bias 8, 0x80 NaN).
static inline float emu_fp8(unsigned c, bool fnuz) {
  int e = (c >> 3) & 15, m = c & 7;
  float s = (c & 0x80) ? -1.0f : 1.0f;
  if (fnuz ? c == 0x80 : (c & 0x7f) == 0x7f) return NAN;
  int bias = fnuz ? 8 : 7;
  return s * (e ? ldexpf(1.0f + m / 8.0f, e - bias) : ldexpf(m / 8.0f, 1 - bias));
}

#ifdef EMU_CUDA
struct EmuWarp {
  unsigned a[32][4], b[32][2];  // each lane's A and B registers (mma_sm80_host.cuh)
  int vote[32];                 // each lane's predicate (__ballot_sync)
  float shfl[32];               // each lane's value (__shfl_xor_sync)
};
extern EmuWarp emu_warps[EMU_MAX_GROUPS];

// Warp votes over the whole warp (the kernels pass the full mask, every lane converged).
static inline unsigned __ballot_sync(unsigned mask, int pred) {
  (void)mask;
  int lane = threadIdx.x % 32, w = threadIdx.x / 32;
  emu_warps[w].vote[lane] = pred != 0;
  emu_group_barrier[w]->arrive_and_wait();
  unsigned bits = 0;
  for (int l = 0; l < 32; ++l) bits |= (unsigned)emu_warps[w].vote[l] << l;
  emu_group_barrier[w]->arrive_and_wait();  // every lane read the votes before reuse
  return bits;
}
static inline int __any_sync(unsigned mask, int pred) { return __ballot_sync(mask, pred) != 0; }
static inline void __syncwarp(unsigned mask = 0xffffffffu) {
  (void)mask;
  emu_group_barrier[threadIdx.x / 32]->arrive_and_wait();
}
static inline float __shfl_xor_sync(unsigned mask, float v, int lane_mask) {
  (void)mask;
  int lane = threadIdx.x % 32, w = threadIdx.x / 32;
  emu_warps[w].shfl[lane] = v;
  emu_group_barrier[w]->arrive_and_wait();
  float r = emu_warps[w].shfl[(lane ^ lane_mask) & 31];
  emu_group_barrier[w]->arrive_and_wait();  // every lane read before the next exchange
  return r;
}
#else
// ---- MFMA, from the ISA ------------------------------------------------------------------
typedef float emu_f32x4 __attribute__((ext_vector_type(4)));
typedef short emu_i16x4 __attribute__((ext_vector_type(4)));
typedef _Float16 emu_f16x4 __attribute__((ext_vector_type(4)));

struct EmuWave {
  float a[64][8], b[64][8];  // each lane's A and B elements (4 or 8 per lane)
};
extern EmuWave emu_waves[EMU_MAX_GROUPS];

// D (16 x 16) = A (16 x K) x B (K x 16) + C, K = 4 kpl: lane l = li + 16 kq holds A[li][k] and
// B[k][li] for k = kq kpl .. kq kpl + kpl - 1, and D[4 kq + j][li] for j = 0..3.
static inline emu_f32x4 emu_mfma(const float* a, const float* b, emu_f32x4 c, int kpl) {
  int lane = threadIdx.x % 64, w = threadIdx.x / 64;
  EmuWave& wave = emu_waves[w];
  for (int j = 0; j < kpl; ++j) wave.a[lane][j] = a[j], wave.b[lane][j] = b[j];
  emu_group_barrier[w]->arrive_and_wait();
  int li = lane % 16, kq = lane / 16;
  emu_f32x4 d;
  for (int j = 0; j < 4; ++j) {
    int row = 4 * kq + j;
    float acc = c[j];
    for (int k = 0; k < 4 * kpl; ++k)
      acc += wave.a[row + 16 * (k / kpl)][k % kpl] * wave.b[li + 16 * (k / kpl)][k % kpl];
    d[j] = acc;
  }
  emu_group_barrier[w]->arrive_and_wait();  // the wave's operands are read before reuse
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
#endif  // !EMU_CUDA

// ---- dynamic shared memory, warpgroups, asynchronous copies (wgmma family, sm_90) ----------
// The running block's dynamic shared memory (`extern __shared__`, which the check script
// rewrites to this buffer): as many bytes as the launch passes (the host's
// dynamic_shared_bytes), refilled with 0xff bytes (NaN in every operand format) before each
// block, at shared-state-space address EMU_DYN_SHARED_ADDR (not 1024-aligned, as after a
// kernel's static shared arrays on a GPU). Every shared access of the wgmma host forms goes
// through emu_shared_ptr, which stops the run on an access outside it. A static __shared__
// array whose address is taken (the mbarriers) gets a 256-byte window below it, at
// EMU_STATIC_SHARED_ADDR + 256 k: its address names the mbarrier state (mma_sm90_host.cuh);
// no data is accessed through it.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <mutex>

#define EMU_DYN_SHARED_ADDR 0x1230u
#define EMU_STATIC_SHARED_ADDR 0x30u
#define EMU_STATIC_WINDOWS 16
#define EMU_MAX_WARPGROUPS (EMU_MAX_GROUPS / 4)
inline unsigned char* emu_dyn_shared;
inline unsigned emu_dyn_bytes;
// One barrier per warpgroup (4 warps) of the running block: the threads of a wgmma.
inline std::barrier<>* emu_wg_barrier[EMU_MAX_WARPGROUPS];
// Named barrier 1 of the wgmma kernels: their two MMA warpgroups (256 threads).
inline std::barrier<>* emu_consumers_barrier;
// This thread's asynchronous operations (cp.async copies, wgmma) not yet completed: a thread
// that leaves a block with some pending is a kernel bug (the launch stops).
inline thread_local int emu_async_pending;
inline std::mutex emu_static_mu;
inline const void* emu_static_obj[EMU_STATIC_WINDOWS];  // the arrays given windows

[[noreturn]] static inline void emu_fail(const char* what, unsigned long long v) {
  fprintf(stderr, "emulator: %s (%llu; thread %u, block %u,%u)\n", what, v, threadIdx.x,
          blockIdx.x, blockIdx.y);
  fflush(stderr);
  _Exit(3);
}
// The shared-state-space address of a pointer into the dynamic shared memory (cvta).
static inline unsigned emu_shared_addr(const void* p) {
  const unsigned char* c = (const unsigned char*)p;
  if (c >= emu_dyn_shared && c <= emu_dyn_shared + emu_dyn_bytes)
    return EMU_DYN_SHARED_ADDR + (unsigned)(c - emu_dyn_shared);
  std::lock_guard<std::mutex> lock(emu_static_mu);
  for (unsigned k = 0; k < EMU_STATIC_WINDOWS; ++k) {
    if (!emu_static_obj[k]) emu_static_obj[k] = p;
    if (emu_static_obj[k] == p) return EMU_STATIC_SHARED_ADDR + 256 * k;
  }
  emu_fail("shared address: more static shared arrays than windows", (uintptr_t)p);
}
// The bytes [addr, addr + n) of the shared state space.
static inline unsigned char* emu_shared_ptr(unsigned addr, unsigned n) {
  if (addr < EMU_DYN_SHARED_ADDR || addr - EMU_DYN_SHARED_ADDR + (unsigned long long)n > emu_dyn_bytes)
    emu_fail("shared access outside the dynamic shared memory, address", addr);
  return emu_dyn_shared + (addr - EMU_DYN_SHARED_ADDR);
}
#define __grid_constant__
inline emu_uint3 gridDim;  // the running launch's grid (persistent kernels)
