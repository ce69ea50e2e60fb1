// Fused MoE, simple and correct first: route + sort on the device, stage-1 GEMM with
// in-kernel weight dequantization and the gated activation, stage-2 GEMM with the routing
// weight, and a per-token reduction in a fixed order (deterministic, no float atomics).
//
// Compile-time configuration (-D): WFMT (moeplug_weight_format), WLAYOUT (1 plain,
// 2 AITER 16x16 = LAYOUTS F1), SLAYOUT (0 none, 1 plain, 2 AITER e8m0 = F3, 3 CDNA4 swizzle =
// F3 per expert with 32-row alignment), GATE (moeplug_gate_mode), ACT (moeplug_activation),
// ACT_F16/IN_F16/OUT_F16 (0 = bf16), ACT_Q (0 = 16-bit activations, else the quantized
// moeplug_act_dtype), TC (1: tensor-core GEMMs, see moe_gemm_tc), HAS_BIAS, RWOI (router weight on input), HAS_MASK, FP8_FNUZ (the fp8
// flavour of the weights, and of fp8 activations).
//
// Quantized activations (ACT_Q != 0) follow the CPU backend (src/moe/actquant.rs): each stage
// input row is quantized once into the workspace (one code byte per element + one f32 scale
// per group: the row for FP8_PER_TOKEN / FP8_PER_TENSOR, 128 for FP8_BLOCK128, 32 for MX),
// and the GEMMs read code * scale. FP8_PER_TENSOR takes one amax over the whole stage input
// (a device-side atomicMax; the route kernel zeroes it).
#include "moeplug_port.h"

#define BM 32        // rows (token, slot pairs) per tile; the sort pads each expert to BM
#define BN 64        // output columns per block
#define BK 32        // K step
#define THREADS 256
#define SCAN_THREADS 1024

// Mirrors `KernelParams` in src/backend/gpu/launch.rs: 8-byte fields first, then 4-byte.
struct Params {
  u64 x, w13, w13_scale, w13_bias, w2, w2_scale, w2_bias;
  u64 topk_weights, topk_ids, expert_mask, num_local_tokens, out;
  u64 total_tiles, tile_expert, sorted_rows, pair_local, inter, y;
  u64 amax, xq, xs, aq, as;  // amax: 2 x u32 (stage 1, stage 2); codes u8; scales f32
  int M, topk, E, E_global, H, Hp, I, Ip, x_cols, out_cols, max_tiles, ng1;
  float alpha, limit;
  int has_limit, ng2;
};

#ifndef ACT_Q
#define ACT_Q 0
#endif
// Elements per scale group along K (0 = the whole row).
#if ACT_Q == 5
#define QG 128
#elif ACT_Q == 6 || ACT_Q == 7
#define QG 32
#else
#define QG 0
#endif
#if QG
#define QGROUP(k) ((k) / QG)
#else
#define QGROUP(k) 0
#endif

// ---- weights ----------------------------------------------------------------------------

// Storage offset of (n, k) in an [N, K] matrix of `pack`-element 16-byte packs (F1 with
// 16-row tiles; LAYOUTS.md §2.1 canonical form), or row-major.
__device__ __forceinline__ i64 w_offset(int n, int k, int K, int pack) {
#if WLAYOUT == 2
  return ((i64)(n >> 4) * (K / pack) + k / pack) * (16 * pack) + (n & 15) * pack + k % pack;
#else
  return (i64)n * K + k;
#endif
}

// F3 (LAYOUTS.md §3.1) byte offset of e8m0 scale (r, c), sn = columns rounded up to 8.
__device__ __forceinline__ i64 f3_offset(i64 r, int c, int sn) {
  return (r >> 5) * (32 * (i64)sn) + (c >> 3) * 256 + (c & 3) * 64 + (r & 15) * 4 +
         ((c >> 2) & 1) * 2 + ((r >> 4) & 1);
}

