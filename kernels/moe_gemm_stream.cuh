// GEMM family FAMILY_STREAM: weight streaming for few tokens per expert (decode), CUDA sm_80+.
//
// Swap-AB: C^T = W * X^T, so 16 weight rows fill the M side of mma.sync and the tokens of one
// sorted tile (BM = 16, two 8-token column tiles) the N side. A block owns 32 weight rows
// (stage 1: 16 gate + 16 up rows of 16 output features; stage 2: 32 output rows) for one
// sorted tile, per row group: KW of the 8 warps split K (warp w takes the 4-pack steps w,
// w + KW, ...), the block holds 8 / KW row groups (fewer, longer K walks when K is short);
// the partial sums are added in warp order through shared memory (deterministic). Every weight
// byte of a touched expert is read once per sorted tile, by 16-byte loads straight into
// registers one step ahead of the MMAs (two for 16-bit weights with SW_AHEAD = 2), with the
// step's activations and scales (the F1 layout stores 16 rows x one 16-byte pack as 256
// contiguous bytes, and lane (gid, tig) takes rows gid and gid + 8 of pack tig, so a warp's
// loads of a step cover 1 KiB per 16-row tile).
// A cp.async ring through shared memory (4 stages) measured 1.5-2x slower than this on the
// H200 (bench/NOTES.md).
//
// The k order inside an MMA is free as long as both operands use the same one: a lane's
// weight registers hold the consecutive k of its pack, and its activation registers are
// loaded (and for MXFP4 permuted) to match, so no shuffle is needed.
//
// Formats (the host picks this family only for these, heuristics::stream_spec_unsupported):
// - BF16 / FP16 weights with activations of the same type: the MMA of that type.
// - MXFP4 weights with bf16 activations: e2m1 -> bf16 by shifts and masks (8 codes per word),
//   times 2^126 * the e8m0 scale by one exact bf16 multiply (MX scales are powers of two).
// - FP8 e4m3fn weights (per tensor / channel / block 128) with fp8 activations (per token /
//   tensor / 1x128): the fp8 MMA m16n8k32 (sm_89+; sm_90 has no fp8 mma.sync, and ptxas runs
//   it as e4m3 -> f16 conversions and two f16 MMAs: bench/NOTES.md, session 13); block scales
//   fold into the fp32 sums per 64-column step (a step never straddles a 128 block), the
//   others apply in the epilogue.
#pragma once
#include "moe_common.cuh"
#include "cp_async.cuh"
#include "mma_sm80.cuh"
#include "mx_bf16.cuh"

#define SW_WARPS 8          // warps per block, splitting K
#define SW_SUBS (BM / 8)    // 8-token column tiles per sorted tile
#define SW_TLD (BM + 1)     // shared row stride of the partial sums (floats)
// SW_KW1 / SW_KW2 (-D, heuristics::stream_split_k): warps splitting K in stage 1 / 2.
#if !defined(SW_KW1) || !defined(SW_KW2) || SW_WARPS % SW_KW1 || SW_WARPS % SW_KW2
#error "SW_KW1 / SW_KW2: warps splitting K per stage, dividing SW_WARPS"
#endif

#if WFMT == WF_BF16 || WFMT == WF_FP16
#define SW_VALS 8           // weight values per 16-byte pack
#define SW_FP8 0
#elif WFMT == WF_MXFP4
#define SW_VALS 32
#define SW_FP8 0
#elif WFMT == WF_FP8_PER_TENSOR || WFMT == WF_FP8_PER_CHANNEL || WFMT == WF_FP8_BLOCK128
#define SW_VALS 16
#define SW_FP8 1
#else
#error "FAMILY_STREAM: unsupported weight format"
#endif
#if SW_FP8 && !ACT_Q
#error "FAMILY_STREAM: fp8 weights run with fp8 activations"
#endif
#define SW_KSTEP (4 * SW_VALS)  // K columns per warp step (4 lanes per row)
// Activation packs (16 bytes) per lane, step and 8-token column tile: 16-bit and fp8 take one
// (prefetched with the weights), MXFP4's 32 bf16 values take four (loaded in the step: the
// registers of a second set would not fit two blocks per SM).
#if WFMT == WF_MXFP4
#define SW_XPACKS 4
#else
#define SW_XPACKS 1
#endif
// SW_AHEAD (-D, spec::KernelSpec::stream_ahead): weight steps in flight while a warp
// computes one. Two take a third register set: 16-bit weights in 16-row tiles only (their
// step is a few MMAs, so the warp waits on its loads, and the set fits the two-block cap).
#if !defined(SW_AHEAD) || SW_AHEAD < 1 || SW_AHEAD > 2 || (SW_AHEAD == 2 && (SW_VALS != 8 || BM != 16))
#error "SW_AHEAD: 1, or 2 for 16-bit weights in 16-row tiles (heuristics::stream_ahead_max)"
#endif
// fp8: scales that vary along K fold into the sums per step.
#define SW_FOLD (SW_FP8 && (WFMT == WF_FP8_BLOCK128 || ACT_Q == AD_FP8_BLOCK128))

