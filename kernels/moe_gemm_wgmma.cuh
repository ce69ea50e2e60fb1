#pragma once
#include "moe_common.cuh"

#if BM != 64 && BM != 128
#error "this family's thread mapping is written for 64- and 128-row tiles"
#endif
#include "cp_async.cuh"
#include "mma_sm90.cuh"
#include "mx_bf16.cuh"

// GEMM family FAMILY_WGMMA: Hopper warpgroup MMA for many tokens per expert (CUDA sm_90a).
//
// Two warpgroups each issue wgmma m64nWG_Nk16 (16-bit) or m64nWG_Nk32 (fp8 e4m3) on operand
// tiles in shared memory, K in steps of one 128-byte row (64 16-bit or 128 fp8 values). With
// BM = 128 they take 64 sorted rows each against the same WG_N weight rows; with BM = 64 they
// share the 64 rows and take WG_N weight rows each. Both operands are K-major rows of 128
// bytes in the 128-byte swizzle, copied with 16-byte cp.async into a ring of WG_STAGES stages
// (activation rows gathered through the sorted index; zero-filled for padding rows, columns
// past K and weight rows past N). The copies for step k + WG_STAGES - 2 are issued while step
// k's MMAs run; one MMA group stays in flight.
//
// Covered (heuristics::wgmma_spec_unsupported):
// - bf16 x bf16 and fp16 x fp16 (activations of the weights' type, the caller's dtype);
// - MXFP4 weights with bf16 activations: each thread loads one 16-byte pack of 32 codes a
//   step ahead into registers and writes it to the weight tile as bf16 (mx_bf16.cuh: bit
//   operations, the e8m0 scale folded in by exact multiplies), one or two blocks per SM;
//   or (WG_RS, below) decoded into the A fragments of register-operand MMAs;
// - e4m3fn weights (per tensor, per channel, block 128) with fp8 activations (per token, per
//   tensor, block 128), summed in two levels: each step's MMAs go to a partial sum added into
//   the fp32 accumulator (the tensor core's fp8 sums keep ~14 bits), scaled there by the
//   step's block-128 scales; scales that do not vary along K are applied in the epilogue.
// Each warpgroup's WG_N weight rows of stage 1 are WG_N / 2 gate and WG_N / 2 up rows of the
// same output columns, so the epilogue pairs them in-thread.
//
// Two ways to fill the ring, both on AITER 16x16 weights (not MXFP4):
// - WG_TMA: the weight tile by TMA copies (no swizzle, [chunk][row] core matrices),
//   completing on the stage's mbarrier; activations as above. One copy (box) per warpgroup's
//   WG_N weight rows: one per stage on 128-row tiles, where the warpgroups share the rows, two
//   on 64-row tiles, each warpgroup's own rows in a region of their own.
// - WG_WS (needs WG_TMA): warp-specialised and persistent, moe_gemm_wg_ws below.
// Measured on the H200 (bench/NOTES.md): warp specialisation 3-10 % at M = 1024 (session 4);
// TMA boxes whose innermost row is 256 bytes, not 16, cut the L2 requests 4.6x and made the
// TMA configurations 1.2-1.5x faster (session 11).
//
// From spec.rs: WG_N (weight rows per warpgroup MMA: 128 or 256), WG_STAGES (ring depth),
// WG_SMEM_BYTES (the dynamic shared memory the host launches with), WG_MIN_BLOCKS (blocks per
// SM the register budget is for), WG_TMA, WG_WS.
// WG_TMA: the weight tile comes by one TMA copy per stage (tensor map of the AITER 16x16
// layout from the host, see below) instead of per-thread cp.async: the L2's tag lookups, not
// its bytes, bound the copies (bench/NOTES.md), and a TMA box asks for whole lines.
#if !defined(WG_N) || !defined(WG_STAGES) || !defined(WG_SMEM_BYTES) || !defined(WG_MIN_BLOCKS)
#error "WG_N, WG_STAGES, WG_SMEM_BYTES, WG_MIN_BLOCKS: set by the host"
#endif
#ifndef WG_TMA
#define WG_TMA 0
#endif
#ifndef WG_WS
#define WG_WS 0
#endif
#ifndef WG_GROUP
#define WG_GROUP 0
#endif
#ifndef WG_RS
#define WG_RS 0
#endif
// WG_KSPLIT (warp-specialised kernel, 64-row tiles): both MMA warpgroups take the same WG_N
// weight rows and split K between them (even steps warpgroup 0, odd steps 1), adding their sums
// through shared memory before warpgroup 0's epilogue. A block then covers WG_N weight rows,
// not 2 WG_N: twice the work items, each half the bytes, to even out a short last wave. An
// opt-in (heuristics::wgmma_ksplit): 0.99-1.06x on the H100 (bench/NOTES.md, session 20).
#ifndef WG_KSPLIT
#define WG_KSPLIT 0
#endif
#if WG_KSPLIT && (!WG_WS || BM != 64 || WG_N != 128 || FUSED_QUANT2 || WG_STAGES % 2)
#error "WG_KSPLIT: warp-specialised, 64-row tiles, WG_N 128, no FUSED_QUANT2, even stages"
#endif
#if WG_STAGES < 3
#error "the ring needs 3 stages (copies run WG_STAGES - 2 steps ahead)"
#endif
#define WG_ROW 128                   // bytes per operand row per K step
// WG_SWAP: MXFP4 as the register operand on the warp-specialised kernel, 256 weight rows per
// block and 128 codes per step (moe_gemm_wgmma_swap.cuh).
#define WG_SWAP (WG_RS && WG_WS)
#define WG_B_ROWS (WG_SWAP ? 256 : BM == 128 || WG_KSPLIT ? WG_N : 2 * WG_N)  // weight rows of a block
#define WG_A_BYTES (BM * WG_ROW)         // activation tile of one stage
#define WG_B_BYTES (WG_B_ROWS * WG_ROW)  // weight tile of one stage
#define WG_ESIZE (ACT_Q ? 1 : 2)     // operand bytes per value
#define WG_MX4 (WFMT == WF_MXFP4)    // weights decoded to bf16 into the weight tile
// MXFP4 on the warp-specialised kernel (WG_MX4_WS): a stage holds the activations, the packed
// codes (32 bytes per weight row and step, [16-byte chunk][row]) and their scales; the
// consumers decode the codes into one of WG_DEC_TILES bf16 weight tiles after the ring and
// multiply from there.
#define WG_MX4_WS (WG_MX4 && WG_WS && !WG_SWAP)
#define WG_PACK_BYTES (WG_B_ROWS * 32)
// After a stage's packs, their e8m0 scales (2 bytes per weight row), padded to 1 KiB so that
// every stage's activation tile stays 1024-aligned for the 128-byte swizzle.
#define WG_MX_SCALE_BYTES 1024
#define WG_DEC_TILES (WG_MX4_WS ? 3 : 0)
// WG_PACK_COPIES (the MXFP4 tile kernel: neither warp-specialised nor register-operand; an
// opt-in until measured): each thread copies its pack of a step (16 bytes) and the 4-byte
// word that holds its scale WG_MX_AHEAD steps ahead into its part of slot ks % WG_MX_SLOTS
// after the ring, instead of loading them into registers one step ahead. A thread reads only
// what it copied, so the slots need no barrier; the ring's stages (3 at two blocks per SM)
// are what the activation copies and the decoded tile need.
#ifndef WG_PACK_COPIES
#define WG_PACK_COPIES 0
#endif
#if WG_PACK_COPIES && !(WG_MX4 && !WG_WS && !WG_RS)
#error "WG_PACK_COPIES: the MXFP4 tile kernel only"
#endif
// WG_BULK_PACKS (the swap-AB kernel on AITER 16 x 16 weights; an opt-in until measured): the
// producer copies each 16-row group's packs of a step with one bulk copy, not 64 cp.async.
#ifndef WG_BULK_PACKS
#define WG_BULK_PACKS 0
#endif
#if WG_BULK_PACKS && !(WG_RS && WG_WS && WLAYOUT == WL_AITER_16X16)
#error "WG_BULK_PACKS: the swap-AB kernel on AITER 16x16 weights only"
#endif
#define WG_MX_AHEAD 2
#define WG_MX_SLOTS (WG_PACK_COPIES ? WG_MX_AHEAD + 1 : 0)
#define WG_MX_SLOT_BYTES (THREADS * 20)
// WG_DECODERS (0 or 2, MXFP4 warp-specialised): warpgroups beside the two MMA warpgroups that
// only decode. Every consumer thread then decodes part of a pack (32 / (1 + WG_DECODERS / 2)
// codes), so twice the warps share a step's decode, as two blocks of the tile kernel do.
#ifndef WG_DECODERS
#define WG_DECODERS 0
#endif
#if WG_DECODERS && (WG_DECODERS != 2 || !WG_MX4_WS)
#error "WG_DECODERS: 2 decoding warpgroups, MXFP4 on the warp-specialised kernel only"
#endif
// Threads that decode a step's packs and meet at named barrier 1 (wg_consumers_sync).
#define WG_CONSUMER_THREADS (256 + 128 * WG_DECODERS)
// 32-bit words of codes (8 each) a consumer thread decodes per step: a step's 256 packs of 4.
#define WG_DEC_WORDS (4 * 256 / WG_CONSUMER_THREADS)
// WG_RS: the weights never pass through shared memory, a stage is the activation tile alone;
// WG_SWAP: two 64-K halves of it, then the step's packs (64 bytes per weight row) and scales
// (a word per weight row).
#define WG_STAGE_BYTES                                       \
  (WG_SWAP ? 2 * WG_A_BYTES + WG_B_ROWS * 64 + WG_B_ROWS * 4 \
   : WG_RS ? WG_A_BYTES                                      \
           : WG_A_BYTES + (WG_MX4_WS ? WG_PACK_BYTES + WG_MX_SCALE_BYTES : WG_B_BYTES))
