// GEMM family FAMILY_MFMA: AMD matrix cores (MFMA, wave64) on 32 sorted rows x 128 weight rows
// per block, for CDNA3 (gfx942) and CDNA4 (gfx950), every format, layout and dtype pairing.
// Compiled for both archs in CI (scripts/hip_compile_check.sh); it has not run on AMD hardware,
// so the backend's self-test before first use decides whether a device may select it.
//
// The math is tile32's (moe_gemm_tile32.cuh), on MFMA fragments (mma_cdna.cuh): both operands
// are exact in the MMA type and every scale stays out of the MMA, applied in f32 to the fp32
// partial sums per 32 columns of K (K-varying scales: FP8_BLOCK128 / MX weights, FP8_BLOCK128
// / MX activations) or once in the epilogue (per-tensor / per-channel weights, per-token /
// per-tensor activations); the epilogues are moe_common.cuh's. Operand types:
//  - fp8 weights with fp8 activations of the flavour the arch's fp8 MFMA reads (fnuz on
//    gfx942, OCP on gfx950): the codes as they are, v_mfma_f32_16x16x32_fp8_fp8 (MF_FP8);
//  - everything else: 16-bit values, v_mfma_f32_16x16x16_{bf16,f16}: 16-bit weights and
//    activations as they are, fp8 / e2m1 codes as their (exact) values; fp16 against a bf16
//    MMA as exact hi + lo bf16 parts (tile32's SPLIT_A / SPLIT_B).
// Block: 4 waves; wave w owns output columns n0 + 16 w .. + 15 (stage 1: their gate and up
// rows) or n0 + 32 w .. + 31 (stage 2), all 32 rows: 2 x 2 accumulators of 16 x 16.
#pragma once
#include "moe_common.cuh"

#if BM != 32
#error "this family's thread mapping is written for 32-row tiles"
#endif
#ifndef MP_HIP
#error "FAMILY_MFMA is AMD code (hipRTC)"
#endif
#include "mma_cdna.cuh"
#if THREADS != 4 * MFMA_WAVE
#error "the block is 4 waves"
#endif

#define MBK 64   // K step
#define MBR 128  // weight rows per block
#if WFMT == WF_BF16 || WFMT == WF_FP16
#define MPACK 8
#elif WFMT == WF_MXFP4
#define MPACK 32
#else
#define MPACK 16
#endif
#define MNPK (MBK / MPACK)             // packs per row per K step
#define MNPT (MBR * MNPK / THREADS)    // packs per thread per K step
#define MKSW (WFMT == WF_FP8_BLOCK128 || WFMT == WF_MXFP4 || WFMT == WF_MXFP8)
#define MKSA (QG != 0)
#define MFOLD (MKSW || MKSA)

#define MW_FP8 (WFMT == WF_FP8_PER_TENSOR || WFMT == WF_FP8_PER_CHANNEL || \
                WFMT == WF_FP8_BLOCK128 || WFMT == WF_MXFP8)
#define MA_FP8 (ACT_Q == AD_FP8_PER_TOKEN || ACT_Q == AD_FP8_PER_TENSOR || \
                ACT_Q == AD_FP8_BLOCK128 || ACT_Q == AD_MXFP8)
#if defined(MFMA_FP8_FNUZ) && MW_FP8 && MA_FP8 && FP8_FNUZ == MFMA_FP8_FNUZ
#define MF_FP8 1
#else
#define MF_FP8 0
#endif
#if MF_FP8
typedef u8 mel;  // shared operand element: an fp8 code
#else
typedef u16 mel;  // a bf16 / fp16 value
#endif
#define MLD (MBK + 16 / (int)sizeof(mel))  // shared row stride in elements (16-byte rows)

// 16-bit path: the MMA type is fp16 when the activations are fp16 and the weights are not
// bf16, else bf16; an fp16 operand against a bf16 MMA is split into hi + lo parts.
#define MF_F16 (!MF_FP8 && ACT_F16 && !ACT_Q && WFMT != WF_BF16)
#define MF_SPLIT_A (!MF_FP8 && ACT_F16 && !ACT_Q && WFMT == WF_BF16)
#define MF_SPLIT_B (!MF_FP8 && WFMT == WF_FP16 && !MF_F16)

