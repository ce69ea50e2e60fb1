#pragma once
#include "moe_common.cuh"

#if BM != 32
#error "this family's thread mapping is written for 32-row tiles"
#endif
#include "mma_sm80.cuh"

// GEMM family FAMILY_TILE32: mma.sync on 32 sorted rows x 128 weight rows per block (CUDA
// sm_80+), every format, layout and dtype pairing: the general tensor-core path.
//
// mma.sync m16n8k16 with fp32 accumulation. Both operands are exact in the MMA type T (bf16,
// or fp16 when the activations are fp16): 16-bit weights and activations as they are, fp8 /
// e2m1 codes as their values; every scale stays out of the MMA and is applied in f32 to the
// fp32 partial sums, per 32 columns of K (K-varying scales: FP8_BLOCK128 / MX weights,
// FP8_BLOCK128 / MX activations) or once in the epilogue (per-tensor / per-channel weights,
// per-token / per-tensor activations). So the only difference from the CPU backend is the
// order (and internal precision) of the f32 sums. A block computes BM sorted rows x 128
// weight rows (stage 1: 64 gate + 64 up rows of the same 64 output columns; stage 2: 128
// output columns), K in steps of TBK; weights arrive as 16-byte packs (F1 stores 16 rows of
// one pack contiguously), prefetched into registers while the previous step computes.
#define TBK 64               // K step
#define TBR 128              // weight rows per block
#define TLD (TBK + 8)        // shared row stride in 16-bit elements (conflict-free fragments)
#define BN2 128              // stage-2 output columns per block
#if WFMT == WF_BF16 || WFMT == WF_FP16
#define PACK 8
#elif WFMT == WF_MXFP4  // 16 bytes hold 32 e2m1 codes in every layout
#define PACK 32
#else
#define PACK 16
#endif
#define NPK (TBK / PACK)                // packs per row per K step
#define NPT (TBR * NPK / THREADS)       // packs per thread per K step
#define KSW (WFMT == WF_FP8_BLOCK128 || WFMT == WF_MXFP4 || WFMT == WF_MXFP8)  // weight scale varies along K
#define KSA (QG != 0)                              // activation scale varies along K
#define FOLD (KSW || KSA)
// The MMA type is fp16 when the activations are fp16 and the weights are not bf16, else bf16.
// An fp16 operand against a bf16 MMA (fp16 weights with bf16 activations, fp16 activations
// with bf16 weights) is split into hi + lo bf16 parts, both exact (an fp16 significand has
// 11 bits, the residual after rounding to bf16's 8 at most 3): one more MMA per fragment.
#define MMA_F16 (ACT_F16 && !ACT_Q && WFMT != WF_BF16)
#define SPLIT_A (ACT_F16 && !ACT_Q && WFMT == WF_BF16)
#define SPLIT_B (WFMT == WF_FP16 && !MMA_F16)

__device__ __forceinline__ u16 to_t(float v) {  // v is exact in T
#if MMA_F16
  return mp_f32_to_f16(v);
#else
  return (u16)(__float_as_uint(v) >> 16);
#endif
}

__device__ __forceinline__ void mma16816(float* c, const u32* a, u32 b0, u32 b1) {
#if MMA_F16
  mma_f16_16816(c, a[0], a[1], a[2], a[3], b0, b1);
#else
  mma_bf16_16816(c, a[0], a[1], a[2], a[3], b0, b1);
#endif
}