// e8m0 scale of (expert e, row n, column k) of an [E, N, K] matrix (src/backend/cpu/weights.rs).
__device__ __forceinline__ float mx_scale(const u8* S, int e, int n, int N, int k, int K) {
  int kb = k >> 5, nkb = K >> 5;
#if SLAYOUT == 2
  int sn = (nkb + 7) & ~7;
  return mp_e8m0_to_f32(S[f3_offset((i64)e * N + n, kb, sn)]);
#elif SLAYOUT == 3
  int sn = (nkb + 7) & ~7;
  return mp_e8m0_to_f32(S[(i64)e * ((N + 31) >> 5) * 32 * sn + f3_offset(n, kb, sn)]);
#else
  return mp_e8m0_to_f32(S[((i64)e * N + n) * nkb + kb]);
#endif
}

// Dequantized weight (e, n, k) of an [E, N, K] matrix (N physical rows, K logical columns
// including padding) with its scales.
__device__ __forceinline__ float load_w(const u8* W, const u8* S, int e, int n, int k, int N,
                                        int K) {
#if WFMT == 1 || WFMT == 2
  const u16* w = (const u16*)W + (i64)e * N * K;
  u16 v = w[w_offset(n, k, K, 8)];
#if WFMT == 1
  return mp_bf16_to_f32(v);
#else
  return mp_f16_to_f32(v);
#endif
#elif WFMT == 3 || WFMT == 4 || WFMT == 5 || WFMT == 7
  const u8* w = W + (i64)e * N * K;
  float v = mp_fp8_to_f32(w[w_offset(n, k, K, 16)], FP8_FNUZ);
#if WFMT == 3
  return v * ((const float*)S)[e];
#elif WFMT == 4
  return v * ((const float*)S)[(i64)e * N + n];
#elif WFMT == 5
  int nb = (N + 127) >> 7, kb = (K + 127) >> 7;
  return v * ((const float*)S)[((i64)e * nb + (n >> 7)) * kb + (k >> 7)];
#else
  return v * mx_scale(S, e, n, N, k, K);
#endif
#elif WFMT == 6
  int kbytes = K >> 1;
  const u8* w = W + (i64)e * N * kbytes;
  u32 b = w[w_offset(n, k >> 1, kbytes, 16)];
  float v = mp_e2m1_to_f32((k & 1) ? (b >> 4) : b);
  return v * mx_scale(S, e, n, N, k, K);
#else
#error "unknown WFMT"
#endif
}

// Physical w13 row of logical gate row i (up = gate + 1 half).
__device__ __forceinline__ int gate_row(int i, int Ip) {
#if GATE == 1
  return i;
#elif GATE == 2
  return ((i >> 4) << 5) + (i & 15);
#else
  return 2 * i;
#endif
}
__device__ __forceinline__ int up_row(int i, int Ip) {
#if GATE == 1
  return Ip + i;
#elif GATE == 2
  return ((i >> 4) << 5) + 16 + (i & 15);
#else
  return 2 * i + 1;
#endif
}

__device__ __forceinline__ float to_act(float v) {
#if ACT_F16
  return mp_f16_to_f32(mp_f32_to_f16(v));
#else
  return mp_bf16_to_f32(mp_f32_to_bf16(v));
#endif
}
__device__ __forceinline__ float load_x(u16 v) {
#if IN_F16
  float f = mp_f16_to_f32(v);
#else
  float f = mp_bf16_to_f32(v);
#endif
#if IN_F16 != ACT_F16
  f = to_act(f);
#endif
  return f;
}

__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

__device__ __forceinline__ float activate(float g, float u, const Params& p) {
#if ACT == 3
  float L = p.limit;  // always set for SWIGLU_OAI
  g = fminf(g, L);
  u = fminf(fmaxf(u, -L), L);
  return g * sigmoid(p.alpha * g) * (u + 1.0f);
#else
  if (p.has_limit) {
    g = fminf(g, p.limit);
    u = fminf(fmaxf(u, -p.limit), p.limit);
  }
#if ACT == 1
  return g * sigmoid(g) * u;
#else
  return 0.5f * g * (1.0f + erff(g * 0.70710678118654752f)) * u;
#endif
#endif
}