// 16 bytes of a stream read once (weights): not kept in L1.
__device__ __forceinline__ uint4 sw_load_stream(const u8* p) {
#ifdef MP_HOST  // the emulator (scripts/emu)
  emu_note_stream_load(p);
  return *(const uint4*)p;
#else
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
#endif
}
// L2 prefetch (MOEPLUG_STREAM_PREFETCH, spec::StreamPrefetch, off by default): bytes in
// flight beyond the register loads one step ahead (~32 KiB per SM), holding no register. On
// the H200 it moved decode by -4 to +5 % and the whole-tile form gained nothing (bench/NOTES.md,
// session 7). SW_PF > 0: each warp asks for the lines of its step SW_PF of its steps
// beyond the register loads (and MXFP4 its next step's activations into the L1). SW_PF_TILE:
// the block asks once for every weight byte it reads.
#if !defined(SW_PF) || !defined(SW_PF_TILE)
#error "SW_PF / SW_PF_TILE: the stream family's L2 prefetch (spec::StreamPrefetch)"
#endif
#if SW_PF_TILE && defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#error "SW_PF_TILE: the bulk L2 prefetch needs sm_90"
#endif
// The 128-byte line holding p into the L2 (a hint: no register, no L1 line, no fault).
__device__ __forceinline__ void sw_prefetch_line(const u8* p) {
#ifdef MP_HOST
  emu_note_prefetch_line(p);
#else
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
#endif
}
// SW_PF_BIAS (-D, spec::KernelSpec::stream_bias_prefetch): each row group's bias lines into
// the L1 and L2 before its K walk (the epilogue's first bias use waited on HBM).
#ifndef SW_PF_BIAS
#define SW_PF_BIAS 0
#endif
#if SW_PF_BIAS && !HAS_BIAS
#error "SW_PF_BIAS: a bias to prefetch"
#endif
// The line holding p into the L1 (and the L2): data the block's ordinary loads read later
// (the emulator's line check covers the weight prefetches only).
__device__ __forceinline__ void sw_prefetch_line_l1(const u8* p) {
#ifdef MP_HOST
  (void)p;
#else
  asm volatile("prefetch.global.L1 [%0];" ::"l"(p));
#endif
}
// `bytes` (a multiple of 16) from p (16-byte aligned) into the L2, by the copy engine.
__device__ __forceinline__ void sw_prefetch_bulk(const u8* p, u32 bytes) {
#if defined(MP_HOST)
  emu_note_prefetch_range(p, bytes);
#elif !SW_PF_TILE
  (void)p;
  (void)bytes;
#else
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
#endif
}

__device__ __forceinline__ u32 sw_word(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;  // i is a compile-time constant
}

__device__ __forceinline__ void sw_mma(float* c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1) {
#if SW_FP8
  mma_e4m3_16832(c, a0, a1, a2, a3, b0, b1);
#elif WFMT == WF_FP16
  mma_f16_16816(c, a0, a1, a2, a3, b0, b1);
#else
  mma_bf16_16816(c, a0, a1, a2, a3, b0, b1);
#endif
}

// First weight row of row group g's two 16-row tiles (gated stage 1: t = 0 gate, t = 1 up
// rows of 16 features; stage 2 and a non-gated stage 1: 32 output rows).
template <bool GATED>
__device__ __forceinline__ int sw_tile_row0(const Params& p, int g, int t) {
  if (GATED) {
    int f0 = g * 16;
#if GATE == GM_SEPARATED
    return t ? p.Ip + f0 : f0;
#else  // GM_INTERLEAVE: 16 gate rows then 16 up rows per 32
    return 2 * f0 + 16 * t;
#endif
  }
  return g * 32 + 16 * t;
}

// FUSED_QUANT2 (spec::KernelSpec::fused_quant2, stage 2): the block quantizes its tile's rows
// of the intermediate itself, moe_quant2's work for those rows with the same bits, into
// shared memory, and its K loop reads the codes from there: no moe_quant2 launch. Meant for
// few tokens per tile (decode), where those rows are a small read from the L2 next to the
// block's weights. I <= SW_Q2_MAX_I (heuristics::stream_quant2_unsupported).
#ifndef FUSED_QUANT2
#define FUSED_QUANT2 0
#endif
#if FUSED_QUANT2
#if BM != 16 || (ACT_Q != AD_FP8_BLOCK128 && ACT_Q != AD_FP8_PER_TOKEN)
#error "FUSED_QUANT2 (stream): 16-row tiles, fp8 per-token or 1x128 activations"
#endif
#define SW_Q2_MAX_I 1024
#define SW_Q2_GROUPS (SW_Q2_MAX_I / 128)
__shared__ __align__(16) u8 sw_q2_codes[BM * SW_Q2_MAX_I];  // row t at t * sw_q2_stride
__shared__ float sw_q2_scales[BM * SW_Q2_GROUPS];            // row t at t * SW_Q2_GROUPS
__device__ __forceinline__ int sw_q2_stride(int I) { return (I + 15) & ~15; }

