// What every fused-MoE kernel family shares: the parameter block, weight and scale
// addressing (LAYOUTS.md maps, docs/layouts.md), the gated activation and the two stage
// epilogues, routing (sort by expert), activation quantization and the top-k reduction.
// None of it depends on the GEMM family; fused_moe.cu includes one family after this.
//
// Compile-time configuration (-D, rendered by src/backend/gpu/spec.rs): WFMT (weight format),
// WLAYOUT, SLAYOUT (0 = no scales), GATE, ACT (activation; AF_NONE: w13 holds only up rows),
// ACT_F16/IN_F16/OUT_F16 (0 = bf16), ACT_Q (0 = 16-bit activations, else the quantized act
// dtype), INTER_F16 (the intermediate's 16-bit type, KernelSpec::inter_f16), HAS_BIAS, RWOI
// (router weight on input), HAS_MASK, FP8_FNUZ (fp8 flavour of weights and activations),
// FAMILY (the GEMM family), FUSED_COMBINE (the top-k combine at the end of stage 2 instead of
// moe_reduce; CUDA only). The values are the ABI's, compared by name: the host prepends
// `#define WF_MXFP4 6`-style names for every enum value (spec::abi_prelude), so no kernel
// spells an ABI integer.
//
// Quantized activations (ACT_Q != 0) follow the CPU backend (src/moe/actquant.rs): each stage
// input row is quantized once into the workspace (one code byte per element + one f32 scale
// per group: the row for FP8_PER_TOKEN / FP8_PER_TENSOR, 128 for FP8_BLOCK128, 32 for MX),
// and the GEMMs read code * scale. FP8_PER_TENSOR takes one amax over the whole stage input
// (a device-side atomicMax; the route kernel zeroes it).
//
// A separate stage-2 act dtype runs stage 2 from a second module compiled with ACT_Q / ACT_F16
// of that dtype (KernelSpec::stage2): the only fact both modules share is INTER_F16.
#pragma once
#include "moeplug_port.h"

// BM (-D, Family::tile_rows): rows (token, slot pairs) per sorted tile; the route pads each
// expert to a multiple of BM.
#if !defined(BM) || BM % 16
#error "BM: rows per sorted tile, a multiple of 16, set by the host"
#endif
#define THREADS 256
#define SCAN_THREADS 1024

// A compile-time bool as a value (a generic lambda's case argument: one loop body compiled
// twice, chosen at run time by a uniform branch).
template <bool B>
struct mp_bool {
  static constexpr bool value = B;
};

// `KernelParams` in src/backend/gpu/launch.rs is checked against this struct by a test that
// reads this file (launch::tests): same fields, same order. 8-byte fields first, then 4-byte.
struct Params {
  u64 x, w13, w13_scale, w13_bias, w2, w2_scale, w2_bias;
  u64 topk_weights, topk_ids, expert_mask, num_local_tokens, out;
  u64 total_tiles, tile_expert, sorted_rows, pair_local, inter, y;
  u64 amax, xq, xs, aq, as;  // amax: 2 x u32 (stage 1, stage 2); codes u8; scales f32
  // Static FP8_PER_TENSOR scales of the stage inputs (one f32 each; 0 = from the amax), and
  // the caller's hidden_scale of pre-quantized hidden_states (0 = x is 16-bit).
  u64 act_scale1, act_scale2, x_scale;
  u64 combine;  // FUSED_COMBINE: int arrival counters [num_local_tokens, ncb2]
  int M, topk, E, E_global, H, Hp, I, Ip, x_cols, out_cols, max_tiles, ng1;
  float alpha, limit;
  int has_limit, ng2;
  int x_scale_cols;  // scales per row of hidden_scale
  int ncb2;          // stage-2 column blocks (the grid's y)
};

#ifndef ACT_Q
#define ACT_Q 0
#endif
#ifndef INTER_F16
#error "INTER_F16: the intermediate's 16-bit type, set by the host"
#endif
// w13 holds gate and up rows (2 Ip per expert); without (AF_NONE) only the Ip up rows, and the
// GEMM families map stage 1 as they map stage 2 (one weight row per output column).
#define GATED_ACT (ACT != AF_NONE)
// Elements per scale group along K (0 = the whole row).
#if ACT_Q == AD_FP8_BLOCK128
#define QG 128
#elif ACT_Q == AD_MXFP4 || ACT_Q == AD_MXFP8
#define QG 32
#else
#define QG 0
#endif
#if QG
#define QGROUP(k) ((k) / QG)
#else
#define QGROUP(k) 0
#endif

// ---- programmatic dependent launch (PDL, sm_90, spec::Pdl) -------------------------------