// Stage-1 epilogue of both GEMM paths: router weight on input, bias, activation, then the cast
// to the output dtype (as the CPU backend does) and, for 16-bit activations of the other
// 16-bit type, once more to the activation dtype; quantized activations start from the cast.
__device__ __forceinline__ void store_gated(const Params& p, int e, i64 q, int col, float g,
                                            float u, float w) {
#if RWOI
  g *= w;
  u *= w;
#endif
#if HAS_BIAS
  const float* b = (const float*)p.w13_bias + (i64)e * 2 * p.Ip;
  g += b[gate_row(col, p.Ip)];
  u += b[up_row(col, p.Ip)];
#endif
  float a = activate(g, u, p);
#if OUT_F16
  u16 o = mp_f32_to_f16(a);
#else
  u16 o = mp_f32_to_bf16(a);
#endif
#if !ACT_Q && OUT_F16 != ACT_F16
  float r = OUT_F16 ? mp_f16_to_f32(o) : mp_bf16_to_f32(o);
  o = ACT_F16 ? mp_f32_to_f16(r) : mp_f32_to_bf16(r);
#endif
  ((u16*)p.inter)[q * p.I + col] = o;
}

// Stage-2 epilogue of both GEMM paths: bias, then the routing weight unless it was applied
// on the input.
__device__ __forceinline__ void store_down(const Params& p, int e, i64 q, int col, float v,
                                           float w) {
#if HAS_BIAS
  v += ((const float*)p.w2_bias)[(i64)e * p.Hp + col];
#endif
#if !RWOI
  v *= w;
#endif
  ((float*)p.y)[q * p.H + col] = v;
}

// ---- routing ----------------------------------------------------------------------------

// Exclusive prefix sum of v[0..n) in place by one block of SCAN_THREADS threads; returns the
// total to every thread. `tmp` holds SCAN_THREADS ints.
__device__ int block_exclusive_scan(int* v, int n, int* tmp) {
  int tid = threadIdx.x;
  int chunk = (n + SCAN_THREADS - 1) / SCAN_THREADS;
  int begin = min(tid * chunk, n), end = min(begin + chunk, n);
  int sum = 0;
  for (int i = begin; i < end; ++i) sum += v[i];
  tmp[tid] = sum;
  __syncthreads();
  for (int off = 1; off < SCAN_THREADS; off <<= 1) {
    int add = tid >= off ? tmp[tid - off] : 0;
    __syncthreads();
    tmp[tid] += add;
    __syncthreads();
  }
  int run = tmp[tid] - sum;  // exclusive prefix of this chunk
  int total = tmp[SCAN_THREADS - 1];
  for (int i = begin; i < end; ++i) {
    int c = v[i];
    v[i] = run;
    run += c;
  }
  __syncthreads();
  return total;
}

__device__ __forceinline__ int local_tokens(const Params& p) {
  if (p.num_local_tokens == 0) return p.M;
  int n = *(const int*)p.num_local_tokens;  // read on the device: graph-capturable
  return min(max(n, 0), p.M);
}