// Each warp takes (row, group) pairs of the tile in turn (per token: the row is one group):
// the group's amax by lanes and shuffles, then its codes, as quant_rows<2> writes them.
__device__ void sw_quantize_tile(const Params& p, const int* s_row) {
  int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, I = p.I;
#if ACT_Q == AD_FP8_BLOCK128
  constexpr int QW = 128;
#else
  constexpr int QW = SW_Q2_MAX_I;  // the whole row
#endif
  int groups = (I + QW - 1) / QW;
  for (int item = warp; item < BM * groups; item += SW_WARPS) {
    int t = item / groups, g = item % groups, q = s_row[t];
    if (q < 0) continue;  // warp-uniform
    const u16* src = (const u16*)p.inter + (i64)q * I;
    int k0 = g * QW, k1 = min(k0 + QW, I);
    float m = 0.0f;
    for (int k = k0 + lane; k < k1; k += 32) m = fmaxf(m, fabsf(quant_src<2>(src, k)));
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
    float scale = group_scale(m);
    u8* codes = sw_q2_codes + t * sw_q2_stride(I);
    for (int k = k0 + lane; k < k1; k += 32) codes[k] = act_encode(quant_src<2>(src, k) / scale);
    if (lane == 0) sw_q2_scales[t * SW_Q2_GROUPS + g] = scale;
  }
  __syncthreads();
}
#endif

// SW_XSHARED (-D, spec::KernelSpec::stream_x_shared): MXFP4's activation packs reach the K
// loop through a per-lane ring in dynamic shared memory, copied by cp.async one step ahead
// (as the weights are into registers), instead of four 16-byte L1 / L2 loads per lane, step
// and column tile issued in the step that consumes them: those loads were the step's largest
// stall (ncu, gpt-oss M = 256: the activation PRMTs held 24 % of the samples). A lane reads only
// what it copied (no barrier); slot s, column tile j, pack i of thread t at
// s * SW_XRING_SLOT + j * SW_XRING_J + i * SW_XRING_I + 16 t: a warp's 32 lanes read 512
// contiguous bytes (no bank conflict). The whole-row copy this replaced measured 3-7 % slower
// than the loads (bench/NOTES.md, session 30).
#ifndef SW_XSHARED
#define SW_XSHARED 0
#endif
#if SW_XSHARED && (WFMT != WF_MXFP4 || BM != 16 || ACT_Q || SW_AHEAD != 1)
#error "SW_XSHARED: MXFP4 weights with 16-bit activations in 16-row tiles, one step ahead"
#endif
#if SW_XSHARED
#define SW_XRING_I (THREADS * 16)              // bytes from a thread's pack i to i + 1
#define SW_XRING_J (4 * SW_XRING_I)            // from column tile j to j + 1
#define SW_XRING_SLOT (SW_SUBS * SW_XRING_J)   // from slot 0 to slot 1 (a power of two)
#define SW_XRING_BYTES (2 * SW_XRING_SLOT)     // spec::KernelSpec::dynamic_shared_bytes
// The block's dynamic shared memory in bytes, as launched.
__device__ __forceinline__ u32 sw_dynamic_shared_bytes() {
#ifdef MP_HOST
  return emu_dyn_bytes;
#else
  u32 n;
  asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(n));
  return n;
#endif
}
// 16 bytes at shared-memory address a (a 32-bit address, so that the base of the block's
// rows stays in a register: through a generic pointer ptxas rebuilt the shared window's
// address at each load, 4 instructions, SASS).
__device__ __forceinline__ uint4 sw_lds16(u32 a) {
#ifdef MP_HOST
  return *(const uint4*)emu_shared_ptr(a, 16);
#else
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(a));
  return v;
#endif
}
#endif

// Quantized activations of sorted row t (pair q): the codes (K per row) and the scales,
// moe_quant1's / moe_quant2's rows in global memory, or the block's own (FUSED_QUANT2).
template <bool S1>
__device__ __forceinline__ const u8* sw_act_codes(const Params& p, int t, int q, int K) {
#if FUSED_QUANT2
  if (!S1) return sw_q2_codes + t * sw_q2_stride(K);
#endif
  (void)t;
  return (const u8*)(S1 ? p.xq : p.aq) + (i64)(S1 ? q / p.topk : q) * K;
}
template <bool S1>
__device__ __forceinline__ const float* sw_act_scales(const Params& p, int t, int q) {
#if FUSED_QUANT2
  if (!S1) return sw_q2_scales + t * SW_Q2_GROUPS;
#endif
  (void)t;
  return (const float*)(S1 ? p.xs : p.as) + (i64)(S1 ? q / p.topk : q) * (S1 ? p.ng1 : p.ng2);
}

// The 16-bit activations of pair q: its token's input row (stage 1) or its intermediate row.
template <bool S1>
__device__ __forceinline__ const u8* sw_x_row(const Params& p, int q) {
  return S1 ? (const u8*)p.x + (i64)(q / p.topk) * p.x_cols * 2
            : (const u8*)p.inter + (i64)q * p.I * 2;
}

