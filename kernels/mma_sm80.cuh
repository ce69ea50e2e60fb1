// Warp-level MMA primitives of CUDA sm_80+ (mma.sync), fp32 accumulation. One function per
// instruction shape and operand type; the fragment layouts are PTX's (ISA "Matrix Fragments
// for mma.m16n8k16 / m16n8k32"): lane = 4 * gid + tig; A (16 x K, row) in a0..a3 = rows gid,
// gid+8 at K offsets tig and tig + K/2; B (K x 8, col) in b0, b1 = column gid; C (16 x 8) in
// c0..c3 = rows gid (c0, c1) and gid+8 (c2, c3), columns 2 tig, 2 tig + 1.
#pragma once
#include "moeplug_port.h"

#ifdef MP_HOST
// Compiled as host C++ by the emulator: the same functions, computed from the ISA's fragment
// definitions above (scripts/emu/mma_sm80_host.cuh).
#include "mma_sm80_host.cuh"
#else

__device__ __forceinline__ void mma_bf16_16816(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0,
                                               u32 b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void mma_f16_16816(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0,
                                              u32 b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// fp8 e4m3 (OCP e4m3fn) x e4m3, K = 32: sm_89+. Each register holds 4 codes.
__device__ __forceinline__ void mma_e4m3_16832(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0,
                                               u32 b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
#endif  // MP_HOST