#ifndef PDL
#define PDL 0
#endif
#define PDL_EARLY 2  // the wgmma stages that can start their weight copies before waiting
#ifndef QUANT1_IN_ROUTE
#define QUANT1_IN_ROUTE 0
#endif
// With PDL the host launches each kernel as a programmatic dependent of the previous one in
// the stream: its blocks may be resident while that one finishes, and wait here until it has
// completed and its writes are visible; only then do they let the next kernel start, so a
// kernel that starts early never reads results of any grid before its predecessor. Every
// block of a PDL module calls this before it exits (a block that exits counts as letting the
// next kernel start).
__device__ __forceinline__ void pdl_enter() {
#if PDL && !defined(MP_HOST)
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Whether a GEMM stage may read, before its pdl_enter, the route kernel's results (the tile
// list, its experts) and the weights (PDL_EARLY, the wgmma family): its predecessor is not the
// route kernel, and that predecessor let this stage start only after its own wait, so the
// route kernel has completed. Stage 2 always follows stage 1 (and perhaps its quantize
// kernels); stage 1 follows the route kernel directly unless the activations are quantized
// (or imported) first.
__device__ __forceinline__ constexpr bool pdl_early(bool stage1) {
  return PDL == PDL_EARLY && (!stage1 || (ACT_Q != 0 && !QUANT1_IN_ROUTE));
}

// ---- weights ----------------------------------------------------------------------------

// Storage offset of (n, k) in an [N, K] matrix of `pack`-element 16-byte packs (F1 with
// 16-row tiles; LAYOUTS.md §2.1 canonical form), or row-major.
__device__ __forceinline__ i64 w_offset(int n, int k, int K, int pack) {
#if WLAYOUT == WL_AITER_16X16
  return ((i64)(n >> 4) * (K / pack) + k / pack) * (16 * pack) + (n & 15) * pack + k % pack;
#else
  return (i64)n * K + k;
#endif
}

// F3 (LAYOUTS.md §3.1) byte offset of e8m0 scale (r, c), sn = columns rounded up to 8: a row
// part plus a column part, so that a walk along K computes the row part once.
__device__ __forceinline__ i64 f3_row_part(i64 r, int sn) {
  return (r >> 5) * (32 * (i64)sn) + (r & 15) * 4 + ((r >> 4) & 1);
}
__device__ __forceinline__ int f3_col_part(int c) {
  return (c >> 3) * 256 + (c & 3) * 64 + ((c >> 2) & 1) * 2;
}
__device__ __forceinline__ i64 f3_offset(i64 r, int c, int sn) {
  return f3_row_part(r, sn) + f3_col_part(c);
}

// Byte offset of the e8m0 scale of (expert e, row n, K group kb) of an [E, N, K] matrix with
// nkb = K / 32 groups per row (src/backend/cpu/weights.rs): mx_scale_row_part(e, n, N, nkb) +
// mx_scale_col_part(kb) in every layout.
__device__ __forceinline__ i64 mx_scale_row_part(int e, int n, int N, int nkb) {
#if SLAYOUT == SL_AITER_E8M0
  return f3_row_part((i64)e * N + n, (nkb + 7) & ~7);
#elif SLAYOUT == SL_CDNA4_SWIZZLE
  int sn = (nkb + 7) & ~7;
  return (i64)e * ((N + 31) >> 5) * 32 * sn + f3_row_part(n, sn);
#else
  return ((i64)e * N + n) * nkb;
#endif
}
__device__ __forceinline__ int mx_scale_col_part(int kb) {
#if SLAYOUT == SL_AITER_E8M0 || SLAYOUT == SL_CDNA4_SWIZZLE
  return f3_col_part(kb);
#else
  return kb;
#endif
}
__device__ __forceinline__ i64 mx_scale_offset(int e, int n, int N, int kb, int nkb) {
  return mx_scale_row_part(e, n, N, nkb) + mx_scale_col_part(kb);
}

// bf16 group scale of INT4_GROUP32 weight (e, n, k) of an [E, N, K] matrix: plain [E, N, K/32]
// or AITER's shuffle_scale_for_int4 [E, K/64, N, 2] (two adjacent groups side by side).
__device__ __forceinline__ float int4_scale(const u8* S, int e, int n, int N, int k, int K) {
  int g = k >> 5, groups = K >> 5;
#if SLAYOUT == SL_AITER_INT4
  i64 at = (((i64)e * (groups >> 1) + (g >> 1)) * N + n) * 2 + (g & 1);
#else
  i64 at = ((i64)e * N + n) * groups + g;
#endif
  return mp_bf16_to_f32(((const u16*)S)[at]);
}

// e8m0 scale of (expert e, row n, column k) of an [E, N, K] matrix.
__device__ __forceinline__ float mx_scale(const u8* S, int e, int n, int N, int k, int K) {
  return mp_e8m0_to_f32(S[mx_scale_offset(e, n, N, k >> 5, K >> 5)]);
}

// Dequantized weight (e, n, k) of an [E, N, K] matrix (N physical rows, K logical columns
// including padding) with its scales.
__device__ __forceinline__ float load_w(const u8* W, const u8* S, int e, int n, int k, int N,
                                        int K) {
#if WFMT == WF_BF16 || WFMT == WF_FP16
  const u16* w = (const u16*)W + (i64)e * N * K;
  u16 v = w[w_offset(n, k, K, 8)];
#if WFMT == WF_BF16
  return mp_bf16_to_f32(v);
#else
  return mp_f16_to_f32(v);
#endif
#elif WFMT == WF_FP8_PER_TENSOR || WFMT == WF_FP8_PER_CHANNEL || WFMT == WF_FP8_BLOCK128 || WFMT == WF_MXFP8
  const u8* w = W + (i64)e * N * K;
  float v = mp_fp8_to_f32(w[w_offset(n, k, K, 16)], FP8_FNUZ);
#if WFMT == WF_FP8_PER_TENSOR
  return v * ((const float*)S)[e];
#elif WFMT == WF_FP8_PER_CHANNEL
  return v * ((const float*)S)[(i64)e * N + n];
#elif WFMT == WF_FP8_BLOCK128
  int nb = (N + 127) >> 7, kb = (K + 127) >> 7;
  return v * ((const float*)S)[((i64)e * nb + (n >> 7)) * kb + (k >> 7)];
#else
  return v * mx_scale(S, e, n, N, k, K);
#endif
#elif WFMT == WF_MXFP4
  int kbytes = K >> 1;
  const u8* w = W + (i64)e * N * kbytes;
  u32 b = w[w_offset(n, k >> 1, kbytes, 16)];
  float v = mp_e2m1_to_f32((k & 1) ? (b >> 4) : b);
  return v * mx_scale(S, e, n, N, k, K);
#elif WFMT == WF_INT4_GROUP32
  // AITER's pack: value k is in byte (k/8)*4 + k%4 of its row, the high nibble when k%8 >= 4;
  // AITER_16x16 is F1 over those bytes with 8-byte packs (pack_int8_to_packed_int4 of F1).
  int kbytes = K >> 1;
  float s = int4_scale(S, e, n, N, k, K);
  u32 b = W[(i64)e * N * kbytes + w_offset(n, ((k >> 3) << 2) + (k & 3), kbytes, 8)];
  // The nibble to the top of an int, then an arithmetic shift: its signed value.
  int v = (int)(b << (28 - (k & 4))) >> 28;
  return (float)v * s;
#elif WFMT == WF_INT4_PER_CHANNEL
  // AITER's a8w4 words: 8 values per little-endian u32 along K, value j = k % 8 in nibble
  // [0, 4, 1, 5, 2, 6, 3, 7][j] (rearrange_4bit_elements of convert_int8_to_uint32_int4), i.e.
  // byte (j >> 2) + 2 (j & 1) of the word, the high nibble when j & 2. AITER_16x16 is F1 over
  // the words (4-word packs), the same bytes as F1 over bytes with 16-byte packs. Read by the
  // byte as the fp8 path reads (a u32 load here spilled on sm_90).
  int kbytes = K >> 1, j = k & 7;
  int byte = ((k >> 3) << 2) + (j >> 2) + ((j & 1) << 1);
  u32 b = W[(i64)e * N * kbytes + w_offset(n, byte, kbytes, 16)];
  int v = (int)(b << (28 - ((j & 2) << 1))) >> 28;
  return (float)v * ((const float*)S)[(i64)e * N + n];
#else
#error "unknown WFMT"
#endif
}

// f32 scale of weight (R, k) that stays out of the MMA (1 for 16-bit weights).
__device__ __forceinline__ float w_scale(const u8* S, int e, int R, int k, int Nst, int Kst) {
#if WFMT == WF_FP8_PER_TENSOR
  return ((const float*)S)[e];
#elif WFMT == WF_FP8_PER_CHANNEL
  return ((const float*)S)[(i64)e * Nst + R];
#elif WFMT == WF_FP8_BLOCK128
  int nb = (Nst + 127) >> 7, kb = (Kst + 127) >> 7;
  return ((const float*)S)[((i64)e * nb + (R >> 7)) * kb + (k >> 7)];
#elif WFMT == WF_MXFP4 || WFMT == WF_MXFP8
  return mx_scale(S, e, R, Nst, k, Kst);
#elif WFMT == WF_INT4_GROUP32
  return int4_scale(S, e, R, Nst, k, Kst);
#else
  return 1.0f;
#endif
}

// The weight scale a GEMM epilogue applies to the sums of weight row R: the fp8 per-tensor /
// per-channel scale (constant along K), 1 for every format whose scales vary along K (applied
// in the main loop or by the decode) or that has none.
__device__ __forceinline__ float epi_w_scale(const u8* S, int e, int R, int Nst, int Kst) {
#if WFMT == WF_FP8_PER_TENSOR || WFMT == WF_FP8_PER_CHANNEL
  return w_scale(S, e, R, 0, Nst, Kst);
#else
  return 1.0f;
#endif
}

// Physical w13 row of logical gate row i (up = gate + 1 half); without a gated activation
// up row i is row i.
__device__ __forceinline__ int gate_row(int i, int Ip) {
#if GATE == GM_SEPARATED
  return i;
#elif GATE == GM_INTERLEAVE
  return ((i >> 4) << 5) + (i & 15);
#else
  return 2 * i;
#endif
}
__device__ __forceinline__ int up_row(int i, int Ip) {
#if !GATED_ACT
  return i;
#elif GATE == GM_SEPARATED
  return Ip + i;
#elif GATE == GM_INTERLEAVE
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
#if !GATED_ACT
  return u;  // NONE takes no limit (the launch check)
#elif ACT == AF_SWIGLU_OAI
  float L = p.limit;  // always set for SWIGLU_OAI
  g = fminf(g, L);
  u = fminf(fmaxf(u, -L), L);
  return g * sigmoid(p.alpha * g) * (u + 1.0f);
#else
  if (p.has_limit) {
    g = fminf(g, p.limit);
    u = fminf(fmaxf(u, -p.limit), p.limit);
  }
#if ACT == AF_SILU
  return g * sigmoid(g) * u;
#elif ACT == AF_GELU_TANH
  return 0.5f * g * (1.0f + tanhf(0.7978846f * (g + 0.044715f * g * g * g))) * u;
#else
  return 0.5f * g * (1.0f + erff(g * 0.70710678118654752f)) * u;
#endif
#endif
}

// Stage-1 epilogue of every GEMM family: router weight on input, bias, activation, then the
// cast to the output dtype (as the CPU backend does) and, when stage 2 reads 16-bit
// activations of the other 16-bit type, once more to that type (INTER_F16); quantized stage-2
// activations start from the cast. Without a gated activation `g` is unused.
// The biases of column col of expert e's stage 1 (gate, up; 0 where there are none).
__device__ __forceinline__ void gated_bias(const Params& p, int e, int col, float& bg, float& bu) {
  bg = bu = 0.0f;
#if HAS_BIAS
  const float* b = (const float*)p.w13_bias + (i64)e * (GATED_ACT ? 2 : 1) * p.Ip;
#if GATED_ACT
  bg = b[gate_row(col, p.Ip)];
#endif
  bu = b[up_row(col, p.Ip)];
#endif
}
// gated_value with the column's biases already loaded (gated_bias): an epilogue that loads
// every bias before its first store keeps the loads from waiting behind the stores.
__device__ __forceinline__ u16 gated_value_biased(const Params& p, float g, float u, float w,
                                                  float bg, float bu) {
#if RWOI
  g *= w;
  u *= w;
#endif
#if HAS_BIAS
#if GATED_ACT
  g += bg;
#endif
  u += bu;
#else
  (void)bg, (void)bu;
#endif
  float a = activate(g, u, p);
#if OUT_F16
  u16 o = mp_f32_to_f16(a);
#else
  u16 o = mp_f32_to_bf16(a);
#endif
#if OUT_F16 != INTER_F16
  float r = OUT_F16 ? mp_f16_to_f32(o) : mp_bf16_to_f32(o);
  o = INTER_F16 ? mp_f32_to_f16(r) : mp_f32_to_bf16(r);
#endif
  return o;
}
__device__ __forceinline__ u16 gated_value(const Params& p, int e, int col, float g, float u,
                                           float w) {
  float bg, bu;
  gated_bias(p, e, col, bg, bu);
  return gated_value_biased(p, g, u, w, bg, bu);
}
__device__ __forceinline__ void store_gated(const Params& p, int e, i64 q, int col, float g,
                                            float u, float w) {
  ((u16*)p.inter)[q * p.I + col] = gated_value(p, e, col, g, u, w);
}
// Columns col and col + 1 of pair q in one 4-byte store, the same bytes as two store_gated: a
// warp's stores then cover whole 32-byte sectors of its rows instead of every other half.
// col even and I even (the wgmma family's sizes are multiples of 8: heuristics::
// wgmma_unsupported), so col + 1 exists wherever col does and the store is aligned.
__device__ __forceinline__ void store_gated2(const Params& p, int e, i64 q, int col, float g0,
                                             float u0, float g1, float u1, float w) {
  if (col >= p.I) return;
  u32 a = gated_value(p, e, col, g0, u0, w), b = gated_value(p, e, col + 1, g1, u1, w);
  *(u32*)((u16*)p.inter + q * p.I + col) = a | b << 16;
}

// Stage-2 epilogue of both GEMM paths: bias, then the routing weight unless it was applied
// on the input.
// Stage 2's bias of column col of expert e (0 where there is none).
__device__ __forceinline__ float down_bias(const Params& p, int e, int col) {
#if HAS_BIAS
  return ((const float*)p.w2_bias)[(i64)e * p.Hp + col];
#else
  (void)p, (void)e, (void)col;
  return 0.0f;
#endif
}
// down_value with the column's bias already loaded (down_bias), as gated_value_biased.
__device__ __forceinline__ float down_value_biased(float v, float w, float bias) {
#if HAS_BIAS
  v += bias;
#else
  (void)bias;
#endif
#if !RWOI
  v *= w;
#endif
  return v;
}
__device__ __forceinline__ float down_value(const Params& p, int e, int col, float v, float w) {
  return down_value_biased(v, w, down_bias(p, e, col));
}
// PARTIALS_16 (spec::KernelSpec::partials_16, the wgmma family's): stage 2's partial rows y
// (pair x H) are stored in the output's 16-bit type, so that stage 2 writes and moe_reduce
// reads half the bytes: at prefill y is M k H x 4 bytes each way in fp32 (~270 MB on
// Qwen3-30B-A3B at M = 4096, ~940 MB on DeepSeek-V3), and vLLM's fused_moe keeps its partials
// in the activations' type too. The workspace holds 4 bytes per element either way.
#ifndef PARTIALS_16
#error "PARTIALS_16: set by the host"
#endif
#if PARTIALS_16 && FUSED_COMBINE
#error "the fused combine reads fp32 partials"
#endif
// A partial in the output's type. bf16 by the conversion instruction on CUDA: mp_f32_to_bf16's
// integer rounding of an accumulator made ptxas serialize the wgmma pipeline (C7514).
__device__ __forceinline__ u16 partial16(float v) {
#if OUT_F16
  return mp_f32_to_f16(v);
#elif defined(MP_HOST) || defined(MP_HIP)
  return mp_f32_to_bf16(v);
#else
  u16 h;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(v));
  return h;
#endif
}
__device__ __forceinline__ void store_partial(const Params& p, i64 at, float v) {
#if PARTIALS_16
  ((u16*)p.y)[at] = partial16(v);
#else
  ((float*)p.y)[at] = v;
#endif
}
__device__ __forceinline__ void store_down(const Params& p, int e, i64 q, int col, float v,
                                           float w) {
  store_partial(p, q * p.H + col, down_value(p, e, col, v, w));
}
// Columns col and col + 1 of pair q in one store (CUDA; 4 bytes with PARTIALS_16, else 8),
// the same bytes as two store_down; col even and H even, as for store_gated2.
__device__ __forceinline__ void store_down2(const Params& p, int e, i64 q, int col, float v0,
                                            float v1, float w) {
  if (col >= p.H) return;
  float a = down_value(p, e, col, v0, w), b = down_value(p, e, col + 1, v1, w);
#if PARTIALS_16
  *(u32*)((u16*)p.y + q * p.H + col) = (u32)partial16(a) | (u32)partial16(b) << 16;
#elif defined(MP_HOST) || defined(MP_HIP)
  float* y = (float*)p.y + q * p.H + col;
  y[0] = a;
  y[1] = b;
#else
  float* y = (float*)p.y + q * p.H + col;
  // As asm: a plain 8-byte store of the two floats made ptxas read the wgmma accumulators as
  // a register pair and serialize the MMAs (C7514) where the value is the accumulator itself.
  asm volatile("st.global.v2.f32 [%0], {%1, %2};" ::"l"(y), "f"(a), "f"(b) : "memory");
#endif
}