// Stage 1 (S1) or stage 2; GATED: stage 1 of a gated activation (gate and up tiles).

template <bool S1>
__device__ void moe_gemm_stream(const Params& p) {
  constexpr bool GATED = S1 && GATED_ACT;
  // KW warps split K; RW = 8 / KW row groups (32 weight rows each) per block.
  constexpr int KW = S1 ? SW_KW1 : SW_KW2, RW = SW_WARPS / KW;
  __shared__ float red[RW][KW][2][16][SW_TLD];
  __shared__ int s_row[BM];
  constexpr int COLS2 = RW * 32;  // stage-2 output columns of the block
  if (!S1 && combine_zero_block(p, blockIdx.y * COLS2, COLS2)) return;
  int tile = blockIdx.x;
  if (tile >= *(const int*)p.total_tiles) return;  // empty tile: exit before any load
  int e = ((const int*)p.tile_expert)[tile];
  int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, gid = lane >> 2, tig = lane & 3;
  int kw = warp % KW, rg = warp / KW, group = blockIdx.y * RW + rg;
  int rowv = tid < BM ? ((const int*)p.sorted_rows)[tile * BM + tid] : -1;
  if (tid < BM) s_row[tid] = rowv;
  // Rows past the expert's tokens are padding (-1), all at the end of its last tile.
  int nsub = (__syncthreads_count(rowv >= 0) + 7) >> 3;

  int K = S1 ? p.H : p.I;
  int Kst = S1 ? p.Hp : p.Ip;
  int Nst = S1 ? (GATED ? 2 : 1) * p.Ip : p.Hp;
  i64 kbytes = (i64)Kst * 16 / SW_VALS;  // bytes per stored row
  const u8* W = (const u8*)(S1 ? p.w13 : p.w2) + (i64)e * Nst * kbytes;
  const u8* S = (const u8*)(S1 ? p.w13_scale : p.w2_scale);
  int nchunks = K / SW_VALS, nsteps = (nchunks + 3) >> 2;

  // This lane's weight rows: tile t, half h = row gid + 8 h of the tile (a 16-row tile's
  // weights are contiguous: pack c of its 16 rows at c * 256 bytes).
  int row0[2];
  bool tile_ok[2];
  const u8* wrow[2][2];
#pragma unroll
  for (int t = 0; t < 2; ++t) {
    row0[t] = sw_tile_row0<GATED>(p, group, t);
    tile_ok[t] = row0[t] < Nst;
#pragma unroll
    for (int h = 0; h < 2; ++h)
      wrow[t][h] = W + (i64)(row0[t] >> 4) * 16 * kbytes + (gid + 8 * h) * 16;
  }
#if WFMT == WF_MXFP4
  // The e8m0 scale byte of this lane's row (tile t, half h) at pack column c.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 890
  // sm_80 runs the general step copy, which leaves no registers for the row parts below.
  auto scale_byte = [&](int t, int h, int c) {
    return S[mx_scale_offset(e, row0[t] + gid + 8 * h, Nst, c, Kst / 32)];
  };
#else
  // The offset's row part once, its column part per step (the whole offset in each step took
  // ~50 of a two-column-tile step's ~570 instructions, SASS). One pointer and each row's
  // distance from it (a row group's rows lie within one expert's scales, far under 2^31
  // bytes apart): 5 registers, not 8.
  i64 srow0 = mx_scale_row_part(e, row0[0] + gid, Nst, Kst / 32);
  const u8* sbase = S + srow0;
  int sdelta[2][2];
#pragma unroll
  for (int t = 0; t < 2; ++t)
#pragma unroll
    for (int h = 0; h < 2; ++h)
      sdelta[t][h] = (int)(mx_scale_row_part(e, row0[t] + gid + 8 * h, Nst, Kst / 32) - srow0);
  auto scale_byte = [&](int t, int h, int c) { return sbase[mx_scale_col_part(c) + sdelta[t][h]]; };
#endif
#endif
#if SW_PF_BIAS
  // Bias row r of this row group's tile t is at row0[t] + r of the expert's Nst biases (the
  // weight rows' order: gated_bias, down_bias), so a tile's 16 floats lie in one line.
  if (kw == 0 && lane == 0) {
    const float* bias = (const float*)(S1 ? p.w13_bias : p.w2_bias) + (i64)e * Nst;
#pragma unroll
    for (int t = 0; t < 2; ++t)
      if (tile_ok[t]) sw_prefetch_line_l1((const u8*)(bias + row0[t]));
  }
#endif
#if SW_PF_TILE
  // The row group's first K warp asks for both tiles' packs in 16 KiB pieces, one per lane.
  if (kw == 0) {
    i64 bytes = (i64)nchunks * 256;
#pragma unroll
    for (int t = 0; t < 2; ++t) {
      const u8* tile_bytes = W + (i64)(row0[t] >> 4) * 16 * kbytes;
      for (i64 off = (i64)lane * 16384; tile_ok[t] && off < bytes; off += 32 * 16384)
        sw_prefetch_bulk(tile_bytes + off, (u32)(bytes - off < 16384 ? bytes - off : 16384));
    }
  }
#endif
#if SW_PF > 0
  // The lines a step's loads will read (lane (gid, tig) of half h reads line 2 tig + h of
  // the step's 1 KiB per tile). `load` asks for step st + SW_PF KW at its own addresses plus
  // an immediate; these are the steps between the first load's and the loop's first.
  auto prefetch = [&](int st) {
    int c = st * 4 + tig;
#pragma unroll
    for (int t = 0; t < 2; ++t)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        if (c < nchunks && tile_ok[t]) sw_prefetch_line(wrow[t][h] + (i64)c * 256);
  };
#pragma unroll
  for (int j = 2; j < SW_PF; ++j) prefetch(kw + j * KW);
#endif
#if FUSED_QUANT2
  if constexpr (!S1) {
    // The lines of the warp's first weight step into the L2 while the tile's rows are
    // quantized (the K loop's first loads then wait on the L2, not on HBM).
    int c = kw * 4 + tig;
#pragma unroll
    for (int t = 0; t < 2; ++t)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        if (kw < nsteps && c < nchunks && tile_ok[t]) sw_prefetch_line(wrow[t][h] + (i64)c * 256);
    sw_quantize_tile(p, s_row);
  }
#endif
  // This lane's activation rows: token gid of each column tile (B operand), and for the
  // epilogue-side fold the tokens 2 tig, 2 tig + 1 of each column tile (C columns).
  const u8* xrow[SW_SUBS];
#pragma unroll
  for (int j = 0; j < SW_SUBS; ++j) {
    int q = s_row[8 * j + gid];
    xrow[j] = nullptr;
    if (q >= 0) {
#if ACT_Q
      xrow[j] = sw_act_codes<S1>(p, 8 * j + gid, q, K);
#else
      xrow[j] = sw_x_row<S1>(p, q);
#endif
    }
  }
#if SW_FOLD && ACT_Q == AD_FP8_BLOCK128
  const float* ascale[SW_SUBS][2];
#pragma unroll
  for (int j = 0; j < SW_SUBS; ++j)
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      int q = s_row[8 * j + 2 * tig + c];
      ascale[j][c] = nullptr;
      if (q >= 0) ascale[j][c] = sw_act_scales<S1>(p, 8 * j + 2 * tig + c, q);
    }