#if WG_MX4 && (ACT_Q || ACT_F16 || WG_B_ROWS != (WG_SWAP ? 256 : 128))
#error "MXFP4 weights: bf16 activations, 128 weight rows per block (one pack per thread)"
#endif
#if WG_RS && (!WG_MX4 || WG_N != BM || WG_TMA)
#error "register-operand weights: MXFP4, the MMA's N the tile's BM sorted rows, without TMA"
#endif
#if WG_TMA && (WLAYOUT != WL_AITER_16X16 || WG_MX4)
#error "TMA weight tiles: AITER 16x16 weights of a 16-bit or fp8 format"
#endif
#define WG_BOXES (WG_B_ROWS / WG_N)  // TMA weight boxes per stage, one per warpgroup's rows
#define WG_KSTEP (WG_ROW / WG_ESIZE)  // K values per step
#define WG_FOLD (ACT_Q != 0)                 // fp8: two-level sums
#define WG_KSCALE (WFMT == WF_FP8_BLOCK128)  // a weight/activation scale per step
#if WG_KSCALE && (ACT_Q != AD_FP8_BLOCK128 || WG_KSTEP != 128)
#error "fp8 block-128 weights run with fp8 block-128 activations (one scale block per step)"
#endif
#define WG_B_CHUNKS (WG_B_BYTES / 16 / THREADS)
#define WG_ACC (WG_N / 2)  // accumulator registers per thread
// + 1024: the base is aligned up
#if WG_SMEM_BYTES < \
    WG_STAGES * WG_STAGE_BYTES + WG_DEC_TILES * WG_B_BYTES + WG_MX_SLOTS * WG_MX_SLOT_BYTES + 1024
#error "WG_SMEM_BYTES does not hold the ring (and the decoded weight tiles)"
#endif

// cp.async writes are generic-proxy writes; wgmma reads shared memory through the async proxy.
__device__ __forceinline__ void fence_proxy_async() {
#ifdef MP_HOST
  // one proxy on the host
#else
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
}

// The host's CUtensorMap (opaque, 128 bytes, 64-aligned), a __grid_constant__ kernel parameter.
struct __align__(64) WgTmaMap {
  u64 words[16];
};

// mbarrier of one ring stage: the TMA copy of its weight tile completes on it.
__device__ __forceinline__ void mbar_init(u32 bar, u32 count) {
#ifdef MP_HOST
  emu_mbar_init(bar, count);
#else
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
#endif
}
__device__ __forceinline__ void mbar_expect_bytes(u32 bar, u32 bytes) {
#ifdef MP_HOST
  emu_mbar_expect_tx(bar, bytes);
#else
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes)
               : "memory");
#endif
}
// Adds `bytes` to the current phase's transaction count without arriving (the issuing thread
// arrives later): the bulk copies it then starts complete them.
__device__ __forceinline__ void mbar_expect_tx(u32 bar, u32 bytes) {
#ifdef MP_HOST
  emu_mbar_expect_tx_only(bar, bytes);
#else
  asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(bytes)
               : "memory");
#endif
}
// `bytes` (a multiple of 16, both addresses 16-byte aligned) from global to shared memory,
// completing on the barrier `bar` (cp.async.bulk, no tensor map).
__device__ __forceinline__ void bulk_copy(u32 dst, const void* src, u32 bytes, u32 bar) {
#ifdef MP_HOST
  emu_bulk_copy(dst, src, bytes, bar);
#else
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::
          "r"(dst),
      "l"(src), "r"(bytes), "r"(bar)
      : "memory");
#endif
}
__device__ __forceinline__ void mbar_wait(u32 bar, u32 parity) {
#ifdef MP_HOST
  emu_mbar_wait(bar, parity);
#else
  u32 done;
  do {
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
#endif
}
// Box (a 16-row group's 16-byte chunk column of 256 bytes, 1, group, gate/up half, K chunk) of
// the tensor map (src/backend/gpu/tma.rs) at coordinates {0, 0, group, 0, chunk} into shared
// memory as [chunk][row][16 bytes].
__device__ __forceinline__ void tma_load_box(u32 dst, const WgTmaMap* map, int group, int chunk,
                                             u32 bar) {
#ifdef MP_HOST
  emu_tma_load_5d(dst, map->words, 0, 0, group, 0, chunk, bar);
#else
  asm volatile(
      "cp.async.bulk.tensor.5d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4, %5, %6}], [%7];" ::"r"(dst),
      "l"((u64)map), "r"(0), "r"(0), "r"(group), "r"(0), "r"(chunk), "r"(bar)
      : "memory");
#endif
}

// The map's 16-row group of a block's first weight row (its columns from n0; stage 1 counts
// gate groups: SEPARATED's up groups are Ip / 16 further, the map's half stride; INTERLEAVE's
// groups are gate/up pairs).
template <bool GATED>
__device__ __forceinline__ int wg_tma_group(int e, int Nst, int n0) {
  if (!GATED) return (e * Nst + n0) >> 4;
  return GATE == GM_INTERLEAVE ? (e * Nst >> 5) + (n0 >> 4) : (e * Nst + n0) >> 4;
}

// The block's weight tile of K step ks into the stage's weight tile at sb, completing on bar:
// one box per warpgroup's WG_N rows (stage 1: the gate and up rows of WG_N / 2 columns), each
// at its warpgroup's rows.
template <bool GATED>
__device__ __forceinline__ void tma_load_weights(u32 sb, const WgTmaMap* map, int group, int ks,
                                                 u32 bar) {
  mbar_expect_bytes(bar, WG_B_BYTES);
#pragma unroll
  for (int b = 0; b < WG_BOXES; ++b)
    tma_load_box(sb + (u32)(b * WG_N * WG_ROW), map, group + b * (GATED ? WG_N / 2 : WG_N) / 16,
                 ks * (WG_ROW / 16), bar);
}

// Byte offset of 16-byte chunk c of row r in a 128-byte-swizzled tile.
__device__ __forceinline__ u32 swz(int r, int c) { return (u32)(r * WG_ROW + ((c ^ (r & 7)) << 4)); }

// Stored weight row R's first 16-byte chunk (its byte offset in the expert's matrix of
// `wrow_bytes`-byte rows), and the bytes between the row's consecutive chunks: AITER 16x16
// keeps a 16-row group's chunk column as 256 contiguous bytes.
#define WG_CHUNK_STRIDE (WLAYOUT == WL_AITER_16X16 ? 256 : 16)
__device__ __forceinline__ i64 wg_row_chunk0(int R, i64 wrow_bytes) {
#if WLAYOUT == WL_AITER_16X16
  return (i64)(R >> 4) * (wrow_bytes / 16) * 256 + (R & 15) * 16;
#else
  return (i64)R * wrow_bytes;
#endif
}

// Descriptor of a warpgroup's weight rows, K slice kk (16-bit: 16 values, fp8: 32), from their
// base in the stage (the stage's weight tile plus the warpgroup's first row x 128 bytes, which
// is also where its TMA box lands): 128-byte swizzled rows (cp.async) or the box's [chunk][row]
// core matrices (TMA).
__device__ __forceinline__ u64 wg_b_desc(u32 sb, int kk) {
#if WG_TMA
  return wgmma_desc_add(wgmma_desc_plain(sb, WG_N * 16), (u32)(2 * kk * WG_N * 16));
#else
  return wgmma_desc_add(wgmma_desc(sb), 32u * kk);
#endif
}

// Descriptor of a warpgroup's activation rows (128-byte swizzled, from sa), K slice kk.
__device__ __forceinline__ u64 wg_a_desc(u32 sa, int kk) {
  return wgmma_desc_add(wgmma_desc(sa), 32u * kk);
}

__device__ __forceinline__ void wg_mma(float* d, u64 da, u64 db, int acc) {
#if ACT_Q
#if WG_N == 128
  wgmma_e4m3_n128(d, da, db, acc);
#else
  wgmma_e4m3_n256(d, da, db, acc);
#endif
#elif ACT_F16
#if WG_N == 128
  wgmma_f16_n128(d, da, db, acc);
#else
  wgmma_f16_n256(d, da, db, acc);
#endif
#else
#if WG_N == 128
  wgmma_bf16_n128(d, da, db, acc);
#else
  wgmma_bf16_n256(d, da, db, acc);
#endif
#endif
}

// Warpgroup wg's first activation row and first weight row in the block: on 128-row tiles the
// warpgroups take 64 sorted rows each against the same weight rows; on 64-row tiles they share
// the sorted rows and take WG_N weight rows each.
__device__ __forceinline__ int wg_a_row0(int wg) { return BM == 128 ? 64 * wg : 0; }
__device__ __forceinline__ int wg_b_row0(int wg) { return BM == 128 || WG_KSPLIT ? 0 : WG_N * wg; }

// Whether a warpgroup has MMAs to issue, from the pair of its first row. A tile's real rows
// come first (route_block), so on 128-row tiles warpgroup 1's 64 rows are all padding when the
// tile holds at most 64: such a warpgroup skips its MMAs and keeps its place in the copies and
// barriers. That is an expert's last tile; at M = 1024 on gpt-oss (32 pairs per expert, MXFP4
// runs 128-row tiles only) it is every tile, half the tensor work.
__device__ __forceinline__ bool wg_has_rows(int first_pair) { return BM == 64 || first_pair >= 0; }

// Output columns of a block (stage 1: gate/up pairs).
#define WG_COLS1 (WG_B_ROWS / 2)
#define WG_COLS2 WG_B_ROWS

// Physical weight row of block row r (stage 1: each warpgroup's WG_N rows are WG_N / 2 gate
// rows, then the up rows of the same columns), and whether its column exists.
template <bool GATED>
__device__ __forceinline__ int wg_row(const Params& p, int n0, int r, bool& ok) {
  int half = WG_N / 2, rr = r % WG_N;
  int col = GATED ? n0 + (r / WG_N) * half + rr % half : n0 + r;
  ok = col < (GATED ? p.I : p.H);
  return GATED ? (rr < half ? gate_row(col, p.Ip) : up_row(col, p.Ip)) : col;
}

// FUSED_QUANT2 (spec::KernelSpec::fused_quant2): stage 1 writes stage 2's fp8 1x128 input
// (codes and scales) itself, instead of the intermediate that moe_quant2 would read back. On
// 64-row tiles with WG_N = 128 a block's 128 output columns (they start on multiples of 128)
// are one group of each of its 64 rows: warpgroup wg holds columns 64 wg .. 64 wg + 63 of
// every row, each row's 64 in the 4 threads of a quad. A group's amax is a max over the quad,
// then over the two warpgroups through shared memory.
#ifndef FUSED_QUANT2
#define FUSED_QUANT2 0
#endif
#if FUSED_QUANT2 && (ACT_Q != AD_FP8_BLOCK128 || !WG_KSCALE || BM != 64 || WG_N != 128 || WG_RS)
#error "FUSED_QUANT2: fp8 1x128 activations on 64-row tiles, WG_N 128 (heuristics.rs)"
#endif

// Named barrier 1: the 256 threads of the two MMA warpgroups, and with WG_DECODERS the
// decoding warpgroups (the warp-specialised kernel's producer never meets it).
__device__ __forceinline__ void wg_consumers_sync() {
#ifdef MP_HOST
  emu_consumers_barrier->arrive_and_wait();
#else
  asm volatile("bar.sync 1, %0;" ::"n"(WG_CONSUMER_THREADS) : "memory");
#endif
}

// Stage 1's epilogue with FUSED_QUANT2: the same bits as store_gated2 then quant_rows<2> (the
// intermediate value in its 16-bit type, the group's amax of those, each divided by the
// scale). Every thread of both warpgroups takes part, padding rows with zeros.
__device__ __forceinline__ void wg_epilogue_quant2(const Params& p, int e, int n0, int b_row0,
                                                   int tig, const int rows[2], const float* acc) {
  __shared__ float s_amax[2][64];  // [warpgroup][row]: the amax of its 64 columns
  const u8* S = (const u8*)p.w13_scale;
  int wg = b_row0 / WG_N, col_base = n0 + 64 * wg;
  int row = 16 * ((threadIdx.x >> 5) & 3) + ((threadIdx.x & 31) >> 2);  // + 8 h
  u32 v[2][WG_N / 16];  // the thread's two columns of each 8, in the intermediate's type
  float amax[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    int q = rows[h];
    float w = q >= 0 ? ((const float*)p.topk_weights)[q] : 0.0f;
    amax[h] = 0.0f;
#pragma unroll
    for (int j = 0; j < WG_N / 16; ++j) {
      int col0 = col_base + 8 * j + 2 * tig;
      v[h][j] = 0u;
      if (q < 0 || col0 >= p.I) continue;  // I is even: col0 + 1 < I too
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        int col = col0 + c;
        float g = acc[4 * j + 2 * h + c] * epi_w_scale(S, e, gate_row(col, p.Ip), 2 * p.Ip, p.Hp);
        float u = acc[4 * (j + WG_N / 16) + 2 * h + c] *
                  epi_w_scale(S, e, up_row(col, p.Ip), 2 * p.Ip, p.Hp);
        u16 o = gated_value(p, e, col, g, u, w);
        v[h][j] |= (u32)o << (16 * c);
        amax[h] = fmaxf(amax[h], fabsf(inter_to_f32(o)));
      }
    }
    amax[h] = fmaxf(amax[h], __shfl_xor_sync(0xffffffffu, amax[h], 1));
    amax[h] = fmaxf(amax[h], __shfl_xor_sync(0xffffffffu, amax[h], 2));
    if (tig == 0) s_amax[wg][row + 8 * h] = amax[h];
  }
  wg_consumers_sync();
#pragma unroll
  for (int h = 0; h < 2; ++h) amax[h] = fmaxf(amax[h], s_amax[wg ^ 1][row + 8 * h]);
  wg_consumers_sync();  // both read before the next work item's epilogue writes
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    int q = rows[h];
    if (q < 0) continue;
    float scale = group_scale(amax[h]);
    u8* codes = (u8*)p.aq + (i64)q * p.I;
#pragma unroll
    for (int j = 0; j < WG_N / 16; ++j) {
      int col0 = col_base + 8 * j + 2 * tig;
      if (col0 >= p.I) continue;
      u32 c0 = act_encode(inter_to_f32((u16)(v[h][j] & 0xffffu)) / scale);
      u32 c1 = act_encode(inter_to_f32((u16)(v[h][j] >> 16)) / scale);
      *(u16*)(codes + col0) = (u16)(c0 | c1 << 8);
    }
    if (wg == 0 && tig == 0) ((float*)p.as)[(i64)q * p.ng2 + n0 / 128] = scale;
  }
}