// ---- routing ----------------------------------------------------------------------------

// Exclusive prefix sum of v[0..n) in place by one block of SCAN_THREADS threads; returns the
// total to every thread. `tmp` holds SCAN_THREADS ints (SCAN_PARTS + 1 of them used). Each of
// SCAN_PARTS threads sums a run of v, thread 0 scans the runs' sums, and each run is rewritten
// from its start: three block barriers where a tree over every thread took 20 (the route
// kernel runs before every launch's GEMMs).
#define SCAN_PARTS 32
__device__ int block_exclusive_scan(int* v, int n, int* tmp) {
  int tid = threadIdx.x;
  int chunk = (n + SCAN_PARTS - 1) / SCAN_PARTS;
  int begin = min(tid * chunk, n), end = min(begin + chunk, n);
  if (tid < SCAN_PARTS) {
    int sum = 0;
    for (int i = begin; i < end; ++i) sum += v[i];
    tmp[tid] = sum;
  }
  __syncthreads();
  if (tid == 0) {
    int run = 0;
#pragma unroll
    for (int t = 0; t < SCAN_PARTS; ++t) {
      int c = tmp[t];
      tmp[t] = run;
      run += c;
    }
    tmp[SCAN_PARTS] = run;
  }
  __syncthreads();
  if (tid < SCAN_PARTS) {
    int run = tmp[tid];
    for (int i = begin; i < end; ++i) {
      int c = v[i];
      v[i] = run;
      run += c;
    }
  }
  int total = tmp[SCAN_PARTS];
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
__device__ void route_block(const Params& p) {
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

  int first_lid = -1;  // pair tid's, kept for the scatter below (no reread of pair_local)
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
    if (q == tid) first_lid = lid;
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
#if FUSED_COMBINE
  for (i64 i = tid; i < (i64)n_tok * p.ncb2; i += SCAN_THREADS) ((int*)p.combine)[i] = 0;
#endif
  for (int r = tid; r < total * BM; r += SCAN_THREADS) rows[r] = -1;
  __syncthreads();  // padding written before the scatter overwrites real rows
  for (int q = tid; q < npairs; q += SCAN_THREADS) {
    int lid = q == tid ? first_lid : pair_local[q];
    if (lid >= 0) rows[atomicAdd(&s_cursor[lid], 1)] = q;
  }
}

// ---- activation quantization (ACT_Q != 0) ----------------------------------------------

#define FP8_MAX (FP8_FNUZ ? 240.0f : 448.0f)

// Stage input row `row` as f32: stage 1 reads hidden_states (the caller's dtype), stage 2 the
// stage-1 output, already cast to the output dtype as the CPU backend does (INTER_F16 is
// OUT_F16 when stage 2 quantizes). Returns false for
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

// A stored intermediate value (stage 1's output, stage 2's input) as f32.
__device__ __forceinline__ float inter_to_f32(u16 h) {
  return INTER_F16 ? mp_f16_to_f32(h) : mp_bf16_to_f32(h);
}

template <int STAGE>
__device__ __forceinline__ float quant_src(const u16* src, int k) {
  if (STAGE == 2) return inter_to_f32(src[k]);
  return IN_F16 ? mp_f16_to_f32(src[k]) : mp_bf16_to_f32(src[k]);
}

// Max of v over the NT threads of the block (all threads get it); `red` holds NT.
template <int NT = THREADS>
__device__ __forceinline__ float block_max(float v, float* red) {
  int tid = threadIdx.x;
  __syncthreads();  // red may still be read from a previous call
  red[tid] = v;
  __syncthreads();
  for (int off = NT / 2; off > 0; off >>= 1) {
    if (tid < off) red[tid] = fmaxf(red[tid], red[tid + off]);
    __syncthreads();
  }
  return red[0];
}

// FP8_PER_TENSOR: amax over every row the GEMMs read, into p.amax[STAGE - 1] (non-negative
// floats order like their bits, so an unsigned atomicMax is a float max).
template <int STAGE>
__device__ void amax_rows(const Params& p) {
  pdl_enter();
#if ACT_Q == AD_FP8_PER_TENSOR
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
#if ACT_Q == AD_MXFP4
  return (u8)mp_f32_to_e2m1(y);
#else
  return (u8)mp_f32_to_fp8(y, FP8_FNUZ);
#endif
}
__device__ __forceinline__ float act_decode(u32 c) {
#if ACT_Q == AD_MXFP4
  return mp_e2m1_to_f32(c);
#else
  return mp_fp8_to_f32(c, FP8_FNUZ);
#endif
}

// f32 scale of a group with this amax: amax / fp8max for FP8 (1 for an all-zero group), the
// e8m0 RoundUp power of two for MX.
__device__ __forceinline__ float group_scale(float amax) {
#if ACT_Q == AD_MXFP4 || ACT_Q == AD_MXFP8
  return mp_e8m0_to_f32(mp_e8m0_round_up(amax, ACT_Q == AD_MXFP4 ? 6.0f : FP8_MAX));
#else
  float s = amax / FP8_MAX;
  return s == 0.0f ? 1.0f : s;
#endif
}

// One block of NT threads per row: codes[row, K] and scales[row, groups]. Groups of QG
// elements: the block takes NT * QV elements per pass, QV consecutive ones per thread, so a
// group is QG / QV neighbouring threads (NT * QV % QG == 0: no group straddles passes). Each
// thread posts the max of its values in `red` (NT floats of shared memory) and reads its
// group's: two block barriers a pass, and the next pass's loads are in flight meanwhile. (A
// tree of barriers per group, as before, made a 7168-column row 63 barriers and 7 round trips
// to memory: the route kernel's quantizing block, 11.5 us at M = 1 on DeepSeek.) The max is
// exact, so the bits do not depend on NT or QV.
template <int STAGE, int NT>
__device__ void quant_row_block(const Params& p, i64 row, float* red) {
#if ACT_Q
  const u16* src;
  int K;
  if (!quant_row<STAGE>(p, row, src, K)) return;  // uniform over the block
  u8* codes = (u8*)(STAGE == 1 ? p.xq : p.aq) + row * K;
  float* scales = (float*)(STAGE == 1 ? p.xs : p.as) + row * (STAGE == 1 ? p.ng1 : p.ng2);
  int tid = threadIdx.x;
#if QG == 0
  float scale;
#if ACT_Q == AD_FP8_PER_TENSOR
  const float* fixed = (const float*)(STAGE == 1 ? p.act_scale1 : p.act_scale2);
  scale = fixed ? *fixed : group_scale(__uint_as_float(((const u32*)p.amax)[STAGE - 1]));
#else
  float m = 0.0f;
  for (int k = tid; k < K; k += NT) m = fmaxf(m, fabsf(quant_src<STAGE>(src, k)));
  scale = group_scale(block_max<NT>(m, red));
#endif
  for (int k = tid; k < K; k += NT) codes[k] = act_encode(quant_src<STAGE>(src, k) / scale);
  if (tid == 0) scales[0] = scale;
#else
  constexpr int QV = 4, SPAN = NT * QV, TPG = QG / QV;  // TPG: threads per group
  static_assert(QG % QV == 0 && SPAN % QG == 0, "a group is whole threads of one pass");
  int first = tid * QV;  // this thread's first element in a pass
  float next[QV];
#pragma unroll
  for (int v = 0; v < QV; ++v) next[v] = first + v < K ? quant_src<STAGE>(src, first + v) : 0.0f;
  for (int k0 = 0; k0 < K; k0 += SPAN) {  // uniform over the block
    float x[QV], m = 0.0f;
#pragma unroll
    for (int v = 0; v < QV; ++v) {
      x[v] = next[v];
      m = fmaxf(m, fabsf(x[v]));
      int k = k0 + SPAN + first + v;
      next[v] = k < K ? quant_src<STAGE>(src, k) : 0.0f;
    }
    red[tid] = m;
    __syncthreads();
    int g0 = tid - tid % TPG;
    float amax = red[g0];
#pragma unroll
    for (int i = 1; i < TPG; ++i) amax = fmaxf(amax, red[g0 + i]);
    __syncthreads();  // every group's maxima read before the next pass writes them
    float scale = group_scale(amax);
    int k = k0 + first;
#pragma unroll
    for (int v = 0; v < QV; ++v)
      if (k + v < K) codes[k + v] = act_encode(x[v] / scale);
    if (tid % TPG == 0 && k < K) scales[k / QG] = scale;
  }
#endif
#else
  (void)p, (void)row, (void)red;
#endif
}

template <int STAGE>
__device__ void quant_rows(const Params& p) {
  pdl_enter();
  __shared__ float red[THREADS];
  quant_row_block<STAGE, THREADS>(p, blockIdx.x, red);
}

// Pre-quantized hidden_states (docs/layouts.md "Pre-quantized activations"): the caller's
// codes (MXFP4 packed two per byte, low nibble first) and scales (f32 for fp8, e8m0 for MX)
// copied into the stage-1 workspace in the form quant_rows<1> writes, one block per row.
MP_KERNEL void __launch_bounds__(THREADS) moe_import1(Params p) {
  pdl_enter();
#if ACT_Q
  i64 row = blockIdx.x;
  if (row >= local_tokens(p)) return;  // uniform over the block
  const u8* src = (const u8*)p.x + row * p.x_cols;
  u8* codes = (u8*)p.xq + row * p.H;
  for (int k = threadIdx.x; k < p.H; k += THREADS) {
#if ACT_Q == AD_MXFP4
    codes[k] = (src[k >> 1] >> (4 * (k & 1))) & 15u;
#else
    codes[k] = src[k];
#endif
  }
  float* scales = (float*)p.xs + row * p.ng1;
  for (int g = threadIdx.x; g < p.ng1; g += THREADS) {
    i64 at = row * p.x_scale_cols + g;
#if ACT_Q == AD_MXFP4 || ACT_Q == AD_MXFP8
    scales[g] = mp_e8m0_to_f32(((const u8*)p.x_scale)[at]);
#else
    scales[g] = ((const float*)p.x_scale)[at];
#endif
  }
#endif
}

// QUANT1_IN_ROUTE (spec::KernelSpec::route_quant1): blocks 1 .. M of the route kernel quantize
// the hidden_states rows, moe_quant1's work with the same bits, while block 0 routes: one
// launch fewer, and the quantization no longer waits for the routing. The host launches M + 1
// blocks where it takes this path (not for pre-quantized input), else one.
#if QUANT1_IN_ROUTE && (!ACT_Q || ACT_Q == AD_FP8_PER_TENSOR)
#error "QUANT1_IN_ROUTE: activations quantized per row or group (per tensor needs moe_amax1)"
#endif
MP_KERNEL void __launch_bounds__(SCAN_THREADS) moe_route(Params p) {
  pdl_enter();
#if QUANT1_IN_ROUTE
  if (blockIdx.x > 0) {
    extern __shared__ int sm[];  // SCAN_THREADS floats of it (launch::Plan::route_shared_bytes)
    quant_row_block<1, SCAN_THREADS>(p, blockIdx.x - 1, (float*)sm);
    return;
  }
#endif
  route_block(p);
}

// amax_rows and quant_rows start with pdl_enter: each is its kernel's whole body.
MP_KERNEL void __launch_bounds__(THREADS) moe_amax1(Params p) { amax_rows<1>(p); }
MP_KERNEL void __launch_bounds__(THREADS) moe_amax2(Params p) { amax_rows<2>(p); }
MP_KERNEL void __launch_bounds__(THREADS) moe_quant1(Params p) { quant_rows<1>(p); }
MP_KERNEL void __launch_bounds__(THREADS) moe_quant2(Params p) { quant_rows<2>(p); }

// ---- top-k reduction ---------------------------------------------------------------------

#if FUSED_COMBINE && defined(MP_HIP)
#error "FUSED_COMBINE: CUDA only (heuristics::fused_combine)"
#endif

// Stage-2 partial `at` of y (PARTIALS_16: in the output's type), read from L2 with
// FUSED_COMBINE: it was written by another block of the running kernel, and this SM's L1 may
// hold a stale line around it.
__device__ __forceinline__ float load_partial(const Params& p, i64 at) {
#if PARTIALS_16
  u16 h = ((const u16*)p.y)[at];
  return OUT_F16 ? mp_f16_to_f32(h) : mp_bf16_to_f32(h);
#elif FUSED_COMBINE
  float v;
  asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(v) : "l"((const float*)p.y + at));
  return v;
#else
  return ((const float*)p.y)[at];
#endif
}