// One block: per-expert counts, tiles of BM rows per expert (experts in increasing local id,
// empty experts get none), tile -> expert map, and the (token, slot) pair of each tile row
// (-1 = padding). Order inside an expert is whatever the atomics give: every row is computed
// independently, so results do not depend on it.
MP_KERNEL void __launch_bounds__(SCAN_THREADS) moe_route(Params p) {
  extern __shared__ int sm[];
  int* s_start = sm;              // E + 1: tile start per expert
  int* s_cursor = sm + p.E + 1;   // E: next free row per expert
  int* s_tmp = s_cursor + p.E;    // SCAN_THREADS
  int* s_local = s_tmp + SCAN_THREADS;  // E_global (HAS_MASK): local id or -1
  int tid = threadIdx.x;
  const int* ids = (const int*)p.topk_ids;
  int* pair_local = (int*)p.pair_local;
  int* tile_expert = (int*)p.tile_expert;
  int* rows = (int*)p.sorted_rows;
  int n_tok = local_tokens(p);
  int npairs = p.M * p.topk;

  for (int e = tid; e <= p.E; e += SCAN_THREADS) s_start[e] = 0;
#if HAS_MASK
  const int* mask = (const int*)p.expert_mask;
  for (int e = tid; e < p.E_global; e += SCAN_THREADS) s_local[e] = mask[e] != 0;
  __syncthreads();
  block_exclusive_scan(s_local, p.E_global, s_tmp);  // local id = cumsum(mask) - 1
  for (int e = tid; e < p.E_global; e += SCAN_THREADS)
    if (mask[e] == 0) s_local[e] = -1;
#endif
  __syncthreads();

  for (int q = tid; q < npairs; q += SCAN_THREADS) {
    int id = ids[q], lid = -1;
    if (q / p.topk < n_tok && id >= 0 && id < p.E_global) {
#if HAS_MASK
      lid = s_local[id];
#else
      lid = id;
#endif
      if (lid >= p.E) lid = -1;  // mask names more experts than the weights hold
    }
    pair_local[q] = lid;
    if (lid >= 0) atomicAdd(&s_start[lid], 1);
  }
  __syncthreads();
  // counts -> tile counts -> tile starts
  for (int e = tid; e < p.E; e += SCAN_THREADS) s_start[e] = (s_start[e] + BM - 1) / BM;
  __syncthreads();
  int total = block_exclusive_scan(s_start, p.E + 1, s_tmp);
  for (int e = tid; e < p.E; e += SCAN_THREADS) {
    s_cursor[e] = s_start[e] * BM;
    for (int t = s_start[e]; t < s_start[e + 1]; ++t) tile_expert[t] = e;
  }
  for (int t = total + tid; t < p.max_tiles; t += SCAN_THREADS) tile_expert[t] = -1;
  if (tid == 0) *(int*)p.total_tiles = total;
  if (tid < 2 && p.amax) ((u32*)p.amax)[tid] = 0u;  // FP8_PER_TENSOR maxima of this launch
  for (int r = tid; r < total * BM; r += SCAN_THREADS) rows[r] = -1;
  __syncthreads();  // padding written before the scatter overwrites real rows
  for (int q = tid; q < npairs; q += SCAN_THREADS) {
    int lid = pair_local[q];
    if (lid >= 0) rows[atomicAdd(&s_cursor[lid], 1)] = q;
  }
}

// ---- activation quantization (ACT_Q != 0) ----------------------------------------------

#define FP8_MAX (FP8_FNUZ ? 240.0f : 448.0f)

// Stage input row `row` as f32: stage 1 reads hidden_states (the caller's dtype), stage 2 the
// stage-1 output, already cast to the output dtype as the CPU backend does. Returns false for
// rows no GEMM reads (tokens at or beyond num_local_tokens, unrouted (token, slot) pairs).
template <int STAGE>
__device__ __forceinline__ bool quant_row(const Params& p, i64 row, const u16*& src, int& K) {
  if (STAGE == 1) {
    if (row >= local_tokens(p)) return false;
    src = (const u16*)p.x + row * p.x_cols;
    K = p.H;
  } else {
    if (((const int*)p.pair_local)[row] < 0) return false;
    src = (const u16*)p.inter + row * p.I;
    K = p.I;
  }
  return true;
}

template <int STAGE>
__device__ __forceinline__ float quant_src(const u16* src, int k) {
  bool f16 = STAGE == 1 ? IN_F16 : OUT_F16;
  return f16 ? mp_f16_to_f32(src[k]) : mp_bf16_to_f32(src[k]);
}

// Max of v over the THREADS threads of the block (all threads get it); `red` holds THREADS.
__device__ __forceinline__ float block_max(float v, float* red) {
  int tid = threadIdx.x;
  __syncthreads();  // red may still be read from a previous call
  red[tid] = v;
  __syncthreads();
  for (int off = THREADS / 2; off > 0; off >>= 1) {
    if (tid < off) red[tid] = fmaxf(red[tid], red[tid + off]);
    __syncthreads();
  }
  return red[0];
}