// Epilogue of a thread's accumulators: scales that do not vary along K, then the shared stage
// epilogues. rows[h]: the pair of accumulator row gid + 8 h of the thread's warp (-1: padding).
template <bool GATED>
__device__ __forceinline__ void wg_epilogue(const Params& p, int e, int n0, int b_row0, int tig,
                                            const int rows[2], const float* acc) {
#if FUSED_QUANT2
  if (GATED) {
    wg_epilogue_quant2(p, e, n0, b_row0, tig, rows, acc);
    return;
  }
#endif
  const u8* S = (const u8*)(GATED ? p.w13_scale : p.w2_scale);
  int Kst = GATED ? p.Hp : p.Ip;
  int Nst = GATED ? 2 * p.Ip : p.Hp;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    int q = rows[h];
    if (q < 0) continue;
    float w = ((const float*)p.topk_weights)[q];
    float sa = 1.0f;
#if ACT_Q && !WG_KSCALE
    sa = ((const float*)(GATED ? p.xs : p.as))[(i64)(GATED ? q / p.topk : q) *
                                                (GATED ? p.ng1 : p.ng2)];
#endif
    // A thread's two accumulators c = 0, 1 are adjacent columns, stored as one pair (I and H
    // are even here: heuristics::wgmma_unsupported).
    if (GATED) {
#pragma unroll
      for (int j = 0; j < WG_N / 16; ++j) {
        int col0 = n0 + (b_row0 / 2) + 8 * j + 2 * tig;
        if (col0 >= p.I) continue;
        float g[2], u[2];
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          int col = col0 + c;
          g[c] = acc[4 * j + 2 * h + c] * sa * epi_w_scale(S, e, gate_row(col, p.Ip), Nst, Kst);
          u[c] = acc[4 * (j + WG_N / 16) + 2 * h + c] * sa *
                 epi_w_scale(S, e, up_row(col, p.Ip), Nst, Kst);
        }
        store_gated2(p, e, q, col0, g[0], u[0], g[1], u[1], w);
      }
    } else {
#pragma unroll
      for (int j = 0; j < WG_N / 8; ++j) {
        int col0 = n0 + b_row0 + 8 * j + 2 * tig;
        if (col0 >= p.H) continue;
        float v[2];
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          int col = col0 + c;
          v[c] = acc[4 * j + 2 * h + c] * sa * epi_w_scale(S, e, col, Nst, Kst);
        }
        store_down2(p, e, q, col0, v[0], v[1], w);
      }
    }
  }
}

// fp8 partial sums (WG_FOLD) folded into the accumulators after each step; with block-128
// scales (WG_KSCALE) times the step's scales of the thread's two rows (activations) and of its
// two column halves (weights: one 128-row scale block each, columns start on multiples of 64).
template <bool GATED>
struct WgFold {
#if WG_KSCALE
  const float* xs;
  const u8* S;
  i64 srow0, srow1;
  int ng, e, Rh0, Rh1, Nst, Kst;
  bool okh0, okh1;
  float a0, a1, w0, w1;  // the scales of the step being folded
#endif
  // rows[h]: the pair of accumulator row gid + 8 h; b_row0: the warpgroup's first weight row.
  __device__ WgFold(const Params& p, int e_, int n0, int b_row0, const int rows[2]) {
#if WG_KSCALE
    xs = (const float*)(GATED ? p.xs : p.as);
    S = (const u8*)(GATED ? p.w13_scale : p.w2_scale);
    ng = GATED ? p.ng1 : p.ng2;
    e = e_;
    Nst = GATED ? 2 * p.Ip : p.Hp;
    Kst = GATED ? p.Hp : p.Ip;
    srow0 = rows[0] < 0 ? -1 : (GATED ? rows[0] / p.topk : rows[0]);
    srow1 = rows[1] < 0 ? -1 : (GATED ? rows[1] / p.topk : rows[1]);
    Rh0 = wg_row<GATED>(p, n0, b_row0, okh0);
    Rh1 = wg_row<GATED>(p, n0, b_row0 + WG_N / 2, okh1);
#endif
  }
  // Load step ks's scales (issued before the MMAs are waited for, to hide their latency).
  __device__ __forceinline__ void scales(int ks) {
#if WG_KSCALE
    int k = ks * WG_KSTEP;
    a0 = srow0 >= 0 ? xs[srow0 * ng + k / 128] : 0.0f;
    a1 = srow1 >= 0 ? xs[srow1 * ng + k / 128] : 0.0f;
    w0 = okh0 ? w_scale(S, e, Rh0, k, Nst, Kst) : 0.0f;
    w1 = okh1 ? w_scale(S, e, Rh1, k, Nst, Kst) : 0.0f;
#endif
  }
  __device__ __forceinline__ void fold(float* acc, const float* part) const {
#pragma unroll
    for (int i = 0; i < WG_ACC; ++i) {
#if WG_KSCALE
      float w = GATED && (i / 4) * 8 >= WG_N / 2 ? w1 : w0;  // up half of stage 1
      acc[i] = fmaf(part[i], ((i & 2) ? a1 : a0) * w, acc[i]);
#else
      acc[i] += part[i];
#endif
    }
  }
};

// Work item w (blocks start in its order) of `tiles` sorted tiles x `nblk` column blocks ->
// (tile, column block). WG_GROUP = 0: every tile of a column block, then the next column
// block, so the tiles' activation rows are read nblk times from HBM when they exceed the L2
// (Qwen3 at M = 4096: 134 MB per column block). WG_GROUP = g: every column block of g
// consecutive tiles, then the next g, so those re-reads hit the L2; an expert's tiles are
// consecutive either way, so its weight tile is read by them together.
__device__ __forceinline__ void wg_order(int w, int tiles, int nblk, int& tile, int& nb) {
#if WG_GROUP > 0
  int first = w / (WG_GROUP * nblk) * WG_GROUP;
  int size = min(WG_GROUP, tiles - first);
  int r = w - first * nblk;
  tile = first + r % size;
  nb = r / size;
#else
  (void)nblk;
  tile = w % tiles;
  nb = w / tiles;
#endif
}