__device__ __forceinline__ u16 mf_to_t(float v) {  // v is exact in the MMA type
#if MF_F16
  return mp_f32_to_f16(v);
#else
  return (u16)(__float_as_uint(v) >> 16);
#endif
}

// hi + lo bf16 parts of an fp16-exact value v (both exact; non-finite v: lo = 0).
__device__ __forceinline__ u16 mf_split_lo(float v, u16 hi) {
  float r = v - mp_bf16_to_f32(hi);
  return r == r ? (u16)(__float_as_uint(r) >> 16) : (u16)0;
}

// Weight code -> MMA-type bits (exact; the scale is applied later); NaN codes -> NaN.
__device__ __forceinline__ u16 mf_w_code(u32 c) {
#if WFMT == WF_MXFP4
  return mf_to_t(mp_e2m1_to_f32(c));
#else
  return mf_to_t(mp_fp8_to_f32(c, FP8_FNUZ));
#endif
}

// 16-byte pack `kp` (MPACK elements from column kp * MPACK) of stored row R of expert e; zero
// past the stored row (Kst columns). Plain-layout rows may not be 16-byte aligned.
__device__ __forceinline__ uint4 mf_load_pack(const u8* W, int e, int R, int kp, int Nst,
                                              int Kst) {
  uint4 v = make_uint4(0u, 0u, 0u, 0u);
  i64 kbytes = (i64)Kst * 16 / MPACK;  // bytes per stored row
  if ((i64)kp * 16 >= kbytes) return v;
  const u8* base = W + (i64)e * Nst * kbytes;
#if WLAYOUT == WL_AITER_16X16
  return *(const uint4*)(base + ((i64)(R >> 4) * (kbytes >> 4) + kp) * 256 + (R & 15) * 16);
#else
  const u8* src = base + (i64)R * kbytes + (i64)kp * 16;
  if ((kbytes & 15) == 0) return *(const uint4*)src;
  u32 w[4] = {0u, 0u, 0u, 0u};
#pragma unroll
  for (int i = 0; i < 16; ++i)
    if ((i64)kp * 16 + i < kbytes) w[i >> 2] |= (u32)src[i] << ((i & 3) * 8);
  return make_uint4(w[0], w[1], w[2], w[3]);
#endif
}

// Block row r (0..127) -> stored weight row R and whether its output column exists.
template <bool GATED>
__device__ __forceinline__ void mf_tile_row(const Params& p, int n0, int r, int& R, bool& ok) {
  int col = GATED ? n0 + (r & 63) : n0 + r;
  ok = col < (GATED ? p.I : p.H);
  R = GATED ? (r < 64 ? gate_row(col, p.Ip) : up_row(col, p.Ip)) : col;
}

// First block row of accumulator nt of wave w (16 rows from there).
template <bool GATED>
__device__ __forceinline__ int mf_brow(int w, int nt) {
  return GATED ? nt * 64 + w * 16 : w * 32 + nt * 16;
}

__device__ __forceinline__ u64 mf_pack2(uint4 v, int half) {
  return half ? ((u64)v.w << 32 | v.z) : ((u64)v.y << 32 | v.x);
}