// out[t, n] of a local token: the sum over slots s (in order) of y[t*topk + s, n] for routed
// pairs. The one definition of the combine: moe_reduce and the fused combine give the same bits.
__device__ __forceinline__ float slot_sum(const Params& p, int t, int n) {
  float sum = 0.0f;
  for (int s = 0; s < p.topk; ++s) {
    int q = t * p.topk + s;
    if (((const int*)p.pair_local)[q] >= 0) sum += load_partial(p, (i64)q * p.H + n);
  }
  return sum;
}

__device__ __forceinline__ void store_out(const Params& p, int t, int n, float v) {
#if OUT_F16
  ((u16*)p.out)[(i64)t * p.out_cols + n] = mp_f32_to_f16(v);
#else
  ((u16*)p.out)[(i64)t * p.out_cols + n] = mp_f32_to_bf16(v);
#endif
}

// out[t, n] = slot_sum for routed pairs; rows at or beyond num_local_tokens and padded
// columns are zero.
MP_KERNEL void __launch_bounds__(THREADS) moe_reduce(Params p) {
  pdl_enter();
  int t = blockIdx.x, n = blockIdx.y * THREADS + threadIdx.x;  // x: tokens (no 65535 cap)
  if (n >= p.out_cols) return;
  store_out(p, t, n, t < local_tokens(p) && n < p.H ? slot_sum(p, t, n) : 0.0f);
}