// The activation row of sorted row q (stage 1: its token's row of x or xq; stage 2: the pair's
// intermediate row), or null for a padding row (q < 0).
template <bool GATED>
__device__ __forceinline__ const u8* wg_act_row(const Params& p, int q, int K) {
  if (q < 0) return nullptr;
#if ACT_Q
  i64 row = GATED ? q / p.topk : q;
  return (const u8*)(GATED ? p.xq : p.aq) + row * K;
#else
  return GATED ? (const u8*)p.x + (i64)(q / p.topk) * p.x_cols * 2
               : (const u8*)p.inter + (i64)q * p.I * 2;
#endif
}

#if WG_MX4
// Words c0 .. c0 + W - 1 of a 16-byte pack of 32 MXFP4 codes (weight row mr, codes
// 32 mc .. 32 mc + 31 of the step; word i holds codes 8 i .. 8 i + 7) with their e8m0 scale,
// as bf16 into chunks 4 mc + i of row mr of the 128-byte-swizzled weight tile at sb. In two
// copies, chosen by the warp-uniform "a scale above 2": predicated off, the second multiply
// still took an issue slot per code pair, and one multiplier is one IMAD. Chunk 4 mc + i lands
// at chunk 4 mc's address with i xored into bits 4-5 (the swizzle xors the chunk index, and
// the tile is 1024-aligned): one xor per store, where the compiler rebuilt each swizzled
// address in the step.
// The pack that thread q (of 256) decodes each step: weight row mr (rows (q & 15) of 16-row
// group q >> 5), codes 32 mc .. 32 mc + 31 of the step's 64.
__device__ __forceinline__ void mx_pack_of(int q, int& mr, int& mc) {
  mr = 16 * (q >> 5) + (q & 15);
  mc = (q >> 4) & 1;
}
template <int W>
__device__ __forceinline__ void mx_store_words(u32 sb, const u32 (&words)[W], u32 scale, int mr,
                                               int mc, int c0) {
  u32 at0 = sb + swz(mr, 4 * mc);
  auto store = [&](auto twice_case) {
    constexpr bool TWICE = decltype(twice_case)::value;
    u32 f1, f2 = 0u;
    if (TWICE)
      mx_factors(scale, f1, f2);
    else
      f1 = mx_factor_small(scale);
#pragma unroll
    for (int i = 0; i < W; ++i) {  // one word -> one 16-byte chunk
      u32 o[4], at = at0 ^ (u32)((c0 + i) << 4);
      mx_e2m1_word(words[i], f1, f2, TWICE, o);
#ifdef MP_HOST
      emu_st_shared_v4(at, o);
#else
      asm volatile("st.shared.v4.u32 [%0], {%1,%2,%3,%4};" ::"r"(at), "r"(o[0]), "r"(o[1]),
                   "r"(o[2]), "r"(o[3])
                   : "memory");
#endif
    }
  };
  if (__any_sync(0xffffffffu, scale > 128u))
    store(mp_bool<true>{});
  else
    store(mp_bool<false>{});
}

// Byte tig of each word of a 16-byte pack, as one word: codes 2 tig, 2 tig + 1 (+ 8, 16, 24)
// of its 32, the codes of lane (gid, tig)'s A fragments in the register-operand kernels.
__device__ __forceinline__ u32 wg_rs_codes(uint4 v, int tig) {
  u32 sel = (u32)tig | (u32)(tig + 4) << 4;
  return __byte_perm(__byte_perm(v.x, v.y, sel), __byte_perm(v.z, v.w, sel), 0x5410);
}

__device__ __forceinline__ u32 ld_shared_u8(u32 addr) {
#ifdef MP_HOST
  return *(const u8*)emu_shared_ptr(addr, 1);
#else
  u32 v;
  asm volatile("ld.shared.u8 %0, [%1];" : "=r"(v) : "r"(addr) : "memory");
  return v;
#endif
}
__device__ __forceinline__ void st_shared_u32(u32 addr, u32 v) {
#ifdef MP_HOST
  memcpy(emu_shared_ptr(addr, 4), &v, 4);
#else
  asm volatile("st.shared.u32 [%0], %1;" ::"r"(addr), "r"(v) : "memory");
#endif
}
__device__ __forceinline__ void st_shared_u16(u32 addr, u32 v) {
#ifdef MP_HOST
  u16 h = (u16)v;
  memcpy(emu_shared_ptr(addr, 2), &h, 2);
#else
  asm volatile("st.shared.u16 [%0], %1;" ::"r"(addr), "h"((u16)v) : "memory");
#endif
}
// W (1, 2 or 4) consecutive 32-bit words of shared memory, one load.
template <int W>
__device__ __forceinline__ void ld_shared_words(u32 addr, u32 (&v)[W]) {
  static_assert(W == 1 || W == 2 || W == 4, "a u32, v2 or v4 load");
#ifdef MP_HOST
  memcpy(v, emu_shared_ptr(addr, 4 * W), 4 * W);
#else
  if constexpr (W == 4)
    asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v[0]), "=r"(v[1]), "=r"(v[2]), "=r"(v[3])
                 : "r"(addr)
                 : "memory");
  else if constexpr (W == 2)
    asm volatile("ld.shared.v2.u32 {%0,%1}, [%2];" : "=r"(v[0]), "=r"(v[1]) : "r"(addr) : "memory");
  else
    asm volatile("ld.shared.u32 %0, [%1];" : "=r"(v[0]) : "r"(addr) : "memory");
#endif
}
#endif

// Thread t's share of a tile's activation rows when COPIERS threads copy them (the 256 of
// the kernels whose threads all copy, or the warp-specialised kernel's 128 producers): rows
// (t >> 3) + COPIERS / 8 * i, 16-byte chunk t & 7 of each K step, gathered through the tile's
// sorted rows and zero-filled for padding rows and columns past K.
// A step's copy is an add to a row pointer that stays in bounds without a select per copy
// (the SASS had ~12 instructions per copy with them): a column past K reads 0 bytes from its
// row's start, and a padding row 0 bytes from row 0 of the same matrix, marked by bit 0 of
// its pointer (rows are 16-byte aligned); a separate mask took a register that the 127-
// register kernels did not have, and the compiler recomputed the selects in the loop.
template <bool GATED, int COPIERS>
struct WgActCopies {
  static constexpr int ROWS = COPIERS / 8, N = BM / ROWS;  // rows per pass, copies per step
  const u8* src[N];
  __device__ WgActCopies(const Params& p, const int* tile_rows, int K, int t) {
#pragma unroll
    for (int i = 0; i < N; ++i) {
      const u8* row = wg_act_row<GATED>(p, tile_rows[(t >> 3) + ROWS * i], K);
      src[i] = row ? row : wg_act_row<GATED>(p, 0, K) + 1;
    }
  }
  // Step ks's copies into the tile at `sa` (128-byte rows, 128-byte swizzle).
  __device__ __forceinline__ void copy(u32 sa, int ks, int kbytes, int t) const {
    int c = t & 7, off = ks * WG_ROW + c * 16;
    bool past_k = off >= kbytes;
    off = past_k ? 0 : off;
#pragma unroll
    for (int i = 0; i < N; ++i) {
      u64 a = (u64)src[i] + (u32)off;
      cp_async16_or_zero(sa + swz((t >> 3) + ROWS * i, c), (const void*)(a & ~(u64)1),
                         past_k | ((u32)a & 1u));
    }
  }
};