// FP8_PER_TENSOR: amax over every row the GEMMs read, into p.amax[STAGE - 1] (non-negative
// floats order like their bits, so an unsigned atomicMax is a float max).
template <int STAGE>
__device__ void amax_rows(const Params& p) {
#if ACT_Q == 4
  __shared__ float red[THREADS];
  const u16* src;
  int K;
  if (!quant_row<STAGE>(p, blockIdx.x, src, K)) return;  // uniform over the block
  float m = 0.0f;
  for (int k = threadIdx.x; k < K; k += THREADS) m = fmaxf(m, fabsf(quant_src<STAGE>(src, k)));
  m = block_max(m, red);
  if (threadIdx.x == 0) atomicMax((u32*)p.amax + (STAGE - 1), __float_as_uint(m));
#endif
}

// Encode y (x already divided by its scale) as the activation code.
__device__ __forceinline__ u8 act_encode(float y) {
#if ACT_Q == 6
  return (u8)mp_f32_to_e2m1(y);
#else
  return (u8)mp_f32_to_fp8(y, FP8_FNUZ);
#endif
}
__device__ __forceinline__ float act_decode(u32 c) {
#if ACT_Q == 6
  return mp_e2m1_to_f32(c);
#else
  return mp_fp8_to_f32(c, FP8_FNUZ);
#endif
}

// f32 scale of a group with this amax: amax / fp8max for FP8 (1 for an all-zero group), the
// e8m0 RoundUp power of two for MX.
__device__ __forceinline__ float group_scale(float amax) {
#if ACT_Q == 6 || ACT_Q == 7
  return mp_e8m0_to_f32(mp_e8m0_round_up(amax, ACT_Q == 6 ? 6.0f : FP8_MAX));
#else
  float s = amax / FP8_MAX;
  return s == 0.0f ? 1.0f : s;
#endif
}

// One block per row: codes[row, K] and scales[row, groups]. Groups of QG elements are
// reduced within chunks of THREADS elements (THREADS % QG == 0, so no group straddles chunks).
template <int STAGE>
__device__ void quant_rows(const Params& p) {
#if ACT_Q
  __shared__ float red[THREADS];
  const u16* src;
  int K;
  i64 row = blockIdx.x;
  if (!quant_row<STAGE>(p, row, src, K)) return;  // uniform over the block
  u8* codes = (u8*)(STAGE == 1 ? p.xq : p.aq) + row * K;
  float* scales = (float*)(STAGE == 1 ? p.xs : p.as) + row * (STAGE == 1 ? p.ng1 : p.ng2);
  int tid = threadIdx.x;
#if QG == 0
  float scale;
#if ACT_Q == 4
  scale = group_scale(__uint_as_float(((const u32*)p.amax)[STAGE - 1]));
#else
  float m = 0.0f;
  for (int k = tid; k < K; k += THREADS) m = fmaxf(m, fabsf(quant_src<STAGE>(src, k)));
  scale = group_scale(block_max(m, red));
#endif
  for (int k = tid; k < K; k += THREADS) codes[k] = act_encode(quant_src<STAGE>(src, k) / scale);
  if (tid == 0) scales[0] = scale;
#else
  for (int k0 = 0; k0 < K; k0 += THREADS) {
    int k = k0 + tid;
    float x = k < K ? quant_src<STAGE>(src, k) : 0.0f;
    __syncthreads();  // the previous chunk's group maxima have been read
    red[tid] = fabsf(x);
    __syncthreads();
    for (int off = QG / 2; off > 0; off >>= 1) {
      if ((tid % QG) < off) red[tid] = fmaxf(red[tid], red[tid + off]);
      __syncthreads();
    }
    float scale = group_scale(red[tid - tid % QG]);
    if (k < K) {
      codes[k] = act_encode(x / scale);
      if (k % QG == 0) scales[k / QG] = scale;
    }
  }
#endif
#endif
}

MP_KERNEL void __launch_bounds__(THREADS) moe_amax1(Params p) { amax_rows<1>(p); }
MP_KERNEL void __launch_bounds__(THREADS) moe_amax2(Params p) { amax_rows<2>(p); }
MP_KERNEL void __launch_bounds__(THREADS) moe_quant1(Params p) { quant_rows<1>(p); }
MP_KERNEL void __launch_bounds__(THREADS) moe_quant2(Params p) { quant_rows<2>(p); }

// ---- GEMM stages --------------------------------------------------------------------------