// 16-byte pack `kp` (PACK elements from column kp * PACK) of stored row R of expert e; zero
// past the stored row (Kst columns). Plain layout rows may not be 16-byte aligned.
__device__ __forceinline__ uint4 load_pack(const u8* W, int e, int R, int kp, int Nst, int Kst) {
  uint4 v = make_uint4(0u, 0u, 0u, 0u);
  i64 kbytes = (i64)Kst * 16 / PACK;  // bytes per stored row
  if ((i64)kp * 16 >= kbytes) return v;
  const u8* base = W + (i64)e * Nst * kbytes;
#if WLAYOUT == WL_AITER_16X16
  return *(const uint4*)(base + ((i64)(R >> 4) * (kbytes >> 4) + kp) * 256 + (R & 15) * 16);
#else
  const u8* src = base + (i64)R * kbytes + (i64)kp * 16;
  if ((kbytes & 15) == 0) return *(const uint4*)src;
  u8 b[16];
#pragma unroll
  for (int i = 0; i < 16; ++i) b[i] = (i64)kp * 16 + i < kbytes ? src[i] : 0;
  v.x = b[0] | b[1] << 8 | b[2] << 16 | (u32)b[3] << 24;
  v.y = b[4] | b[5] << 8 | b[6] << 16 | (u32)b[7] << 24;
  v.z = b[8] | b[9] << 8 | b[10] << 16 | (u32)b[11] << 24;
  v.w = b[12] | b[13] << 8 | b[14] << 16 | (u32)b[15] << 24;
  return v;
#endif
}

// hi + lo bf16 parts of an fp16-exact value v (both exact; non-finite v: lo = 0).
__device__ __forceinline__ u32 split_lo(float v, u16 hi) {
  float r = v - mp_bf16_to_f32(hi);
  return r == r ? __float_as_uint(r) >> 16 : 0u;
}

// Weight code -> T bits (codes are exact in T; the scale is applied later). fp8: the code's
// exponent and mantissa bits placed in an f32 and scaled by a power of two (exact, subnormal
// codes included); the NaN codes map to NaN.
__device__ __forceinline__ u16 w_code(u32 c) {
#if WFMT == WF_MXFP4
  return to_t(mp_e2m1_to_f32(c));
#else
  float f = __uint_as_float((c & 0x7fu) << 20) * (FP8_FNUZ ? 0x1p119f : 0x1p120f);
  f = __uint_as_float(__float_as_uint(f) | (c & 0x80u) << 24);
  bool nan = FP8_FNUZ ? c == 0x80u : (c & 0x7fu) == 0x7fu;
  return to_t(nan ? __uint_as_float(0x7fc00000u) : f);
#endif
}

// Stored weight row R of block row r (stage 1 gated: 64 gate then 64 up rows of 64 columns;
// else one row per column) and whether its column exists.
template <bool S1>
__device__ __forceinline__ void tile_row(const Params& p, int n0, int r, int& R, bool& ok) {
  constexpr bool GATED = S1 && GATED_ACT;
  int col = GATED ? n0 + (r & 63) : n0 + r;
  ok = col < (S1 ? p.I : p.H);
  R = GATED ? (r < 64 ? gate_row(col, p.Ip) : up_row(col, p.Ip)) : S1 ? up_row(col, p.Ip) : col;
}