template <bool GATED>
__device__ void moe_gemm_wg(const Params& p, const WgTmaMap* wmap) {
  extern __shared__ u8 wg_smem_raw[];
  __shared__ int s_row[BM];
  __shared__ __align__(8) u64 s_full[WG_STAGES];  // WG_TMA: weight tile of stage s landed
  int tile, nb;  // the grid: (upper bound of the tiles, column blocks)
  wg_order(blockIdx.y * gridDim.x + blockIdx.x, gridDim.x, gridDim.y, tile, nb);
  if (tile >= *(const int*)p.total_tiles) return;  // empty tile: exit before any load
  int e = ((const int*)p.tile_expert)[tile];
  int tid = threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
  int gid = lane >> 2, tig = lane & 3;
  int n0 = nb * (GATED ? WG_COLS1 : WG_COLS2);
  int a_row0 = wg_a_row0(wg), b_row0 = wg_b_row0(wg);
  if (tid < BM) s_row[tid] = ((const int*)p.sorted_rows)[tile * BM + tid];
  // The swizzle works on address bits: every tile starts 1024-aligned.
  u32 base = (smem_addr(wg_smem_raw) + 1023u) & ~1023u;

  int K = GATED ? p.H : p.I;
  int Kst = GATED ? p.Hp : p.Ip;
  int Nst = GATED ? 2 * p.Ip : p.Hp;
  i64 wrow_bytes = WG_MX4 ? (i64)Kst / 2 : (i64)Kst * WG_ESIZE;  // stored weight row
  const u8* W = (const u8*)(GATED ? p.w13 : p.w2) + (i64)e * Nst * wrow_bytes;
  const u8* S = (const u8*)(GATED ? p.w13_scale : p.w2_scale);
  i64 kbytes = (i64)K * WG_ESIZE;  // bytes of a row that are real columns
  int nk = (K + WG_KSTEP - 1) / WG_KSTEP;
#if WG_TMA
  int tma_group = wg_tma_group<GATED>(e, Nst, n0);
  u32 full0 = smem_addr(&s_full[0]);
  if (tid == 0) {
    for (int s = 0; s < WG_STAGES; ++s) mbar_init(full0 + 8 * s, 1);
#ifndef MP_HOST  // the emulator's mbarriers are visible once initialised
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
  }
#endif
  __syncthreads();

  // This thread's copies: activation rows (tid >> 3) + 32 i; weight rows br(i), chunk bc.
  WgActCopies<GATED, THREADS> acts(p, s_row, K, tid);
  // AITER 16x16: 16 rows of one 16-byte chunk column are 256 contiguous bytes; a thread takes
  // rows (tid & 15) of 16-row groups (tid >> 7) + 2 i, chunk (tid >> 4) & 7.
  const u8* bsrc[WG_B_CHUNKS];
  int bc = (tid >> 4) & 7;
#pragma unroll
  for (int i = 0; i < WG_B_CHUNKS; ++i) {
    int r = 16 * ((tid >> 7) + 2 * i) + (tid & 15);
    bool ok;
    int R = wg_row<GATED>(p, n0, r, ok);
    bsrc[i] = ok ? W + wg_row_chunk0(R, wrow_bytes) : nullptr;
  }

#if WG_MX4
  // This thread's weight pack of each step (mx_pack_of) and its e8m0 scale.
  int mr, mc;
  mx_pack_of(tid, mr, mc);
  bool mok;
  int mR = wg_row<GATED>(p, n0, mr, mok);
  const u8* msrc = W + wg_row_chunk0(mR, wrow_bytes);
#endif
#if WG_PACK_COPIES
  // By cp.async into the thread's part of a slot (WG_PACK_COPIES above; a pack past N or K is
  // zeros, its scale word too). The scale's word is the aligned 4 bytes that hold it (4-byte
  // copies need 4-byte sources): they lie in the same 16-byte line as the scale, inside the
  // allocation.
  const u8* mscales = S + (mok ? mx_scale_row_part(e, mR, Nst, Kst >> 5) : 0);
  auto mx_slot = [&](int ks) {
    return base + WG_STAGES * WG_STAGE_BYTES + (u32)(ks % WG_MX_SLOTS) * WG_MX_SLOT_BYTES;
  };
  auto mx_fetch = [&](int ks) {
    int kc = 2 * ks + mc;
    bool zero = !mok || kc * 32 >= K;
    u32 slot = mx_slot(ks);
    cp_async16_or_zero(slot + 16 * tid, msrc + (zero ? 0 : (i64)kc * WG_CHUNK_STRIDE), zero);
    u64 sc = (u64)(mscales + (zero ? 0 : mx_scale_col_part(kc)));
    cp_async4_or_zero(slot + 16 * THREADS + 4 * tid, (const void*)(sc & ~(u64)3), zero);
  };
  auto mx_store = [&](int ks) {
    int kc = 2 * ks + mc;
    u32 slot = mx_slot(ks), raw[4];
    ld_shared_words(slot + 16 * tid, raw);
    u32 word[1];  // zeros for a zero pack: a scale of 2^-127 times zeros
    ld_shared_words(slot + 16 * THREADS + 4 * tid, word);
    u32 at = (u32)((u64)(mscales + mx_scale_col_part(kc)) & 3u);
    mx_store_words(base + (u32)(ks % WG_STAGES) * WG_STAGE_BYTES + WG_A_BYTES, raw,
                   (word[0] >> (8 * at)) & 255u, mr, mc, 0);
  };
#elif WG_MX4
  // Loaded into registers a step ahead.
  u32 mraw[4] = {0u, 0u, 0u, 0u};
  u32 mscale = 0u;  // e8m0 (a zero pack decodes to zeros whatever the scale)
  auto mx_fetch = [&](int ks) {
    int kc = 2 * ks + mc;
    bool ok = mok && kc * 32 < K;
    uint4 v = ok ? *(const uint4*)(msrc + (i64)kc * WG_CHUNK_STRIDE) : make_uint4(0u, 0u, 0u, 0u);
    mraw[0] = v.x, mraw[1] = v.y, mraw[2] = v.z, mraw[3] = v.w;
    mscale = ok ? S[mx_scale_offset(e, mR, Nst, kc, Kst >> 5)] : 127u;
  };
  auto mx_store = [&](int ks) {
    mx_store_words(base + (u32)(ks % WG_STAGES) * WG_STAGE_BYTES + WG_A_BYTES, mraw, mscale, mr,
                   mc, 0);
  };
#endif

  auto load_step = [&](int ks) {
    u32 sa = base + (u32)(ks % WG_STAGES) * WG_STAGE_BYTES, sb = sa + WG_A_BYTES;
    acts.copy(sa, ks, (int)kbytes, tid);
#if WG_TMA
    if (tid == 0) tma_load_weights<GATED>(sb, wmap, tma_group, ks, full0 + 8 * (ks % WG_STAGES));
#else
#pragma unroll
    for (int i = 0; i < (WG_MX4 ? 0 : WG_B_CHUNKS); ++i) {
      int kc = ks * (WG_ROW / 16) + bc;
      bool ok = bsrc[i] && (i64)kc * 16 < kbytes;
      const u8* src = bsrc[i] + (i64)kc * WG_CHUNK_STRIDE;
      cp_async16(sb + swz(16 * ((tid >> 7) + 2 * i) + (tid & 15), bc), ok ? src : (const u8*)p.x,
                 ok ? 16 : 0);
    }
#endif
  };

  float acc[WG_ACC];
#pragma unroll
  for (int i = 0; i < WG_ACC; ++i) acc[i] = 0.0f;
#if WG_FOLD
  float part[WG_ACC];
#endif
#if WG_FOLD
  int fold_rows[2] = {s_row[a_row0 + 16 * warp + gid], s_row[a_row0 + 16 * warp + gid + 8]};
  WgFold<GATED> folder(p, e, n0, b_row0, fold_rows);
#endif

#if WG_PACK_COPIES
  // Step j commits two groups: the activations of step j + WG_STAGES - 2, then the pack of
  // step j + WG_MX_AHEAD. The steps before the first are played here, so that at every step
  // the groups pending after this step's copies and pack are the same: step ks - 1's two, or
  // with 3 stages (the activations one step ahead, after the pack of step ks) the pack alone.
#pragma unroll
  for (int j = -(WG_STAGES - 2 > WG_MX_AHEAD ? WG_STAGES - 2 : WG_MX_AHEAD); j < 0; ++j) {
    if (j + WG_STAGES - 2 >= 0 && j + WG_STAGES - 2 < nk) load_step(j + WG_STAGES - 2);
    cp_async_commit();
    if (j + WG_MX_AHEAD >= 0 && j + WG_MX_AHEAD < nk) mx_fetch(j + WG_MX_AHEAD);
    cp_async_commit();
  }
  constexpr int PENDING = WG_STAGES == 3 ? 1 : 2;
#else
#pragma unroll
  for (int s = 0; s < WG_STAGES - 2; ++s) {
    if (s < nk) load_step(s);
    cp_async_commit();
  }
  constexpr int PENDING = WG_STAGES - 3;
#if WG_MX4
  mx_fetch(0);
#endif
#endif
  u32 a_wg = (u32)(a_row0 * WG_ROW), b_wg = (u32)(b_row0 * WG_ROW);
  bool busy = wg_has_rows(s_row[a_row0]);
  for (int ks = 0; ks < nk; ++ks) {
    // Stage ks % WG_STAGES was last read by step ks - WG_STAGES, done before the last barrier.
#if WG_PACK_COPIES
    cp_async_wait<PENDING>();  // this thread's copies of step ks, and its pack, have landed
    mx_store(ks);
#else
#if WG_MX4
    mx_store(ks);  // the pack in registers: its decode runs while the copies land
#endif
    cp_async_wait<PENDING>();  // this thread's copies of step ks have landed
#endif
    fence_proxy_async();  // the copies and the decoded weights, for the async proxy
#if WG_TMA
    mbar_wait(full0 + 8 * (ks % WG_STAGES), (ks / WG_STAGES) & 1);  // the weight tile too
#endif
    __syncthreads();  // everyone's have; and every warpgroup is done with step ks - 2
#if WG_MX4 && !WG_PACK_COPIES
    // The next step's pack flies during this step's MMAs. Not before the fence: its
    // MEMBAR.ALL.CTA waits for the thread's loads in flight.
    if (ks + 1 < nk) mx_fetch(ks + 1);
#endif
    if (ks + WG_STAGES - 2 < nk) load_step(ks + WG_STAGES - 2);
    cp_async_commit();
#if WG_PACK_COPIES
    // Into the slot of step ks, whose pack this thread read above.
    if (ks + WG_MX_AHEAD < nk) mx_fetch(ks + WG_MX_AHEAD);
    cp_async_commit();
#endif
    if (!busy) continue;  // its part of the copies and the barrier done, nothing to multiply
    u32 sa = base + (u32)(ks % WG_STAGES) * WG_STAGE_BYTES + a_wg;
    u32 sb = base + (u32)(ks % WG_STAGES) * WG_STAGE_BYTES + WG_A_BYTES + b_wg;
    wgmma_fence();
#if WG_FOLD
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) wg_mma(part, wg_a_desc(sa, kk), wg_b_desc(sb, kk), kk > 0);
    wgmma_commit();
    folder.scales(ks);
    wgmma_wait<0>();
    folder.fold(acc, part);
#else
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) wg_mma(acc, wg_a_desc(sa, kk), wg_b_desc(sb, kk), 1);
    wgmma_commit();
    wgmma_wait<1>();
#endif
  }
  wgmma_wait<0>();
  cp_async_wait<0>();

  int rows[2] = {s_row[a_row0 + 16 * warp + gid], s_row[a_row0 + 16 * warp + gid + 8]};
  wg_epilogue<GATED>(p, e, n0, b_row0, tig, rows, acc);
}

#if WG_RS && !WG_WS
// MXFP4 weights as wgmma's register operand (WG_RS): the block's 128 weight rows go on the
// MMA's 64-row side (64 per warpgroup) and its 128 sorted rows on N, so the weights never pass
// through shared memory (the kernel above writes 16 KiB of decoded weights per step and reads
// them twice). An opt-in (MOEPLUG_WGMMA_RS=1): on the H200 it is 1-3.5 % slower than the
// shared-memory tile, whose steps are bound by instruction latency on 8 warps per SM, not by
// shared memory (bench/NOTES.md, session 12); it is the form an MMA-bound MXFP4 kernel wants.
// Each thread loads the 16-byte packs of its two weight rows straight from global
// memory two steps ahead (the quad of a row loads the same pack and keeps byte tig of each
// word: the codes of its A fragment), decodes them in registers (mx_bf16.cuh) and issues
// m64n128k16 with A from registers; only the activation tile is in the ring.
//
// WG_N is the MMA's N here, the tile's BM sorted rows (64 or 128); a block has 128 weight rows
// either way (WG_B_ROWS).
// A thread's rows (warp w, lane 4 gid + tig of warpgroup g): stage 1 rows gid and gid + 8 of
// the warp's 16 are the gate and up rows of column n0 + 32 g + 8 w + gid (the epilogue pairs
// them in-thread); stage 2 they are columns n0 + 64 g + 16 w + gid + 8 h.