#endif

#if SW_XSHARED
  extern __shared__ __align__(128) u8 sw_xs[];
  const u32 xbytes = sw_dynamic_shared_bytes();
  if (xbytes < SW_XRING_BYTES) {  // the host sizes it: a library bug
#ifdef MP_HOST
    emu_fail("SW_XSHARED: the launch's shared memory is short of the ring", xbytes);
#else
    __trap();
#endif
  }
  const u32 xlane = smem_addr(sw_xs) + tid * 16;  // this thread's slot 0, tile 0, pack 0
  u32 xslot = 0;                                  // the slot of the step being computed
#endif

  float acc[2][SW_SUBS][4];
#pragma unroll
  for (int t = 0; t < 2; ++t)
#pragma unroll
    for (int j = 0; j < SW_SUBS; ++j)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[t][j][c] = 0.0f;

  // The K loop in two copies, chosen once per block: ONE, the tile holds at most 8 tokens
  // (decode's usual case), so the second column tile's MMAs, permutes and loads are not
  // compiled in, instead of issuing predicated off (fp8 block-128: 342 -> 179 instructions per
  // step). The loop is bound by instruction issue at M <= 64 (bench/NOTES.md, session 9: 3-8 %
  // faster). A third copy without MXFP4's second scale multiply cost more than it saved: its
  // choice needs a scan of the scales before the first weight load.
  const int nsub_block = nsub;
  auto k_loop = [&](auto one_case) {
    constexpr bool ONE = decltype(one_case)::value;
    // Two column tiles at most (BM = 16): the other copy has both, and says so to the compiler
    // (no predicated MMAs, WARPSYNCs or zeroed loads for the second). 16-bit weights only:
    // MXFP4's stage 1 with a bias and fp8 block-128's stage 1 then spill 4-28 bytes (SASS).
    constexpr bool TWO = SW_SUBS == 2 && SW_VALS == 8;
    const int nsub = ONE ? 1 : TWO ? 2 : nsub_block;
    // What one step of this lane reads, loaded SW_AHEAD steps ahead: weight packs (tile t, row
    // gid + 8 h) and, except for MXFP4, the activation pack of each column tile.
    struct StepLoads {
      uint4 w[2][2];
#if SW_XPACKS == 1
      uint4 x[SW_SUBS];
#endif
    };
    auto load = [&](int st, StepLoads& l) {
      int c = st * 4 + tig;
      bool live = c < nchunks;
#pragma unroll
      for (int t = 0; t < 2; ++t)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const u8* a = wrow[t][h] + (i64)c * 256;
          l.w[t][h] = live && tile_ok[t] ? sw_load_stream(a) : make_uint4(0u, 0u, 0u, 0u);
#if SW_PF > 0
          if (c + 4 * SW_PF * KW < nchunks && tile_ok[t]) sw_prefetch_line(a + SW_PF * KW * 1024);
#endif
        }
#if SW_XPACKS == 1
#pragma unroll
      for (int j = 0; j < SW_SUBS; ++j)
        l.x[j] = live && j < nsub && xrow[j] ? *(const uint4*)(xrow[j] + (i64)c * 16)
                                             : make_uint4(0u, 0u, 0u, 0u);
#elif SW_PF > 0 && !SW_XSHARED
      // MXFP4's activations stay out of the registers until their step: their line into the
      // L1 now, a step ahead (lanes tig, tig ^ 1 share one 128-byte line).
#pragma unroll
      for (int j = 0; j < SW_SUBS; ++j)
        if (live && j < nsub && xrow[j]) sw_prefetch_line_l1(xrow[j] + (i64)c * 64);
#endif
    };