// Stage 1 (S1) or stage 2; GATED: a stage-1 block holds gate and up rows of 64 columns, else
// (stage 2, and stage 1 without a gated activation) 128 weight rows of 128 columns.
template <bool S1>
__device__ void moe_gemm_tc(const Params& p) {
  constexpr bool GATED = S1 && GATED_ACT;
  __shared__ __align__(16) u16 As[BM][TLD];
  __shared__ __align__(16) u16 Bs[TBR][TLD];
#if SPLIT_A
  __shared__ __align__(16) u16 As_lo[BM][TLD];
#endif
#if SPLIT_B
  __shared__ __align__(16) u16 Bs_lo[TBR][TLD];
#endif
  __shared__ float Asc[BM][2], Bsc[TBR][2];
  __shared__ int s_row[BM];
  int n0 = blockIdx.y * (GATED ? 64 : BN2);
  if (!S1 && combine_zero_block(p, n0, BN2)) return;
  int tile = blockIdx.x;
  if (tile >= *(const int*)p.total_tiles) return;  // empty tile: exit before any load
  int e = ((const int*)p.tile_expert)[tile];
  int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, gid = lane >> 2, tig = lane & 3;
  if (tid < BM) s_row[tid] = ((const int*)p.sorted_rows)[tile * BM + tid];

  int K = S1 ? p.H : p.I;
  int Kst = S1 ? p.Hp : p.Ip;
  int Nst = S1 ? (GATED ? 2 : 1) * p.Ip : p.Hp;
  const u8* W = (const u8*)(S1 ? p.w13 : p.w2);
  const u8* S = (const u8*)(S1 ? p.w13_scale : p.w2_scale);
  __syncthreads();

  // This thread's A slot: row ar, 8 columns from ak; its pack slots; its scale slots.
  int ar = tid >> 3, ak = (tid & 7) * 8, aq = s_row[ar];
  i64 arow = aq < 0 ? -1 : (S1 ? aq / p.topk : aq);
  int pr[NPT], pk[NPT], pR[NPT];
  bool pok[NPT];
#pragma unroll
  for (int j = 0; j < NPT; ++j) {
    int idx = tid + j * THREADS, rest = idx >> 4;
    pk[j] = rest % NPK;
    pr[j] = (rest / NPK) * 16 + (idx & 15);
    tile_row<S1>(p, n0, pr[j], pR[j], pok[j]);
  }
  int sr = tid >> 1, sg = tid & 1;  // weight-scale slot (TBR x 2 = THREADS)
  int sR;
  bool sok;
  tile_row<S1>(p, n0, sr, sR, sok);

  float acc[2][2][4];
#pragma unroll
  for (int a = 0; a < 2; ++a)
#pragma unroll
    for (int b = 0; b < 2; ++b)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[a][b][c] = 0.0f;

  // Registers of one K step in flight.
  uint4 wr[NPT];
  u16 av[8];
#if SPLIT_A
  u16 av_lo[8];
#endif
  float wsc = 0.0f, asc = 0.0f;
  auto fetch = [&](int k0) {
#pragma unroll
    for (int j = 0; j < NPT; ++j)
      wr[j] = pok[j] ? load_pack(W, e, pR[j], k0 / PACK + pk[j], Nst, Kst)
                     : make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      int k = k0 + ak + i;
      float v = 0.0f;
      if (arow >= 0 && k < K) {
#if ACT_Q
        const u8* codes = (const u8*)(S1 ? p.xq : p.aq);
        v = act_decode(codes[arow * K + k]);
#else
        if (S1)
          v = load_x(((const u16*)p.x)[arow * p.x_cols + k]);
        else
          v = INTER_F16 ? mp_f16_to_f32(((const u16*)p.inter)[arow * p.I + k])
                        : mp_bf16_to_f32(((const u16*)p.inter)[arow * p.I + k]);
#endif
      }
#if SPLIT_A
      av[i] = mp_f32_to_bf16(v);
      av_lo[i] = split_lo(v, av[i]);
#else
      av[i] = to_t(v);
#endif
    }
#if KSW
    {
      int k = k0 + 32 * sg;
      wsc = sok && k < K ? w_scale(S, e, sR, k, Nst, Kst) : 0.0f;
    }
#endif
#if KSA
    if (tid < 2 * BM) {
      int r = tid >> 1, k = k0 + 32 * (tid & 1), q = s_row[r];
      asc = 0.0f;
      if (q >= 0 && k < K) {
        i64 row = S1 ? q / p.topk : q;
        const float* sc = (const float*)(S1 ? p.xs : p.as);
        asc = sc[row * (S1 ? p.ng1 : p.ng2) + QGROUP(k)];
      }
    }
#endif
  };

  fetch(0);
  for (int k0 = 0; k0 < K; k0 += TBK) {
    // Registers -> shared: A as is, weight packs decoded to T, columns >= K zeroed (padded
    // weight columns may hold NaN).
    *(uint4*)&As[ar][ak] = make_uint4(av[0] | (u32)av[1] << 16, av[2] | (u32)av[3] << 16,
                                      av[4] | (u32)av[5] << 16, av[6] | (u32)av[7] << 16);
#if SPLIT_A
    *(uint4*)&As_lo[ar][ak] =
        make_uint4(av_lo[0] | (u32)av_lo[1] << 16, av_lo[2] | (u32)av_lo[3] << 16,
                   av_lo[4] | (u32)av_lo[5] << 16, av_lo[6] | (u32)av_lo[7] << 16);
#endif
#pragma unroll
    for (int j = 0; j < NPT; ++j) {
      int kc = pk[j] * PACK, kg = k0 + kc;
      u16* dst = &Bs[pr[j]][kc];
      u32 wv[4] = {wr[j].x, wr[j].y, wr[j].z, wr[j].w};
#if WFMT == WF_BF16 || WFMT == WF_FP16
      if (kg + PACK > K) {
#pragma unroll
        for (int i = 0; i < 8; ++i)
          if (kg + i >= K) wv[i >> 1] &= (i & 1) ? 0x0000ffffu : 0xffff0000u;
      }
#if SPLIT_B
      u32 lo[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        float f0 = mp_f16_to_f32((u16)wv[i]), f1 = mp_f16_to_f32((u16)(wv[i] >> 16));
        u16 h0 = mp_f32_to_bf16(f0), h1 = mp_f32_to_bf16(f1);
        lo[i] = split_lo(f0, h0) | split_lo(f1, h1) << 16;
        wv[i] = h0 | (u32)h1 << 16;
      }
      *(uint4*)&Bs_lo[pr[j]][kc] = make_uint4(lo[0], lo[1], lo[2], lo[3]);
#endif
      *(uint4*)dst = make_uint4(wv[0], wv[1], wv[2], wv[3]);
#else
#pragma unroll
      for (int h = 0; h < PACK / 8; ++h) {  // 8 elements -> one 16-byte store
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
          u32 lo = kg + el < K ? w_code(c0) : 0u, hi = kg + el + 1 < K ? w_code(c1) : 0u;
          o[i >> 1] = lo | hi << 16;
        }
        *(uint4*)(dst + h * 8) = make_uint4(o[0], o[1], o[2], o[3]);
      }
#endif
    }