// The 16-byte packs (32 codes) of one step for the thread's two rows, and their e8m0 scales.
struct WgRsPacks {
  uint4 raw[2][2];  // [row h][pack j]: columns 64 ks + 32 j ..
  u32 scale[2][2];
};


template <bool GATED>
__device__ void moe_gemm_wg_rs(const Params& p) {
  extern __shared__ u8 wg_smem_raw[];
  __shared__ int s_row[BM];
  int tile, nb;
  wg_order(blockIdx.y * gridDim.x + blockIdx.x, gridDim.x, gridDim.y, tile, nb);
  if (tile >= *(const int*)p.total_tiles) return;  // empty tile: exit before any load
  int e = ((const int*)p.tile_expert)[tile];
  int tid = threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
  int gid = lane >> 2, tig = lane & 3;
  int n0 = nb * (GATED ? WG_COLS1 : WG_COLS2);
  if (tid < BM) s_row[tid] = ((const int*)p.sorted_rows)[tile * BM + tid];
  u32 base = (smem_addr(wg_smem_raw) + 1023u) & ~1023u;  // the swizzle needs 1024-aligned tiles

  int K = GATED ? p.H : p.I;
  int Kst = GATED ? p.Hp : p.Ip;
  int Nst = GATED ? 2 * p.Ip : p.Hp;
  i64 wrow_bytes = (i64)Kst / 2;
  const u8* W = (const u8*)(GATED ? p.w13 : p.w2) + (i64)e * Nst * wrow_bytes;
  const u8* S = (const u8*)(GATED ? p.w13_scale : p.w2_scale);
  i64 kbytes = (i64)K * 2;
  int nk = (K + WG_KSTEP - 1) / WG_KSTEP;
  __syncthreads();
  WgActCopies<GATED, THREADS> acts(p, s_row, K, tid);

  // This thread's weight rows h = 0, 1 (physical rows of the expert) and their first packs.
  int col = GATED ? n0 + 32 * wg + 8 * warp + gid : n0 + 64 * wg + 16 * warp + gid;
  int wrow[2];
  bool wok[2];
  const u8* wsrc[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    int c = GATED ? col : col + 8 * h;
    wok[h] = c < (GATED ? p.I : p.H);
    wrow[h] = GATED ? (h == 0 ? gate_row(c, p.Ip) : up_row(c, p.Ip)) : c;
    wsrc[h] = W + wg_row_chunk0(wrow[h], wrow_bytes);
  }
  auto fetch = [&](int ks, WgRsPacks& m) {
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        int kc = 2 * ks + j;
        bool ok = wok[h] && kc * 32 < K;
        m.raw[h][j] =
            ok ? *(const uint4*)(wsrc[h] + (i64)kc * WG_CHUNK_STRIDE) : make_uint4(0u, 0u, 0u, 0u);
        m.scale[h][j] = ok ? S[mx_scale_offset(e, wrow[h], Nst, kc, Kst >> 5)] : 127u;
      }
  };
  // a[kk][r]: the A fragment of K slice kk (16 columns) of the step (mma_sm90.cuh).
  auto decode = [&](const WgRsPacks& m, u32 (&a)[4][4]) {
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        u32 f1, f2, o[4];
        mx_factors(m.scale[h][j], f1, f2);
        mx_e2m1_word(wg_rs_codes(m.raw[h][j], tig), f1, f2, m.scale[h][j] > 128u, o);
        a[2 * j][h] = o[0];  // columns 2 tig, 2 tig + 1 of slice 2 j
        a[2 * j][2 + h] = o[1];  // + 8
        a[2 * j + 1][h] = o[2];
        a[2 * j + 1][2 + h] = o[3];
      }
  };

  float acc[WG_ACC];
#pragma unroll
  for (int i = 0; i < WG_ACC; ++i) acc[i] = 0.0f;
#pragma unroll
  for (int s = 0; s < WG_STAGES - 2; ++s) {
    if (s < nk) acts.copy(base + (u32)s * WG_STAGE_BYTES, s, (int)kbytes, tid);
    cp_async_commit();
  }
  WgRsPacks packs[2];
  fetch(0, packs[0]);
  if (nk > 1) fetch(1, packs[1]);
  // One step: its fragments from the packs fetched two steps before, then (after the fence:
  // its MEMBAR.ALL.CTA waits for the thread's loads in flight) the packs of step ks + 2 into
  // the same registers, then the MMAs. Two register sets of fragments alternate, so a step's
  // decode never writes the registers of the MMAs still in flight (step ks - 1);
  // wgmma_wait<1> at the end retires step ks - 1 before step ks + 1 rewrites its set.
  auto step = [&](int ks, WgRsPacks& m, u32 (&a)[4][4]) {
    decode(m, a);
    cp_async_wait<WG_STAGES - 3>();  // this thread's activation copies of step ks have landed
    fence_proxy_async();
    __syncthreads();  // everyone's have; and both warpgroups are done with step ks - 2's stage
    if (ks + 2 < nk) fetch(ks + 2, m);
    if (ks + WG_STAGES - 2 < nk)
      acts.copy(base + (u32)((ks + WG_STAGES - 2) % WG_STAGES) * WG_STAGE_BYTES,
                ks + WG_STAGES - 2, (int)kbytes, tid);
    cp_async_commit();
    u32 sa = base + (u32)(ks % WG_STAGES) * WG_STAGE_BYTES;
    wgmma_fence();  // the fragments were just written
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) {
#if WG_N == 128
      wgmma_bf16_rs_n128(acc, a[kk], wg_a_desc(sa, kk), 1);
#else
      wgmma_bf16_rs_n64(acc, a[kk], wg_a_desc(sa, kk), 1);
#endif
    }
    wgmma_commit();
    wgmma_wait<1>();
  };
  u32 frag0[4][4], frag1[4][4];
  int ks = 0;
  for (; ks + 1 < nk; ks += 2) {
    step(ks, packs[0], frag0);
    step(ks + 1, packs[1], frag1);
  }
  if (ks < nk) step(ks, packs[0], frag0);
  wgmma_wait<0>();
  cp_async_wait<0>();

  // acc[4 j + c]: weight row 16 warp + gid + 8 (c >> 1) of the warpgroup's 64, sorted row
  // 8 j + 2 tig + (c & 1) of the tile.
#pragma unroll
  for (int j = 0; j < BM / 8; ++j)
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      int q = s_row[8 * j + 2 * tig + c];
      if (q < 0) continue;
      float w = ((const float*)p.topk_weights)[q];
      if (GATED) {
        if (wok[0]) store_gated(p, e, q, col, acc[4 * j + c], acc[4 * j + 2 + c], w);
      } else {
#pragma unroll
        for (int h = 0; h < 2; ++h)
          if (wok[h]) store_down(p, e, q, col + 8 * h, acc[4 * j + 2 * h + c], w);
      }
    }
}
#endif


#if WG_WS
// Warp-specialised and persistent (WG_WS): warpgroup 0 produces, warpgroups 1 and 2 multiply.
// One block per SM walks the work items w = blockIdx.x + i * gridDim.x in wg_order's order
// (an expert's tiles side by side: they read its weight block together). Per
// ring stage a `full` barrier completes when the producer's 128 cp.async arrivals (the
// activation rows) and the TMA bytes (the weight tile) are in, and an `empty` barrier when the
// 8 consumer warps are done reading it; the producer runs up to WG_STAGES steps ahead, across
// tiles, so the next tile's copies fly during this tile's epilogue.
// MXFP4 (WG_MX4_WS): the producer copies the packed codes with cp.async instead of a TMA
// box; each consumer thread decodes one pack of the step into the bf16 tile (it % 3) that both
// warpgroups then multiply from (a named barrier between): the decode's bit operations run on
// the 8 consumer warps while the copies and their addresses run on the producer's.
#if WG_TMA == WG_MX4
#error "the warp-specialised kernel takes TMA weight tiles, or MXFP4 packs by cp.async"
#endif
#if WG_MX4_WS && BM != 128
#error "MXFP4 on the warp-specialised kernel: 128-row tiles (the warpgroups share the weights)"
#endif
#if WG_N == 256 && WG_FOLD
#error "128 x 256 blocks: 16-bit operands (fp8 partial sums need a second accumulator)"
#endif
#define WG_WS_THREADS (384 + 128 * WG_DECODERS)
// 128 x 256 blocks: each consumer thread holds 128 accumulators, more than the 168 registers
// per thread that 384 threads get. The producer (addresses and copies) gives registers back
// and the consumers take them (setmaxnreg), within what the launch allocated to the block:
// 128 x 40 + 256 x 232 = 384 x 168. With WG_DECODERS the 640 threads get 96 each; the producer
// and the decoders give back, the MMA warpgroups (their 64 accumulators, their share of the
// decode, the epilogue) take the rest: 128 x 48 + 256 x 64 + 256 x 152 = 640 x 96.
#define WG_WS_SETMAXNREG (WG_N == 256 || WG_DECODERS)
#define WG_WS_PRODUCER_REGS (WG_DECODERS ? 48 : 40)
#define WG_WS_CONSUMER_REGS (WG_DECODERS ? 152 : 232)
#define WG_WS_DECODER_REGS 64
static_assert(!WG_WS_SETMAXNREG ||
                  128 * WG_WS_PRODUCER_REGS + 128 * WG_DECODERS * WG_WS_DECODER_REGS +
                          256 * WG_WS_CONSUMER_REGS <=
                      WG_WS_THREADS * ((65536 / WG_WS_THREADS) & ~7),
              "setmaxnreg: more registers than the launch allocates to the block");
