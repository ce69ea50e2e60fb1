// kernels/mma_sm80.cuh's instructions on the host, for scripts/emulate_check.sh cuda (included
// by that header under MP_HOST; gpu_emulator.h provides the threads and warp barriers). Each
// warp-wide mma.sync is computed from the PTX ISA's fragment definitions ("Matrix Fragments
// for mma.m16n8k16 / mma.m16n8k32"), written here independently of the kernels' indexing:
// lane = 4 gid + tig; A (16 x K, row-major) register r holds kpl consecutive k of
// row gid + 8 (r & 1) starting at kpl tig + (K / 2)(r >> 1); B (K x 8, column) register r holds
// kpl consecutive k of column gid starting at kpl tig + (K / 2) r; C (16 x 8) c0, c1 are row gid
// and c2, c3 row gid + 8, columns 2 tig and 2 tig + 1. K = 8 kpl (kpl = 2 for 16-bit, 4 for fp8).
// Products are summed in double and rounded once: the hardware's fp32 sums differ from it by
// rounding only, far inside the check's tolerance.
#pragma once

// Element j (0 = lowest bits) of a register holding kpl elements.
static inline float emu_element(unsigned reg, int j, int kpl, int kind) {
  if (kpl == 2) {
    unsigned short h = (unsigned short)(reg >> (16 * j));
    return kind == 1 ? emu_f16(h) : emu_bf16(h);
  }
  return emu_fp8((reg >> (8 * j)) & 255u, false);  // e4m3 (OCP): sm_89+
}

// kind: 0 bf16, 1 f16, 2 e4m3.
static inline void emu_mma_m16n8(float* c, const unsigned* a, const unsigned* b, int kind) {
  int kpl = kind == 2 ? 4 : 2, K = 8 * kpl, half = K / 2;
  int lane = threadIdx.x % 32, w = threadIdx.x / 32;
  EmuWarp& warp = emu_warps[w];
  for (int r = 0; r < 4; ++r) warp.a[lane][r] = a[r];
  for (int r = 0; r < 2; ++r) warp.b[lane][r] = b[r];
  emu_group_barrier[w]->arrive_and_wait();
  int gid = lane / 4, tig = lane % 4;
  float d[4];
  for (int i = 0; i < 4; ++i) {
    int row = gid + 8 * (i >> 1), col = 2 * tig + (i & 1);
    double acc = c[i];
    for (int k = 0; k < K; ++k) {
      int hk = k / half, kk = k % half;  // which half of K, and the k inside it
      int a_lane = 4 * (row % 8) + kk / kpl, a_reg = (row / 8) + 2 * hk;
      int b_lane = 4 * col + kk / kpl, b_reg = hk;
      float av = emu_element(warp.a[a_lane][a_reg], kk % kpl, kpl, kind);
      float bv = emu_element(warp.b[b_lane][b_reg], kk % kpl, kpl, kind);
      acc += (double)av * (double)bv;
    }
    d[i] = (float)acc;
  }
  emu_group_barrier[w]->arrive_and_wait();  // every lane read the operands before reuse
  for (int i = 0; i < 4; ++i) c[i] = d[i];
}

static inline void mma_bf16_16816(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
  const unsigned a[4] = {a0, a1, a2, a3}, b[2] = {b0, b1};
  emu_mma_m16n8(c, a, b, 0);
}
static inline void mma_f16_16816(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
  const unsigned a[4] = {a0, a1, a2, a3}, b[2] = {b0, b1};
  emu_mma_m16n8(c, a, b, 1);
}
static inline void mma_e4m3_16832(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
  const unsigned a[4] = {a0, a1, a2, a3}, b[2] = {b0, b1};
  emu_mma_m16n8(c, a, b, 2);
}