#if SW_XSHARED
    // This lane's activation packs of step st into ring slot `slot` (zeros past K and for
    // padding rows), as one cp.async group; past the last step an empty group, so that the
    // wait below always leaves exactly the newest in flight.
    auto stage_x = [&](int st, u32 slot) {
      int c = st * 4 + tig;
      bool live = c < nchunks;
      if (st < nsteps) {
#pragma unroll
        for (int j = 0; j < SW_SUBS; ++j) {
          if (j >= nsub) continue;
          bool real = live && xrow[j];
          const u8* src = real ? xrow[j] + (i64)c * 64 : (const u8*)p.x;
#pragma unroll
          for (int i = 0; i < 4; ++i)
            cp_async16_or_zero(xlane + slot + j * SW_XRING_J + i * SW_XRING_I,
                               src + (real ? i * 16 : 0), !real);
        }
      }
      cp_async_commit();
    };
#endif
    // Scales of a step, one step ahead in registers: MXFP4's e8m0 bytes of the lane's 4 rows;
    // fp8's block-128 weight scale per tile and 1x128 activation scales of the C columns.
    struct StepScales {
      u32 mx[2][2];
      float ws[2], as[SW_SUBS][2];
    };
    StepScales scur, snext;
    auto scales = [&](int st, StepScales& sc) {
      int c = st * 4 + tig;
      bool live = st < nsteps && c < nchunks;
#if WFMT == WF_MXFP4
#pragma unroll
      for (int t = 0; t < 2; ++t)
#pragma unroll
        for (int h = 0; h < 2; ++h)
          sc.mx[t][h] = live && tile_ok[t] ? (u32)scale_byte(t, h, c) : 127u;
#endif
#if SW_FOLD
      // A step's 64 columns lie in one 128 block of K (the warp's 4 packs of 16).
      int kblk = (st * SW_KSTEP) >> 7;
      bool in = st < nsteps;
#pragma unroll
      for (int t = 0; t < 2; ++t) {
#if WFMT == WF_FP8_BLOCK128
        int nb = (Nst + 127) >> 7, kbn = (Kst + 127) >> 7;
        sc.ws[t] = in && tile_ok[t] ? ((const float*)S)[((i64)e * nb + (row0[t] >> 7)) * kbn + kblk]
                                    : 0.0f;
#else
        sc.ws[t] = 1.0f;
#endif
      }
#pragma unroll
      for (int j = 0; j < SW_SUBS; ++j)
#pragma unroll
        for (int cc = 0; cc < 2; ++cc) {
#if ACT_Q == AD_FP8_BLOCK128
          sc.as[j][cc] = in && ascale[j][cc] ? ascale[j][cc][kblk] : 0.0f;
#else
          sc.as[j][cc] = 1.0f;
#endif
        }
#endif
      (void)live;
    };

#if SW_XPACKS == 1
    // The MMAs of a step whose weights need no decode (16-bit: two k16 steps of 8 values per
    // lane and row; fp8: two k32 steps of 16), into c.
    auto mma_step = [&](float(&c)[2][SW_SUBS][4], const uint4(&w)[2][2],
                        const uint4(&x)[SW_SUBS]) {
#pragma unroll
      for (int s = 0; s < 2; ++s)
#pragma unroll
        for (int j = 0; j < SW_SUBS; ++j) {
          if (j >= nsub) continue;
#pragma unroll
          for (int t = 0; t < 2; ++t)
            sw_mma(c[t][j], sw_word(w[t][0], 2 * s), sw_word(w[t][1], 2 * s),
                   sw_word(w[t][0], 2 * s + 1), sw_word(w[t][1], 2 * s + 1),
                   sw_word(x[j], 2 * s), sw_word(x[j], 2 * s + 1));
        }
    };