template <int REGS>
__device__ __forceinline__ void wg_regs_dec() {
#if !defined(MP_HOST) && WG_WS_SETMAXNREG
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(REGS));
#endif
}
template <int REGS>
__device__ __forceinline__ void wg_regs_inc() {
#if !defined(MP_HOST) && WG_WS_SETMAXNREG
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(REGS));
#endif
}
// The 128 producer threads' cp.async, plus the TMA's expect_tx; MXFP4 (no TMA): plus the 128
// producer threads' arrivals after storing the step's scales.
#define WG_FULL_ARRIVALS (WG_MX4 ? 256 : 129)
// One per consumer warp that reads a stage (WG_KSPLIT: one warpgroup's steps).
#define WG_EMPTY_ARRIVALS (WG_KSPLIT ? 4 : 8)

__device__ __forceinline__ void cp_async_arrive(u32 bar) {
#ifdef MP_HOST
  emu_cp_async_arrive(bar);
#else
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(bar) : "memory");
#endif
}
__device__ __forceinline__ void mbar_arrive(u32 bar) {
#ifdef MP_HOST
  emu_mbar_arrive(bar);
#else
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
#endif
}

// The warp-specialised kernels' ring barriers (thread 0 initialises them), then the block's
// barrier that makes them visible.
__device__ __forceinline__ void wg_ring_init(int tid, u32 full0, u32 empty0) {
  if (tid == 0) {
    for (int s = 0; s < WG_STAGES; ++s) {
      mbar_init(full0 + 8 * s, WG_FULL_ARRIVALS);
      mbar_init(empty0 + 8 * s, WG_EMPTY_ARRIVALS);
    }
#ifndef MP_HOST  // the emulator's mbarriers are visible once initialised
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
  }
  __syncthreads();
}

// Column blocks of a stage (a work item is a sorted tile and one of them).
template <bool GATED>
__device__ __forceinline__ int wg_column_blocks(const Params& p) {
  int cols = GATED ? WG_COLS1 : WG_COLS2;
  return ((GATED ? p.I : p.H) + cols - 1) / cols;
}

// Work item w: its tile and first output column.
template <bool GATED>
__device__ __forceinline__ void wg_work(int w, int tiles, int nblk, int& tile, int& n0) {
  int nb;
  wg_order(w, tiles, nblk, tile, nb);
  n0 = nb * (GATED ? WG_COLS1 : WG_COLS2);
}

#if WG_SWAP
#include "moe_gemm_wgmma_swap.cuh"
#else
#if WG_MX4
// The producer thread t's share of a step's packed codes and scales (WG_MX4_WS): weight row
// t's two 16-byte packs (64 codes) by cp.async into the stage's pack area as [pack j][row],
// zeros for a row past N or codes past K; and the row's two e8m0 scales of the step, stored
// as 2 bytes at [row] of the stage's scale area (127, a scale of 1, where the codes are
// zeros). The scales are loaded WG_SCALE_AHEAD steps before they are stored: the producer's
// stores wait for them, and a load in a consumer would be waited for by the fence of its
// decode (MEMBAR.ALL.CTA waits for the thread's loads in flight).
#define WG_SCALE_AHEAD 3
template <bool GATED>
struct WgPackCopies {
  const u8* src;   // row t's first pack (the expert's first byte for a row past N)
  const u8* srow;  // row t's scales (the row part of their offsets)
  int K;
  bool row_ok;
  u32 ahead[WG_SCALE_AHEAD][2];  // the scales of the next WG_SCALE_AHEAD steps, in flight
  __device__ WgPackCopies(const Params& p, int e, int n0, int K_, int t) : K(K_) {
    int Kst = GATED ? p.Hp : p.Ip, Nst = GATED ? 2 * p.Ip : p.Hp;
    i64 wrow_bytes = (i64)Kst / 2;
    const u8* W = (const u8*)(GATED ? p.w13 : p.w2) + (i64)e * Nst * wrow_bytes;
    int R = wg_row<GATED>(p, n0, t, row_ok);
    src = W + (row_ok ? wg_row_chunk0(R, wrow_bytes) : 0);
    srow = (const u8*)(GATED ? p.w13_scale : p.w2_scale) +
           (row_ok ? mx_scale_row_part(e, R, Nst, Kst >> 5) : 0);
#pragma unroll
    for (int i = 0; i < WG_SCALE_AHEAD; ++i) load_scales(i, ahead[i]);
  }
  __device__ __forceinline__ void load_scales(int ks, u32 (&sc)[2]) const {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      int kc = 2 * ks + j;
      sc[j] = row_ok && kc * 32 < K ? (u32)srow[mx_scale_col_part(kc)] : 127u;
    }
  }
  __device__ __forceinline__ void copy(u32 sp, u32 ss, int ks, int t) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      int kc = 2 * ks + j;
      bool zero = !row_ok || kc * 32 >= K;
      cp_async16_or_zero(sp + (u32)(j * WG_B_ROWS * 16 + t * 16),
                         src + (zero ? 0 : (i64)kc * WG_CHUNK_STRIDE), zero);
    }
    st_shared_u16(ss + 2 * t, ahead[0][0] | ahead[0][1] << 8);
#pragma unroll
    for (int i = 0; i + 1 < WG_SCALE_AHEAD; ++i) {
      ahead[i][0] = ahead[i + 1][0];
      ahead[i][1] = ahead[i + 1][1];
    }
    load_scales(ks + WG_SCALE_AHEAD, ahead[WG_SCALE_AHEAD - 1]);
  }
};

// Ring step it's decoded weight tile (WG_MX4_WS), one of WG_DEC_TILES after the ring.
__device__ __forceinline__ u32 wg_dec_tile(u32 base, u32 it) {
  return base + WG_STAGES * WG_STAGE_BYTES + (it % WG_DEC_TILES) * WG_B_BYTES;
}

// Consumer thread d's share of a step's decode (WG_MX4_WS): words c0 .. c0 + WG_DEC_WORDS - 1
// (c0 = (d / 256) WG_DEC_WORDS) of pack mx_pack_of(d % 256) (the tile kernel's assignment),
// with its scale, both from the ring stage.
struct WgPackDecoder {
  int mr, mc, c0;
  __device__ explicit WgPackDecoder(int d) {
    mx_pack_of(d & 255, mr, mc);
    c0 = (d >> 8) * WG_DEC_WORDS;
  }
  // The packs and scales of the ring stage at sp into the step's tile at sdec, which every
  // consumer may read after this (the fence makes it visible to wgmma's async proxy, the
  // barrier to the other threads). sdec (tile it % 3) was last read by step it - 3's MMAs,
  // which every MMA thread retired (wgmma_wait<1> in step it - 2) before the barrier of step
  // it - 1.
  __device__ __forceinline__ void decode(u32 sdec, u32 sp) const {
    u32 scale = ld_shared_u8(sp + WG_PACK_BYTES + (u32)(2 * mr + mc));
    u32 words[WG_DEC_WORDS];
    ld_shared_words(sp + (u32)(mc * WG_B_ROWS * 16 + mr * 16 + 4 * c0), words);
    mx_store_words(sdec, words, scale, mr, mc, c0);
    fence_proxy_async();
    wg_consumers_sync();
  }
};
#endif