// ---- fused top-k combine (FUSED_COMBINE) -------------------------------------------------
//
// Stage 2 does moe_reduce's work, without its launch. Its grid is (max_tiles + zero blocks,
// ncb2). A compute block writes its partial rows as before, then each of its routed rows counts
// one arrival at (token, column block); the block whose arrival completes the token's routed
// slots sums them with slot_sum. The zero blocks (x >= max_tiles) write the elements no
// compute block owns: every column of tokens without a routed slot (at or beyond
// num_local_tokens, masked off, out of range) and the padded columns. The route kernel zeroes
// the counters. Each family's stage 2 calls combine_zero_block first and combine_arrive last,
// with the block's columns [col0, col0 + ncols); both are no-ops without FUSED_COMBINE.

// Whether this block is a zero block (then it did its work and the caller returns).
__device__ __forceinline__ bool combine_zero_block(const Params& p, int col0, int ncols) {
#if FUSED_COMBINE
  if ((int)blockIdx.x < p.max_tiles) return false;
  int zb = blockIdx.x - p.max_tiles, nzb = gridDim.x - p.max_tiles;
  int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  int end = min(col0 + ncols, p.H);
  bool pad = blockIdx.y == gridDim.y - 1;  // the last column block zeroes [H, out_cols)
  const int* pl = (const int*)p.pair_local;
  for (i64 t0 = (i64)zb * THREADS; t0 < p.M; t0 += (i64)nzb * THREADS) {  // warp-uniform
    int t = (int)(t0 + tid);
    bool routed = false;
    for (int s = 0; t < p.M && s < p.topk; ++s) routed |= pl[(i64)t * p.topk + s] >= 0;
    u32 unrouted = __ballot_sync(0xffffffffu, t < p.M && !routed);
    u32 live = __ballot_sync(0xffffffffu, t < p.M);
    for (int b = 0; b < 32; ++b) {
      if (!(live >> b & 1)) continue;
      int tok = (int)t0 + warp * 32 + b;
      int from = unrouted >> b & 1 ? col0 : end;
      for (int n = from + lane; n < end; n += 32) store_out(p, tok, n, 0.0f);
      if (pad)
        for (int n = p.H + lane; n < p.out_cols; n += 32) store_out(p, tok, n, 0.0f);
    }
  }
  return true;
#else
  (void)p, (void)col0, (void)ncols;
  return false;
#endif
}