#endif
    // The MMAs of step st from its loads and scales, into acc.
    auto compute = [&](int st, const StepLoads& now, const StepScales& sc) {
      int c = st * 4 + tig;
      bool live = c < nchunks;
      const uint4(&wcur)[2][2] = now.w;
      (void)live;

#if SW_FP8
      // Activation codes: 16 per lane and column tile, the same k as the weight pack.
#if SW_FOLD
      float part[2][SW_SUBS][4];
#pragma unroll
      for (int t = 0; t < 2; ++t)
#pragma unroll
        for (int j = 0; j < SW_SUBS; ++j)
#pragma unroll
          for (int q = 0; q < 4; ++q) part[t][j][q] = 0.0f;
      mma_step(part, wcur, now.x);
#else
      mma_step(acc, wcur, now.x);
#endif
#if SW_FOLD
      {
#pragma unroll
        for (int j = 0; j < SW_SUBS; ++j) {
          if (j >= nsub) continue;
#pragma unroll
          for (int t = 0; t < 2; ++t)
#pragma unroll
            for (int q = 0; q < 4; ++q)
              acc[t][j][q] = fmaf(part[t][j][q], sc.ws[t] * sc.as[j][q & 1], acc[t][j][q]);
        }
      }
#endif
#elif WFMT == WF_MXFP4
      // 32 codes per lane and row; the activations of the same 32 k, paired as the codes are
      // (k, k + 4) within each 8.
      bool twice = false;
#pragma unroll
      for (int t = 0; t < 2; ++t)
#pragma unroll
        for (int h = 0; h < 2; ++h) twice |= sc.mx[t][h] > 128u;
      twice = __any_sync(0xffffffffu, twice);
      // The step in two copies, chosen by the warp-uniform `twice` (a scale above 2 in the
      // warp): predicated off, the second multiply of every code pair still took an issue slot
      // (64 of the step's 570 instructions, SASS), and one multiplier is one IMAD.
      auto mx_step = [&](auto twice_case) {
        constexpr bool TWICE = decltype(twice_case)::value;
        u32 f1[2][2], f2[2][2];
#pragma unroll
        for (int t = 0; t < 2; ++t)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            if (TWICE)
              mx_factors(sc.mx[t][h], f1[t][h], f2[t][h]);
            else
              f1[t][h] = mx_factor_small(sc.mx[t][h]);
          }
#pragma unroll
        for (int i = 0; i < 4; ++i) {  // the lane's 8-code word i = k 8i .. 8i + 7 of its pack
          uint4 xv[SW_SUBS];
#pragma unroll
          for (int j = 0; j < SW_SUBS; ++j)
#if SW_XSHARED
            xv[j] = j < nsub ? sw_lds16(xlane + xslot + j * SW_XRING_J + i * SW_XRING_I)
                             : make_uint4(0u, 0u, 0u, 0u);
#else
            xv[j] = live && j < nsub && xrow[j]
                        ? *(const uint4*)(xrow[j] + (i64)c * 64 + i * 16)
                        : make_uint4(0u, 0u, 0u, 0u);
#endif
#pragma unroll
          for (int s2 = 0; s2 < 2; ++s2) {  // MMA step: code pairs P = 2 s2, 2 s2 + 1
            u32 a[2][2][2];  // [tile][half][pair]
#pragma unroll
            for (int t = 0; t < 2; ++t)
#pragma unroll
              for (int h = 0; h < 2; ++h) {
                u32 v = sw_word(wcur[t][h], i), p0, p1;
                if (s2)
                  mx_e2m1_pair2<1>(v, p0, p1);
                else
                  mx_e2m1_pair2<0>(v, p0, p1);
                p0 = mx_bf16x2_mul(p0, f1[t][h]);
                p1 = mx_bf16x2_mul(p1, f1[t][h]);
                if (TWICE) {
                  p0 = mx_bf16x2_mul(p0, f2[t][h]);
                  p1 = mx_bf16x2_mul(p1, f2[t][h]);
                }
                a[t][h][0] = p0;
                a[t][h][1] = p1;
              }
#pragma unroll
            for (int j = 0; j < SW_SUBS; ++j) {
              if (j >= nsub) continue;
              // activations (e0 e1)(e2 e3)(e4 e5)(e6 e7) -> (e_P, e_P+4) pairs
              u32 w0 = s2 ? xv[j].y : xv[j].x, w1 = s2 ? xv[j].w : xv[j].z;
              u32 b0 = __byte_perm(w0, w1, 0x5410), b1 = __byte_perm(w0, w1, 0x7632);
#pragma unroll
              for (int t = 0; t < 2; ++t)
                sw_mma(acc[t][j], a[t][0][0], a[t][1][0], a[t][0][1], a[t][1][1], b0, b1);
            }
          }
        }
      };
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 890
      // sm_80: with both copies stage 2 spills under the two-block register cap (compile
      // check); the general copy alone costs what the predicated multiplies did.
      (void)twice;
      mx_step(mp_bool<true>{});
#else
      if (twice)
        mx_step(mp_bool<true>{});
      else
        mx_step(mp_bool<false>{});
#endif
#else
      mma_step(acc, now.w, now.x);
#endif
    };