// Calls pdl_enter; with PDL_EARLY (pdl_early) after starting the first weight copies.
template <bool GATED>
__device__ void moe_gemm_wg_ws(const Params& p, const WgTmaMap* wmap) {
  constexpr bool EARLY = pdl_early(GATED);
  if (!EARLY) pdl_enter();
  extern __shared__ u8 wg_smem_raw[];
  __shared__ __align__(8) u64 s_full[WG_STAGES], s_empty[WG_STAGES];
  int tid = threadIdx.x;
  int tiles = *(const int*)p.total_tiles, nblk = wg_column_blocks<GATED>(p);
  int work = tiles * nblk;
  if ((int)blockIdx.x >= work) {  // every thread of the block, before any barrier
    if (EARLY) pdl_enter();
    return;
  }
  u32 base = (smem_addr(wg_smem_raw) + 1023u) & ~1023u;
  u32 full0 = smem_addr(&s_full[0]), empty0 = smem_addr(&s_empty[0]);
  wg_ring_init(tid, full0, empty0);  // the last block-wide barrier: the roles never meet again
  int K = GATED ? p.H : p.I;
  int Nst = GATED ? 2 * p.Ip : p.Hp;
  i64 kbytes = (i64)K * WG_ESIZE;
  int nk = (K + WG_KSTEP - 1) / WG_KSTEP;
  // WG_KSPLIT: ring steps per item rounded up to even (an odd K's last step is a phantom the
  // producer completes without copies), so that with an even ring every stage has one owner,
  // warpgroup (stage & 1), and each warpgroup waits on its stages' phases in order. (A
  // warpgroup taking every other step of an odd ring would wait on a stage two phases ahead of
  // where the barrier is, and its parity would pass on the older phase.)
  int nk_ring = WG_KSPLIT ? (nk + 1) & ~1 : nk;
  const int* sorted = (const int*)p.sorted_rows;
  const int* tile_expert = (const int*)p.tile_expert;
  // PDL_EARLY: the weight tiles of the first work item's first ring stages (free on the first
  // pass) are in flight while the previous kernel finishes; the activations wait for it.
  u32 early = 0;  // ring steps whose weight copy has started
  if (EARLY && WG_TMA && tid == 0) {
    int tile, n0;
    wg_work<GATED>(blockIdx.x, tiles, nblk, tile, n0);
    int group = wg_tma_group<GATED>(tile_expert[tile], Nst, n0);
    early = nk < WG_STAGES ? nk : WG_STAGES;
    for (u32 ks = 0; ks < early; ++ks)
      tma_load_weights<GATED>(base + ks * WG_STAGE_BYTES + WG_A_BYTES, wmap, group, ks,
                              full0 + 8 * ks);
  }
  if (EARLY) pdl_enter();

  if (tid < 128) {
    // Producer: thread t copies chunk t & 7 of activation rows (t >> 3) + 16 i; thread 0
    // also starts the weight tile's TMA.
    wg_regs_dec<WG_WS_PRODUCER_REGS>();
    u32 it = 0;  // ring steps produced
    for (int w = blockIdx.x; w < work; w += gridDim.x) {
      int tile, n0;
      wg_work<GATED>(w, tiles, nblk, tile, n0);
      int e = tile_expert[tile];
      WgActCopies<GATED, 128> acts(p, sorted + tile * BM, K, tid);
#if WG_MX4
      WgPackCopies<GATED> packs(p, e, n0, K, tid);
#else
      int group = wg_tma_group<GATED>(e, Nst, n0);
#endif
      for (int ks = 0; ks < nk_ring; ++ks, ++it) {
        int st = it % WG_STAGES;
        mbar_wait(empty0 + 8 * st, ((it / WG_STAGES) & 1) ^ 1);  // first pass: free
        u32 sa = base + (u32)st * WG_STAGE_BYTES, bar = full0 + 8 * st;
        if (ks >= nk) {  // WG_KSPLIT's phantom step: the 129 arrivals, no copies
          if (tid == 0) mbar_arrive(bar);
          cp_async_arrive(bar);
          continue;
        }
#if WG_MX4
        packs.copy(sa + WG_A_BYTES, sa + WG_A_BYTES + WG_PACK_BYTES, ks, tid);
#else
        if (tid == 0 && it >= early)  // the first `early` steps' copies started before the wait
          tma_load_weights<GATED>(sa + WG_A_BYTES, wmap, group, ks, bar);
#endif
        acts.copy(sa, ks, (int)kbytes, tid);
        cp_async_arrive(bar);
        if (WG_MX4) mbar_arrive(bar);  // after the scales' stores (a release)
      }
    }
    cp_async_wait<0>();
    return;
  }
#if WG_DECODERS
  if (tid >= 384) {
    // Decoders: their share of each step's packs, in step with the MMA warpgroups (the
    // barrier in decode); the MMA warpgroups alone release the ring's stages, after the
    // barrier that follows every decoder's reads of them.
    wg_regs_dec<WG_WS_DECODER_REGS>();
    const WgPackDecoder dec(tid - 128);
    u32 it = 0;  // ring steps decoded
    for (int w = blockIdx.x; w < work; w += gridDim.x) {
      for (int ks = 0; ks < nk; ++ks, ++it) {
        int st = it % WG_STAGES;
        mbar_wait(full0 + 8 * st, (it / WG_STAGES) & 1);
        dec.decode(wg_dec_tile(base, it), base + (u32)st * WG_STAGE_BYTES + WG_A_BYTES);
      }
    }
    return;
  }
#endif

  // Consumers: warpgroup wg multiplies its rows of the tile by its weight rows (wg_a_row0,
  // wg_b_row0).
  wg_regs_inc<WG_WS_CONSUMER_REGS>();
  int ctid = tid - 128, wg = ctid >> 7, warp = (ctid >> 5) & 3, lane = ctid & 31;
  int gid = lane >> 2, tig = lane & 3;
  int a_row0 = wg_a_row0(wg), b_row0 = wg_b_row0(wg);
#if WG_MX4
  const WgPackDecoder dec(ctid);
#endif
  u32 it = 0;  // ring steps consumed
  for (int w = blockIdx.x; w < work; w += gridDim.x) {
    int tile, n0;
    wg_work<GATED>(w, tiles, nblk, tile, n0);
    int e = tile_expert[tile];
    int r0 = tile * BM + a_row0 + 16 * warp + gid;
    int rows[2] = {sorted[r0], sorted[r0 + 8]};
    bool busy = wg_has_rows(sorted[tile * BM + a_row0]);
    float acc[WG_ACC];
#pragma unroll
    for (int i = 0; i < WG_ACC; ++i) acc[i] = 0.0f;
#if WG_FOLD
    float part[WG_ACC];
#endif
#if WG_FOLD
    WgFold<GATED> folder(p, e, n0, b_row0, rows);
#endif
#if !WG_FOLD
    int prev = -1;  // ring step of this warpgroup's previous MMAs in this item (released after
                    // the next's wait), -1 before its first
#endif
    for (int ks = 0; ks < nk_ring; ++ks, ++it) {
      if (WG_KSPLIT && (ks & 1) != wg) continue;  // the other warpgroup's step
      int st = it % WG_STAGES;
      mbar_wait(full0 + 8 * st, (it / WG_STAGES) & 1);
#if WG_MX4
      u32 sdec = wg_dec_tile(base, it);
      dec.decode(sdec, base + (u32)st * WG_STAGE_BYTES + WG_A_BYTES);
#endif
      // Release the stage at once (an idle warpgroup, or WG_KSPLIT's phantom step past K): it
      // stays in step with the ring's phases.
      if (!busy || ks >= nk) {
        // Every lane has seen the phase complete before lane 0 lets the producer refill the
        // stage: a lane still waiting when the barrier completes its next phase too would
        // wait for ever (the busy path converges in its MMAs; diverged lanes, as the host
        // emulator's threads are, hung CI on this).
        __syncwarp();
        if (lane == 0) mbar_arrive(empty0 + 8 * st);
        continue;
      }
      // The producer's cp.async wrote the activations through the generic proxy; the barrier
      // made them visible to this thread, the fence to its wgmma (the async proxy). (MXFP4's
      // fence after the decode did both.)
      if (!WG_MX4) fence_proxy_async();
      u32 sa = base + (u32)st * WG_STAGE_BYTES + (u32)(a_row0 * WG_ROW);
#if WG_MX4
      u32 sb = sdec + (u32)(b_row0 * WG_ROW);
#else
      u32 sb = base + (u32)st * WG_STAGE_BYTES + WG_A_BYTES + (u32)(b_row0 * WG_ROW);
#endif
      wgmma_fence();
#if WG_FOLD
#pragma unroll
      for (int kk = 0; kk < 4; ++kk)
        wg_mma(part, wg_a_desc(sa, kk), wg_b_desc(sb, kk), kk > 0);
      wgmma_commit();
      folder.scales(ks);
      wgmma_wait<0>();
      if (lane == 0) mbar_arrive(empty0 + 8 * st);  // this warp is done with the stage
      folder.fold(acc, part);
#else
#pragma unroll
      for (int kk = 0; kk < 4; ++kk) wg_mma(acc, wg_a_desc(sa, kk), wg_b_desc(sb, kk), 1);
      wgmma_commit();
      wgmma_wait<1>();  // the previous step's MMAs are done: release its stage
      if (prev >= 0 && lane == 0) mbar_arrive(empty0 + 8 * (prev % WG_STAGES));
      prev = (int)it;
#endif
    }
#if !WG_FOLD
    wgmma_wait<0>();
    if (prev >= 0 && lane == 0) mbar_arrive(empty0 + 8 * (prev % WG_STAGES));
#endif
#if WG_KSPLIT
    // Warpgroup 1's sums join warpgroup 0's in a fixed order (deterministic); the second
    // barrier keeps warpgroup 1 from the buffer until warpgroup 0 has read it.
    __shared__ float s_ksum[WG_ACC][128];  // [accumulator][consumer thread]
    if (wg == 1) {
#pragma unroll
      for (int i = 0; i < WG_ACC; ++i) s_ksum[i][ctid & 127] = acc[i];
    }
    wg_consumers_sync();
    if (wg == 0) {
#pragma unroll
      for (int i = 0; i < WG_ACC; ++i) acc[i] += s_ksum[i][ctid];
    }
    wg_consumers_sync();
    if (wg == 1) continue;
#endif
    wg_epilogue<GATED>(p, e, n0, b_row0, tig, rows, acc);
  }
}

#if WG_TMA
// The second parameter: the tensor map of this stage's weights (w13 / w2).
MP_KERNEL void __launch_bounds__(WG_WS_THREADS, 1)
    moe_stage1(Params p, const __grid_constant__ WgTmaMap wmap) {
  moe_gemm_wg_ws<true>(p, &wmap);
}
MP_KERNEL void __launch_bounds__(WG_WS_THREADS, 1)
    moe_stage2(Params p, const __grid_constant__ WgTmaMap wmap) {
  moe_gemm_wg_ws<false>(p, &wmap);
}
#else  // MXFP4: no tensor map
MP_KERNEL void __launch_bounds__(WG_WS_THREADS, 1) moe_stage1(Params p) {
  moe_gemm_wg_ws<true>(p, nullptr);
}
MP_KERNEL void __launch_bounds__(WG_WS_THREADS, 1) moe_stage2(Params p) {
  moe_gemm_wg_ws<false>(p, nullptr);
}
#endif
#endif  // WG_SWAP
#elif WG_TMA
// The second parameter: the tensor map of this stage's weights (w13 / w2).
MP_KERNEL void __launch_bounds__(THREADS, WG_MIN_BLOCKS)
    moe_stage1(Params p, const __grid_constant__ WgTmaMap wmap) {
  pdl_enter();
  moe_gemm_wg<true>(p, &wmap);
}
MP_KERNEL void __launch_bounds__(THREADS, WG_MIN_BLOCKS)
    moe_stage2(Params p, const __grid_constant__ WgTmaMap wmap) {
  pdl_enter();
  moe_gemm_wg<false>(p, &wmap);
}
#elif WG_RS
MP_KERNEL void __launch_bounds__(THREADS, WG_MIN_BLOCKS) moe_stage1(Params p) {
  pdl_enter();
  moe_gemm_wg_rs<true>(p);
}
MP_KERNEL void __launch_bounds__(THREADS, WG_MIN_BLOCKS) moe_stage2(Params p) {
  pdl_enter();
  moe_gemm_wg_rs<false>(p);
}
#else
MP_KERNEL void __launch_bounds__(THREADS, WG_MIN_BLOCKS) moe_stage1(Params p) {
  pdl_enter();
  moe_gemm_wg<true>(p, nullptr);
}
MP_KERNEL void __launch_bounds__(THREADS, WG_MIN_BLOCKS) moe_stage2(Params p) {
  pdl_enter();
  moe_gemm_wg<false>(p, nullptr);
}
#endif