#if KSW
    Bsc[sr][sg] = wsc;
#endif
#if KSA
    if (tid < 2 * BM) Asc[tid >> 1][tid & 1] = asc;
#endif
    __syncthreads();
    if (k0 + TBK < K) fetch(k0 + TBK);  // next step's loads fly during the MMAs

#pragma unroll
    for (int ks = 0; ks < 2; ++ks) {
#if FOLD
      float part[2][2][4];
#pragma unroll
      for (int a = 0; a < 2; ++a)
#pragma unroll
        for (int b = 0; b < 2; ++b)
#pragma unroll
          for (int c = 0; c < 4; ++c) part[a][b][c] = 0.0f;
#define ACCT part
#else
#define ACCT acc
#endif
#pragma unroll
      for (int kk = ks * 32; kk < ks * 32 + 32; kk += 16) {
        u32 a[2][4], b[2][2];
        auto frag_a = [&](const u16(*X)[TLD]) {
#pragma unroll
          for (int mt = 0; mt < 2; ++mt) {
            a[mt][0] = *(const u32*)&X[mt * 16 + gid][kk + 2 * tig];
            a[mt][1] = *(const u32*)&X[mt * 16 + gid + 8][kk + 2 * tig];
            a[mt][2] = *(const u32*)&X[mt * 16 + gid][kk + 2 * tig + 8];
            a[mt][3] = *(const u32*)&X[mt * 16 + gid + 8][kk + 2 * tig + 8];
          }
        };
        auto frag_b = [&](const u16(*X)[TLD]) {
#pragma unroll
          for (int nt = 0; nt < 2; ++nt) {
            int br = (GATED ? nt * 64 + warp * 8 : warp * 16 + nt * 8) + gid;
            b[nt][0] = *(const u32*)&X[br][kk + 2 * tig];
            b[nt][1] = *(const u32*)&X[br][kk + 2 * tig + 8];
          }
        };
        auto mmas = [&]() {
#pragma unroll
          for (int mt = 0; mt < 2; ++mt)
#pragma unroll
            for (int nt = 0; nt < 2; ++nt) mma16816(ACCT[mt][nt], a[mt], b[nt][0], b[nt][1]);
        };
        frag_a(As);
        frag_b(Bs);
        mmas();
#if SPLIT_A
        frag_a(As_lo);
        mmas();
#endif
#if SPLIT_B
        frag_b(Bs_lo);
        mmas();
#endif
      }
#undef ACCT
#if FOLD
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            float s = 1.0f;
#if KSA
            s *= Asc[mt * 16 + gid + (c >> 1) * 8][ks];
#endif
#if KSW
            s *= Bsc[(GATED ? nt * 64 + warp * 8 : warp * 16 + nt * 8) + 2 * tig + (c & 1)][ks];
#endif
            acc[mt][nt][c] = fmaf(part[mt][nt][c], s, acc[mt][nt][c]);
          }