// Called by every thread of a compute block after its store_down writes; s_row: the block's
// BM sorted rows (pair index or -1).
__device__ __forceinline__ void combine_arrive(const Params& p, const int* s_row, int col0,
                                               int ncols) {
#if FUSED_COMBINE
  __shared__ int s_last[BM];  // token this row's arrival completed, or -1
  const int* pl = (const int*)p.pair_local;
  int tid = threadIdx.x;
  __threadfence();  // this block's partials reach device scope before its arrivals count
  __syncthreads();
  if (tid < BM) {
    int q = s_row[tid], last = -1;
    if (q >= 0) {
      int t = q / p.topk, routed = 0;
      for (int s = 0; s < p.topk; ++s) routed += pl[t * p.topk + s] >= 0;
      int* counter = (int*)p.combine + (i64)t * p.ncb2 + blockIdx.y;
      if (atomicAdd(counter, 1) == routed - 1) {
        __threadfence();  // every other arrival's partials are visible before the sum reads
        last = t;
      }
    }
    s_last[tid] = last;
  }
  __syncthreads();
  for (int i = tid; i < BM * ncols; i += THREADS) {
    int t = s_last[i / ncols], n = col0 + i % ncols;
    if (t >= 0 && n < p.H) store_out(p, t, n, slot_sum(p, t, n));
  }
#else
  (void)p, (void)s_row, (void)col0, (void)ncols;
#endif
}
