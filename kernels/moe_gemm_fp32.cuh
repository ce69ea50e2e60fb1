// GEMM family FAMILY_FP32: fp32 FMA over shared-memory tiles. Runs anywhere (HIP, CUDA below
// sm_80, any format / layout / dtype); the reference the faster families are checked against.
#pragma once
#include "moe_common.cuh"

#if BM != 32
#error "this family's thread mapping is written for 32-row tiles"
#endif

#define BN 64  // output columns per block
#define BK 32  // K step

// Stage 1 (S1) or stage 2: one block computes BM sorted rows x BN output columns of one
// expert with fp32 FMA over shared-memory tiles. Thread (ty, tx) owns rows 2ty..2ty+1 and
// columns 4tx..4tx+3. A gated stage 1 (GATED) reads a gate and an up row per column.
template <bool S1>
__device__ void moe_gemm(const Params& p) {
  constexpr bool GATED = S1 && GATED_ACT;
  __shared__ float As[BK][BM + 1];
  __shared__ float Bs[GATED ? 2 : 1][BK][BN + 4];
  __shared__ int s_row[BM];
  int n0 = blockIdx.y * BN;
  if (!S1 && combine_zero_block(p, n0, BN)) return;
  int tile = blockIdx.x;  // x: up to 2^31-1 tiles; y: column blocks
  if (tile >= *(const int*)p.total_tiles) return;
  int e = ((const int*)p.tile_expert)[tile];
  int tid = threadIdx.x, ty = tid >> 4, tx = tid & 15;
  if (tid < BM) s_row[tid] = ((const int*)p.sorted_rows)[tile * BM + tid];

  // stage 1: A = x rows (K = H), B = w13 rows; stage 2: A = intermediate rows (K = I), B = w2.
  int K = S1 ? p.H : p.I;                               // logical K: padded columns skipped
  int Kst = S1 ? p.Hp : p.Ip;                           // K of the stored matrix
  int Nst = S1 ? (GATED ? 2 : 1) * p.Ip : p.Hp;         // rows of the stored matrix
  int Ncols = S1 ? p.I : p.H;                           // logical output columns
  const u8* W = (const u8*)(S1 ? p.w13 : p.w2);
  const u8* S = (const u8*)(S1 ? p.w13_scale : p.w2_scale);
  const u16* A = (const u16*)(S1 ? p.x : p.inter);
  float acc[GATED ? 2 : 1][2][4];
  for (int g = 0; g < (GATED ? 2 : 1); ++g)
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 4; ++j) acc[g][i][j] = 0.0f;
  __syncthreads();

  for (int k0 = 0; k0 < K; k0 += BK) {
    for (int idx = tid; idx < BM * BK; idx += THREADS) {
      int r = idx / BK, kk = idx % BK, k = k0 + kk, q = s_row[r];
      float v = 0.0f;
      if (q >= 0 && k < K) {
#if ACT_Q
        // code * scale, the value the CPU's quantize-dequantize gives (one f32 rounding).
        i64 arow = S1 ? q / p.topk : q;
        const u8* codes = (const u8*)(S1 ? p.xq : p.aq);
        const float* sc = (const float*)(S1 ? p.xs : p.as);
        int ng = S1 ? p.ng1 : p.ng2;
        v = act_decode(codes[arow * K + k]) * sc[arow * ng + QGROUP(k)];
#else
        if (S1)
          v = load_x(A[(i64)(q / p.topk) * p.x_cols + k]);
        else  // the intermediate is stored in the activation dtype
          v = INTER_F16 ? mp_f16_to_f32(A[(i64)q * p.I + k]) : mp_bf16_to_f32(A[(i64)q * p.I + k]);
#endif
      }
      As[kk][r] = v;
    }
    for (int idx = tid; idx < (GATED ? 2 : 1) * BN * BK; idx += THREADS) {
      int c = idx / BK, kk = idx % BK, k = k0 + kk;
      int half = c / BN, col = n0 + c % BN;
      float v = 0.0f;
      if (col < Ncols && k < K) {
        int row = GATED ? (half ? up_row(col, p.Ip) : gate_row(col, p.Ip))
                        : S1 ? up_row(col, p.Ip) : col;
        v = load_w(W, S, e, row, k, Nst, Kst);
      }
      Bs[half][kk][c % BN] = v;
    }
    __syncthreads();
#pragma unroll 8
    for (int kk = 0; kk < BK; ++kk) {
      float a0 = As[kk][2 * ty], a1 = As[kk][2 * ty + 1];
      for (int g = 0; g < (GATED ? 2 : 1); ++g)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          float b = Bs[g][kk][4 * tx + j];
          acc[g][0][j] = fmaf(a0, b, acc[g][0][j]);
          acc[g][1][j] = fmaf(a1, b, acc[g][1][j]);
        }
    }
    __syncthreads();
  }

  // Unrolled so that acc is indexed by constants and stays in registers (a rolled loop
  // put it on the stack for some epilogues).
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    int q = s_row[2 * ty + i];
    if (q < 0) continue;
    float w = ((const float*)p.topk_weights)[q];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      int col = n0 + 4 * tx + j;
      if (col >= Ncols) continue;
      if (S1) {  // non-gated: the one accumulator is the up output
        store_gated(p, e, q, col, acc[0][i][j], acc[GATED ? 1 : 0][i][j], w);
      } else {
        store_down(p, e, q, col, acc[0][i][j], w);
      }
    }
  }
  if (!S1) combine_arrive(p, s_row, n0, BN);
}

// At least one block per SM, so ptxas may use the registers it needs: with THREADS alone it
// aimed at an occupancy and spilled (int4 decodes on sm_80 / sm_90, 40-48 registers).
MP_KERNEL void __launch_bounds__(THREADS, 1) moe_stage1(Params p) { moe_gemm<true>(p); }
MP_KERNEL void __launch_bounds__(THREADS, 1) moe_stage2(Params p) { moe_gemm<false>(p); }