#endif
    }
    __syncthreads();
  }

  // Epilogue: per-row / per-column scales that do not vary along K, then as moe_gemm.
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      int r = mt * 16 + gid + (c >> 1) * 8, q = s_row[r];
      if (q < 0) continue;
      float w = ((const float*)p.topk_weights)[q];
      float sa = 1.0f;
#if ACT_Q && !KSA
      sa = ((const float*)(S1 ? p.xs : p.as))[(i64)(S1 ? q / p.topk : q) *
                                               (S1 ? p.ng1 : p.ng2)];
#endif
      if (GATED) {
        int col = n0 + warp * 8 + 2 * tig + (c & 1);
        if (col >= p.I) continue;
        float g = acc[mt][0][c], u = acc[mt][1][c];
        g = g * sa * epi_w_scale(S, e, gate_row(col, p.Ip), Nst, Kst);
        u = u * sa * epi_w_scale(S, e, up_row(col, p.Ip), Nst, Kst);
        store_gated(p, e, q, col, g, u, w);
      } else {
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
          int col = n0 + warp * 16 + nt * 8 + 2 * tig + (c & 1);
          if (col >= (S1 ? p.I : p.H)) continue;
          float v = acc[mt][nt][c] * sa;
          v *= epi_w_scale(S, e, S1 ? up_row(col, p.Ip) : col, Nst, Kst);
          if (S1)  // not gated: the up output
            store_gated(p, e, q, col, 0.0f, v, w);
          else
            store_down(p, e, q, col, v, w);
        }
      }
    }
  if (!S1) combine_arrive(p, s_row, n0, BN2);
}

// An explicit register budget: two blocks per SM (the hi/lo split paths and MXFP8 need more
// registers: one). Without it ptxas picked ~80 registers for some configurations and spilled
// (the compile check fails on any spill).
// fp8 block-128 with GELU_TANH spilled 12 bytes on sm_80/89 under the two-block cap.
#if SPLIT_A || SPLIT_B || WFMT == WF_MXFP8 || (WFMT == WF_FP8_BLOCK128 && ACT == AF_GELU_TANH)
#define T32_MIN_BLOCKS 1
#else
#define T32_MIN_BLOCKS 2
#endif
MP_KERNEL void __launch_bounds__(THREADS, T32_MIN_BLOCKS) moe_stage1(Params p) {
  moe_gemm_tc<true>(p);
}
MP_KERNEL void __launch_bounds__(THREADS, T32_MIN_BLOCKS) moe_stage2(Params p) {
  moe_gemm_tc<false>(p);
}