template <bool GATED>
__device__ void moe_gemm_mfma(const Params& p) {
  __shared__ __align__(16) mel As[BM][MLD];
  __shared__ __align__(16) mel Bs[MBR][MLD];
#if MF_SPLIT_A
  __shared__ __align__(16) u16 As_lo[BM][MLD];
#endif
#if MF_SPLIT_B
  __shared__ __align__(16) u16 Bs_lo[MBR][MLD];
#endif
  __shared__ float Asc[BM][2], Bsc[MBR][2];
  __shared__ int s_row[BM];
  int tile = blockIdx.x;
  if (tile >= *(const int*)p.total_tiles) return;  // empty tile: exit before any load
  int e = ((const int*)p.tile_expert)[tile];
  int tid = threadIdx.x, wave = tid / MFMA_WAVE, lane = tid % MFMA_WAVE;
  int li = mfma_li(lane), kq = mfma_kq(lane);
  int n0 = blockIdx.y * (GATED ? 64 : MBR);
  if (tid < BM) s_row[tid] = ((const int*)p.sorted_rows)[tile * BM + tid];

  int K = GATED ? p.H : p.I;
  int Kst = GATED ? p.Hp : p.Ip;
  int Nst = GATED ? 2 * p.Ip : p.Hp;
  const u8* W = (const u8*)(GATED ? p.w13 : p.w2);
  const u8* S = (const u8*)(GATED ? p.w13_scale : p.w2_scale);
  __syncthreads();

  // This thread's A slot: row ar, 8 columns from ak; its pack slots; its scale slot.
  int ar = tid >> 3, ak = (tid & 7) * 8, aq = s_row[ar];
  i64 arow = aq < 0 ? -1 : (GATED ? aq / p.topk : aq);
  int pr[MNPT], pk[MNPT], pR[MNPT];
  bool pok[MNPT];
#pragma unroll
  for (int j = 0; j < MNPT; ++j) {
    int idx = tid + j * THREADS, rest = idx >> 4;
    pk[j] = rest % MNPK;
    pr[j] = (rest / MNPK) * 16 + (idx & 15);
    mf_tile_row<GATED>(p, n0, pr[j], pR[j], pok[j]);
  }
  int sr = tid >> 1, sg = tid & 1;  // weight-scale slot (MBR x 2 = THREADS)
  int sR;
  bool sok;
  mf_tile_row<GATED>(p, n0, sr, sR, sok);

  mfma_f32x4 acc[2][2];
#pragma unroll
  for (int a = 0; a < 2; ++a)
#pragma unroll
    for (int b = 0; b < 2; ++b) acc[a][b] = mfma_f32x4{0.0f, 0.0f, 0.0f, 0.0f};

  // Registers of one K step in flight.
  uint4 wr[MNPT];
  mel av[8];
#if MF_SPLIT_A
  u16 av_lo[8];
#endif
  float wsc = 0.0f, asc = 0.0f;
  auto fetch = [&](int k0) {
#pragma unroll
    for (int j = 0; j < MNPT; ++j)
      wr[j] = pok[j] ? mf_load_pack(W, e, pR[j], k0 / MPACK + pk[j], Nst, Kst)
                     : make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      int k = k0 + ak + i;
#if MF_FP8
      const u8* codes = (const u8*)(GATED ? p.xq : p.aq);
      av[i] = arow >= 0 && k < K ? codes[arow * K + k] : (u8)0;
#else
      float v = 0.0f;
      if (arow >= 0 && k < K) {
#if ACT_Q
        const u8* codes = (const u8*)(GATED ? p.xq : p.aq);
        v = act_decode(codes[arow * K + k]);
#else
        if (GATED)
          v = load_x(((const u16*)p.x)[arow * p.x_cols + k]);
        else
          v = ACT_F16 ? mp_f16_to_f32(((const u16*)p.inter)[arow * p.I + k])
                      : mp_bf16_to_f32(((const u16*)p.inter)[arow * p.I + k]);
#endif
      }
#if MF_SPLIT_A
      av[i] = mp_f32_to_bf16(v);
      av_lo[i] = mf_split_lo(v, av[i]);
#else
      av[i] = mf_to_t(v);
#endif
#endif
    }
#if MKSW
    {
      int k = k0 + 32 * sg;
      wsc = sok && k < K ? w_scale(S, e, sR, k, Nst, Kst) : 0.0f;
    }
#endif
#if MKSA
    if (tid < 2 * BM) {
      int r = tid >> 1, k = k0 + 32 * (tid & 1), q = s_row[r];
      asc = 0.0f;
      if (q >= 0 && k < K) {
        i64 row = GATED ? q / p.topk : q;
        const float* sc = (const float*)(GATED ? p.xs : p.as);
        asc = sc[row * (GATED ? p.ng1 : p.ng2) + QGROUP(k)];
      }
    }
#endif
  };

  fetch(0);
  for (int k0 = 0; k0 < K; k0 += MBK) {
    // Registers -> shared, columns >= K zeroed (padded weight columns may hold NaN).
#if MF_FP8
    *(u64*)&As[ar][ak] = (u64)(av[0] | av[1] << 8 | av[2] << 16 | (u32)av[3] << 24) |
                         (u64)(av[4] | av[5] << 8 | av[6] << 16 | (u32)av[7] << 24) << 32;
#pragma unroll
    for (int j = 0; j < MNPT; ++j) {
      int kc = pk[j] * MPACK, kg = k0 + kc;
      u32 wv[4] = {wr[j].x, wr[j].y, wr[j].z, wr[j].w};
      if (kg + MPACK > K) {
#pragma unroll
        for (int i = 0; i < 16; ++i)
          if (kg + i >= K) wv[i >> 2] &= ~(0xffu << ((i & 3) * 8));
      }
      *(uint4*)&Bs[pr[j]][kc] = make_uint4(wv[0], wv[1], wv[2], wv[3]);
    }
#else
    *(uint4*)&As[ar][ak] = make_uint4(av[0] | (u32)av[1] << 16, av[2] | (u32)av[3] << 16,
                                      av[4] | (u32)av[5] << 16, av[6] | (u32)av[7] << 16);
#if MF_SPLIT_A
    *(uint4*)&As_lo[ar][ak] =
        make_uint4(av_lo[0] | (u32)av_lo[1] << 16, av_lo[2] | (u32)av_lo[3] << 16,
                   av_lo[4] | (u32)av_lo[5] << 16, av_lo[6] | (u32)av_lo[7] << 16);
#endif
#pragma unroll
    for (int j = 0; j < MNPT; ++j) {
      int kc = pk[j] * MPACK, kg = k0 + kc;
      u16* dst = &Bs[pr[j]][kc];
      u32 wv[4] = {wr[j].x, wr[j].y, wr[j].z, wr[j].w};
#if WFMT == WF_BF16 || WFMT == WF_FP16
      if (kg + MPACK > K) {
#pragma unroll
        for (int i = 0; i < 8; ++i)
          if (kg + i >= K) wv[i >> 1] &= (i & 1) ? 0x0000ffffu : 0xffff0000u;
      }
#if MF_SPLIT_B
      u32 lo[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        float f0 = mp_f16_to_f32((u16)wv[i]), f1 = mp_f16_to_f32((u16)(wv[i] >> 16));
        u16 h0 = mp_f32_to_bf16(f0), h1 = mp_f32_to_bf16(f1);
        lo[i] = mf_split_lo(f0, h0) | (u32)mf_split_lo(f1, h1) << 16;
        wv[i] = h0 | (u32)h1 << 16;
      }
      *(uint4*)&Bs_lo[pr[j]][kc] = make_uint4(lo[0], lo[1], lo[2], lo[3]);
#endif
      *(uint4*)dst = make_uint4(wv[0], wv[1], wv[2], wv[3]);
#else
#pragma unroll
      for (int h = 0; h < MPACK / 8; ++h) {  // 8 elements -> one 16-byte store
        u32 o[4];
#pragma unroll
        for (int i = 0; i < 8; i += 2) {
          int el = h * 8 + i;  // element index inside the pack
#if WFMT == WF_MXFP4
          u32 byte0 = (wv[(el >> 1) >> 2] >> (((el >> 1) & 3) * 8)) & 0xffu;
          u32 c0 = byte0 & 15u, c1 = byte0 >> 4;
#else
          u32 c0 = (wv[el >> 2] >> ((el & 3) * 8)) & 0xffu;
          u32 c1 = (wv[(el + 1) >> 2] >> (((el + 1) & 3) * 8)) & 0xffu;
#endif
          u32 lo = kg + el < K ? mf_w_code(c0) : 0u, hi = kg + el + 1 < K ? mf_w_code(c1) : 0u;
          o[i >> 1] = lo | hi << 16;
        }
        *(uint4*)(dst + h * 8) = make_uint4(o[0], o[1], o[2], o[3]);
      }
#endif
    }
#endif
#if MKSW
    Bsc[sr][sg] = wsc;
#endif
#if MKSA
    if (tid < 2 * BM) Asc[tid >> 1][tid & 1] = asc;
#endif
    __syncthreads();
    if (k0 + MBK < K) fetch(k0 + MBK);  // next step's loads fly during the MFMAs

#pragma unroll
    for (int ks = 0; ks < 2; ++ks) {  // 32 columns of K: one scale group
#if MFOLD
      mfma_f32x4 part[2][2];
#pragma unroll
      for (int a = 0; a < 2; ++a)
#pragma unroll
        for (int b = 0; b < 2; ++b) part[a][b] = mfma_f32x4{0.0f, 0.0f, 0.0f, 0.0f};
#define MACC part
#else
#define MACC acc
#endif
#if MF_FP8
      {
        int kk = ks * 32 + 8 * kq;
        u64 a[2], b[2];
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) a[mt] = *(const u64*)&As[mt * 16 + li][kk];
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) b[nt] = *(const u64*)&Bs[mf_brow<GATED>(wave, nt) + li][kk];
#pragma unroll
        for (int mt = 0; mt < 2; ++mt)
#pragma unroll
          for (int nt = 0; nt < 2; ++nt) mfma_fp8_16x16x32(MACC[mt][nt], a[mt], b[nt]);
      }