#if !TC
// Fallback (TC = 0: no tensor cores for this configuration or device). Stage 1 (GATED) or
// stage 2: one block computes BM sorted rows x BN output columns of one
// expert with fp32 FMA over shared-memory tiles. Thread (ty, tx) owns rows 2ty..2ty+1 and
// columns 4tx..4tx+3.
template <bool GATED>
__device__ void moe_gemm(const Params& p) {
  __shared__ float As[BK][BM + 1];
  __shared__ float Bs[GATED ? 2 : 1][BK][BN + 4];
  __shared__ int s_row[BM];
  int tile = blockIdx.x;  // x: up to 2^31-1 tiles; y: column blocks
  if (tile >= *(const int*)p.total_tiles) return;
  int e = ((const int*)p.tile_expert)[tile];
  int tid = threadIdx.x, ty = tid >> 4, tx = tid & 15;
  int n0 = blockIdx.y * BN;
  if (tid < BM) s_row[tid] = ((const int*)p.sorted_rows)[tile * BM + tid];

  // stage 1: A = x rows (K = H), B = w13 rows; stage 2: A = intermediate rows (K = I), B = w2.
  int K = GATED ? p.H : p.I;          // logical K: padded columns are skipped
  int Kst = GATED ? p.Hp : p.Ip;      // K of the stored matrix
  int Nst = GATED ? 2 * p.Ip : p.Hp;  // rows of the stored matrix
  int Ncols = GATED ? p.I : p.H;      // logical output columns
  const u8* W = (const u8*)(GATED ? p.w13 : p.w2);
  const u8* S = (const u8*)(GATED ? p.w13_scale : p.w2_scale);
  const u16* A = (const u16*)(GATED ? p.x : p.inter);
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
        i64 arow = GATED ? q / p.topk : q;
        const u8* codes = (const u8*)(GATED ? p.xq : p.aq);
        const float* sc = (const float*)(GATED ? p.xs : p.as);
        int ng = GATED ? p.ng1 : p.ng2;
        v = act_decode(codes[arow * K + k]) * sc[arow * ng + QGROUP(k)];
#else
        if (GATED)
          v = load_x(A[(i64)(q / p.topk) * p.x_cols + k]);
        else  // the intermediate is stored in the activation dtype
          v = ACT_F16 ? mp_f16_to_f32(A[(i64)q * p.I + k]) : mp_bf16_to_f32(A[(i64)q * p.I + k]);
#endif
      }
      As[kk][r] = v;
    }
    for (int idx = tid; idx < (GATED ? 2 : 1) * BN * BK; idx += THREADS) {
      int c = idx / BK, kk = idx % BK, k = k0 + kk;
      int half = c / BN, col = n0 + c % BN;
      float v = 0.0f;
      if (col < Ncols && k < K) {
        int row = GATED ? (half ? up_row(col, p.Ip) : gate_row(col, p.Ip)) : col;
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

  for (int i = 0; i < 2; ++i) {
    int q = s_row[2 * ty + i];
    if (q < 0) continue;
    float w = ((const float*)p.topk_weights)[q];
    for (int j = 0; j < 4; ++j) {
      int col = n0 + 4 * tx + j;
      if (col >= Ncols) continue;
      if (GATED) {
        store_gated(p, e, q, col, acc[0][i][j], acc[GATED ? 1 : 0][i][j], w);
      } else {
        store_down(p, e, q, col, acc[0][i][j], w);
      }
    }
  }
}
#endif  // !TC

// ---- tensor-core GEMM stages (TC = 1: CUDA sm_80+) ----------------------------------------
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
#if TC
#define TBK 64               // K step
#define TBR 128              // weight rows per block
#define TLD (TBK + 8)        // shared row stride in 16-bit elements (conflict-free fragments)
#define BN2 128              // stage-2 output columns per block
#if WFMT == 1 || WFMT == 2
#define PACK 8
#elif WFMT == 6
#define PACK 32
#else
#define PACK 16
#endif
#define NPK (TBK / PACK)                // packs per row per K step
#define NPT (TBR * NPK / THREADS)       // packs per thread per K step
#define KSW (WFMT == 5 || WFMT == 6 || WFMT == 7)  // weight scale varies along K
#define KSA (QG != 0)                              // activation scale varies along K
#define FOLD (KSW || KSA)
// The MMA type is fp16 when the activations are fp16 and the weights are not bf16, else bf16.
// An fp16 operand against a bf16 MMA (fp16 weights with bf16 activations, fp16 activations
// with bf16 weights) is split into hi + lo bf16 parts, both exact (an fp16 significand has
// 11 bits, the residual after rounding to bf16's 8 at most 3): one more MMA per fragment.
#define MMA_F16 (ACT_F16 && !ACT_Q && WFMT != 1)
#define SPLIT_A (ACT_F16 && !ACT_Q && WFMT == 1)
#define SPLIT_B (WFMT == 2 && !MMA_F16)

__device__ __forceinline__ u16 to_t(float v) {  // v is exact in T
#if MMA_F16
  return mp_f32_to_f16(v);
#else
  return (u16)(__float_as_uint(v) >> 16);
#endif
}

__device__ __forceinline__ void mma16816(float* c, const u32* a, u32 b0, u32 b1) {
#if MMA_F16
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// 16-byte pack `kp` (PACK elements from column kp * PACK) of stored row R of expert e; zero
// past the stored row (Kst columns). Plain layout rows may not be 16-byte aligned.
__device__ __forceinline__ uint4 load_pack(const u8* W, int e, int R, int kp, int Nst, int Kst) {
  uint4 v = make_uint4(0u, 0u, 0u, 0u);
  i64 kbytes = (i64)Kst * 16 / PACK;  // bytes per stored row
  if ((i64)kp * 16 >= kbytes) return v;
  const u8* base = W + (i64)e * Nst * kbytes;
#if WLAYOUT == 2
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

// f32 scale of weight (R, k) that stays out of the MMA (1 for 16-bit weights).
__device__ __forceinline__ float w_scale(const u8* S, int e, int R, int k, int Nst, int Kst) {
#if WFMT == 3
  return ((const float*)S)[e];
#elif WFMT == 4
  return ((const float*)S)[(i64)e * Nst + R];
#elif WFMT == 5
  int nb = (Nst + 127) >> 7, kb = (Kst + 127) >> 7;
  return ((const float*)S)[((i64)e * nb + (R >> 7)) * kb + (k >> 7)];
#elif WFMT == 6 || WFMT == 7
  return mx_scale(S, e, R, Nst, k, Kst);
#else
  return 1.0f;
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
#if WFMT == 6
  return to_t(mp_e2m1_to_f32(c));
#else
  float f = __uint_as_float((c & 0x7fu) << 20) * (FP8_FNUZ ? 0x1p119f : 0x1p120f);
  f = __uint_as_float(__float_as_uint(f) | (c & 0x80u) << 24);
  bool nan = FP8_FNUZ ? c == 0x80u : (c & 0x7fu) == 0x7fu;
  return to_t(nan ? __uint_as_float(0x7fc00000u) : f);
#endif
}

template <bool GATED>
__device__ __forceinline__ void tile_row(const Params& p, int n0, int r, int& R, bool& ok) {
  int col = GATED ? n0 + (r & 63) : n0 + r;
  ok = col < (GATED ? p.I : p.H);
  R = GATED ? (r < 64 ? gate_row(col, p.Ip) : up_row(col, p.Ip)) : col;
}

template <bool GATED>
__device__ void moe_gemm_tc(const Params& p) {
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
  int tile = blockIdx.x;
  if (tile >= *(const int*)p.total_tiles) return;  // empty tile: exit before any load
  int e = ((const int*)p.tile_expert)[tile];
  int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, gid = lane >> 2, tig = lane & 3;
  int n0 = blockIdx.y * (GATED ? 64 : BN2);
  if (tid < BM) s_row[tid] = ((const int*)p.sorted_rows)[tile * BM + tid];

  int K = GATED ? p.H : p.I;
  int Kst = GATED ? p.Hp : p.Ip;
  int Nst = GATED ? 2 * p.Ip : p.Hp;
  const u8* W = (const u8*)(GATED ? p.w13 : p.w2);
  const u8* S = (const u8*)(GATED ? p.w13_scale : p.w2_scale);
  __syncthreads();

  // This thread's A slot: row ar, 8 columns from ak; its pack slots; its scale slots.
  int ar = tid >> 3, ak = (tid & 7) * 8, aq = s_row[ar];
  i64 arow = aq < 0 ? -1 : (GATED ? aq / p.topk : aq);
  int pr[NPT], pk[NPT], pR[NPT];
  bool pok[NPT];
#pragma unroll
  for (int j = 0; j < NPT; ++j) {
    int idx = tid + j * THREADS, rest = idx >> 4;
    pk[j] = rest % NPK;
    pr[j] = (rest / NPK) * 16 + (idx & 15);
    tile_row<GATED>(p, n0, pr[j], pR[j], pok[j]);
  }
  int sr = tid >> 1, sg = tid & 1;  // weight-scale slot (TBR x 2 = THREADS)
  int sR;
  bool sok;
  tile_row<GATED>(p, n0, sr, sR, sok);

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
        i64 row = GATED ? q / p.topk : q;
        const float* sc = (const float*)(GATED ? p.xs : p.as);
        asc = sc[row * (GATED ? p.ng1 : p.ng2) + QGROUP(k)];
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
#if WFMT == 1 || WFMT == 2
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
#if WFMT == 6
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
      sa = ((const float*)(GATED ? p.xs : p.as))[(i64)(GATED ? q / p.topk : q) *
                                                  (GATED ? p.ng1 : p.ng2)];
#endif
      if (GATED) {
        int col = n0 + warp * 8 + 2 * tig + (c & 1);
        if (col >= p.I) continue;
        float g = acc[mt][0][c], u = acc[mt][1][c];
#if WFMT == 3 || WFMT == 4
        g = g * sa * w_scale(S, e, gate_row(col, p.Ip), 0, Nst, Kst);
        u = u * sa * w_scale(S, e, up_row(col, p.Ip), 0, Nst, Kst);
#else
        g *= sa;
        u *= sa;
#endif
        store_gated(p, e, q, col, g, u, w);
      } else {
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
          int col = n0 + warp * 16 + nt * 8 + 2 * tig + (c & 1);
          if (col >= p.H) continue;
          float v = acc[mt][nt][c] * sa;
#if WFMT == 3 || WFMT == 4
          v *= w_scale(S, e, col, 0, Nst, Kst);
#endif
          store_down(p, e, q, col, v, w);
        }
      }
    }
}
#endif  // TC

#if TC
MP_KERNEL void __launch_bounds__(THREADS) moe_stage1(Params p) { moe_gemm_tc<true>(p); }
MP_KERNEL void __launch_bounds__(THREADS) moe_stage2(Params p) { moe_gemm_tc<false>(p); }
#else
MP_KERNEL void __launch_bounds__(THREADS) moe_stage1(Params p) { moe_gemm<true>(p); }
MP_KERNEL void __launch_bounds__(THREADS) moe_stage2(Params p) { moe_gemm<false>(p); }
#endif

// out[t, n] = sum over slots s (in order) of y[t*topk + s, n] for routed pairs; rows at or
// beyond num_local_tokens and padded columns are zero.
MP_KERNEL void __launch_bounds__(THREADS) moe_reduce(Params p) {
  int t = blockIdx.x, n = blockIdx.y * THREADS + threadIdx.x;  // x: tokens (no 65535 cap)
  if (n >= p.out_cols) return;
  float sum = 0.0f;
  if (t < local_tokens(p) && n < p.H) {
    for (int s = 0; s < p.topk; ++s) {
      int q = t * p.topk + s;
      if (((const int*)p.pair_local)[q] >= 0) sum += ((const float*)p.y)[(i64)q * p.H + n];
    }
  }
#if OUT_F16
  ((u16*)p.out)[(i64)t * p.out_cols + n] = mp_f32_to_f16(sum);
#else
  ((u16*)p.out)[(i64)t * p.out_cols + n] = mp_f32_to_bf16(sum);
#endif
}