#if SW_AHEAD == 2
    // Two steps in flight while one computes (16-bit weights: no scales): three register
    // sets in rotation, the loop unrolled by three so that no set is copied.
    StepLoads l0, l1, l2;
    if (kw < nsteps) load(kw, l0);
    if (kw + KW < nsteps) load(kw + KW, l1);
    auto step = [&](int st, const StepLoads& now, StepLoads& refill) {
      if (st + 2 * KW < nsteps) load(st + 2 * KW, refill);
      compute(st, now, scur);
    };
    for (int st = kw; st < nsteps; st += 3 * KW) {
      step(st, l0, l2);
      if (st + KW >= nsteps) break;
      step(st + KW, l1, l0);
      if (st + 2 * KW >= nsteps) break;
      step(st + 2 * KW, l2, l1);
    }
    (void)snext;
#else
    StepLoads cur, nxt;
    if (kw < nsteps) load(kw, cur);
#if SW_XSHARED
    stage_x(kw, xslot);
#endif
#if !SW_FOLD
    scales(kw, scur);
#endif
    for (int st = kw; st < nsteps; st += KW) {
      if (st + KW < nsteps) load(st + KW, nxt);
#if SW_XSHARED
      stage_x(st + KW, xslot ^ SW_XRING_SLOT);
      cp_async_wait<1>();  // this step's packs have landed
#endif
#if SW_FOLD
      scales(st, scur);  // fp8 block scales: loaded in the step (registers for two sets spill)
#else
      scales(st + KW, snext);
#endif
      compute(st, cur, scur);
#if !SW_FOLD
      scur = snext;
#endif
#if SW_XSHARED
      xslot ^= SW_XRING_SLOT;
#endif
      cur = nxt;
    }
#endif  // SW_AHEAD
  };
  if (nsub == 1)
    k_loop(mp_bool<true>{});
  else
    k_loop(mp_bool<false>{});

  // Partial sums of each warp -> shared; then each (row, token) of the block adds its KW
  // partials in warp order (deterministic).
#pragma unroll
  for (int t = 0; t < 2; ++t)
#pragma unroll
    for (int j = 0; j < SW_SUBS; ++j) {
      if (j >= nsub) continue;
#pragma unroll
      for (int q = 0; q < 4; ++q)
        red[rg][kw][t][gid + 8 * (q >> 1)][8 * j + 2 * tig + (q & 1)] = acc[t][j][q];
    }
  __syncthreads();
  for (int idx = tid; idx < RW * 16 * BM; idx += THREADS) {
    int g = idx / (16 * BM), r = (idx / BM) % 16, tok = idx % BM, q = s_row[tok];
    if (q < 0) continue;
    float v[2] = {0.0f, 0.0f};
    for (int w = 0; w < KW; ++w) {
      v[0] += red[g][w][0][r][tok];
      v[1] += red[g][w][1][r][tok];
    }
    int grp = blockIdx.y * RW + g;
    float wt = ((const float*)p.topk_weights)[q];
    float sa = 1.0f;  // activation scale that does not vary along K
#if ACT_Q && ACT_Q != AD_FP8_BLOCK128
    sa = *sw_act_scales<S1>(p, tok, q);
#endif
    if (GATED) {
      int col = grp * 16 + r;
      if (col >= p.I) continue;
      float g1 = v[0] * sa, u = v[1] * sa;
      g1 *= epi_w_scale(S, e, gate_row(col, p.Ip), Nst, Kst);
      u *= epi_w_scale(S, e, up_row(col, p.Ip), Nst, Kst);
      store_gated(p, e, q, col, g1, u, wt);
    } else {
#pragma unroll
      for (int t = 0; t < 2; ++t) {
        int col = grp * 32 + 16 * t + r;
        if (col >= (S1 ? p.I : p.H)) continue;
        float y = v[t] * sa;
        y *= epi_w_scale(S, e, S1 ? up_row(col, p.Ip) : col, Nst, Kst);
        if (S1)  // not gated: the up output
          store_gated(p, e, q, col, 0.0f, y, wt);
        else
          store_down(p, e, q, col, y, wt);
      }
    }
  }
  if (!S1) combine_arrive(p, s_row, blockIdx.y * COLS2, COLS2);
}

// Two blocks per SM (16 warps) keep enough weight bytes in flight (the compile check fails on
// any spill this cap would cause). 32-row tiles hold twice the accumulators and activation
// packs: under the two-block cap (128 registers) the fp8 paths spill 0.7-0.9 KiB, so they get
// one block per SM (an experiment, MOEPLUG_STREAM_BM=32: heuristics.rs).
#if BM == 16
#define SW_MIN_BLOCKS 2
#else
#define SW_MIN_BLOCKS 1
#endif
MP_KERNEL void __launch_bounds__(THREADS, SW_MIN_BLOCKS) moe_stage1(Params p) {
  pdl_enter();
  moe_gemm_stream<true>(p);
}
MP_KERNEL void __launch_bounds__(THREADS, SW_MIN_BLOCKS) moe_stage2(Params p) {
  pdl_enter();
  moe_gemm_stream<false>(p);
}