#else
#pragma unroll
      for (int kk = ks * 32; kk < ks * 32 + 32; kk += 16) {
        u64 a[2], b[2];
        auto frag_a = [&](const u16(*X)[MLD]) {
#pragma unroll
          for (int mt = 0; mt < 2; ++mt) a[mt] = *(const u64*)&X[mt * 16 + li][kk + 4 * kq];
        };
        auto frag_b = [&](const u16(*X)[MLD]) {
#pragma unroll
          for (int nt = 0; nt < 2; ++nt)
            b[nt] = *(const u64*)&X[mf_brow<GATED>(wave, nt) + li][kk + 4 * kq];
        };
        auto mfmas = [&]() {
#pragma unroll
          for (int mt = 0; mt < 2; ++mt)
#pragma unroll
            for (int nt = 0; nt < 2; ++nt) {
#if MF_F16
              mfma_f16_16x16x16(MACC[mt][nt], a[mt], b[nt]);
#else
              mfma_bf16_16x16x16(MACC[mt][nt], a[mt], b[nt]);
#endif
            }
        };
        frag_a(As);
        frag_b(Bs);
        mfmas();
#if MF_SPLIT_A
        frag_a(As_lo);
        mfmas();
#endif
#if MF_SPLIT_B
        frag_b(Bs_lo);
        mfmas();
#endif
      }
#endif
#undef MACC
#if MFOLD
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            float s = 1.0f;
#if MKSA
            s *= Asc[mt * 16 + 4 * kq + c][ks];
#endif
#if MKSW
            s *= Bsc[mf_brow<GATED>(wave, nt) + li][ks];
#endif
            acc[mt][nt][c] = fmaf(part[mt][nt][c], s, acc[mt][nt][c]);
          }
#endif
    }
    __syncthreads();
  }

  // Epilogue: per-row / per-column scales that do not vary along K, then moe_common's.
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      int r = mt * 16 + 4 * kq + c, q = s_row[r];
      if (q < 0) continue;
      float w = ((const float*)p.topk_weights)[q];
      float sa = 1.0f;
#if ACT_Q && !MKSA
      sa = ((const float*)(GATED ? p.xs : p.as))[(i64)(GATED ? q / p.topk : q) *
                                                  (GATED ? p.ng1 : p.ng2)];
#endif
      if (GATED) {
        int col = n0 + wave * 16 + li;
        if (col >= p.I) continue;
        float g = acc[mt][0][c], u = acc[mt][1][c];
        g = g * sa * epi_w_scale(S, e, gate_row(col, p.Ip), Nst, Kst);
        u = u * sa * epi_w_scale(S, e, up_row(col, p.Ip), Nst, Kst);
        store_gated(p, e, q, col, g, u, w);
      } else {
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
          int col = n0 + mf_brow<false>(wave, nt) + li;
          if (col >= p.H) continue;
          float v = acc[mt][nt][c] * sa;
          v *= epi_w_scale(S, e, col, Nst, Kst);
          store_down(p, e, q, col, v, w);
        }
      }
    }
}

MP_KERNEL void __launch_bounds__(THREADS) moe_stage1(Params p) { moe_gemm_mfma<true>(p); }
MP_KERNEL void __launch_bounds__(THREADS) moe_stage2(Params p) { moe_gemm_mfma<false>(p); }
