// MXFP4 swap-AB on the warp-specialised kernel (WG_SWAP = WG_RS && WG_WS; included by
// moe_gemm_wgmma.cuh, whose helpers it uses): the weights are wgmma's register operand A on
// the MMA's 64-row side, the tile's BM (64 or 128) sorted rows its N, and a K step is 128
// codes.
//
// Why (bench/NOTES.md, session 23): the MXFP4 tile kernel spends ~7.1 thread instructions per
// decoded code, the peer (triton_kernels) ~4, because each of our steps decodes 32 codes per
// thread and pays a step's fixed costs (copies, descriptors, barrier, stage arithmetic) for
// them, then writes the decoded tile to shared memory for both warpgroups to read back. Here a
// thread decodes 128 codes per step straight into its MMAs' A fragments, and the producer
// warpgroup alone issues the copies.
//
// A block: 256 weight rows, two consumer warpgroups of 128 (two m64 each), BM sorted rows.
// Stage 1: consumer warpgroup g's m64 0 is the gate rows and m64 1 the up rows of the 64
// output columns n0 + 64 g .. (so the SwiGLU pairs meet in-thread, accumulator i of each);
// stage 2: its m64 m is output columns n0 + 128 g + 64 m ...
// Block row b (0..255; the producer's copies and the pack area's order) is 128 g + 64 m + r for
// MMA row r of m64 m of warpgroup g, r = 16 w + gid + 8 h for warp w's lane (gid, tig).
//
// A ring stage: the activation tile as two 64-K halves (BM rows x 128 bytes, 128-byte
// swizzle, the B operand), the step's packs (wgs_pack_at: a warp's 8 rows of one chunk are 128
// contiguous bytes, its LDS.128 one wavefront; each quad's lanes read the same pack and keep
// byte tig of each word, two words per PRMT: mx_e2m1_bytes2), then a 32-bit word per block row
// whose byte j is chunk j's e8m0 scale (the producer loads them WGS_SCALE_AHEAD steps early,
// byte by byte in any scale layout, and stores the word).
// Per consumer step: 4 LDS.32 (scales), then per 32-code group 4 LDS.128, 4 words decoded
// into 16 fragment registers, 4 wgmma (2 m64 x 2 k16); two fragment sets alternate, a group's
// MMAs in flight while the next group decodes (wgmma_wait<1> before a set is rewritten). A
// tile whose second half is padding runs MMAs half as wide (n32 / n64).
// Measured (bench/NOTES.md sessions 24-25): 0.77x the tile kernel's time at gpt-oss M = 1024
// on 64-row tiles. Its step (~2700 cycles on 64 rows) is more than decode (~1500 issue
// cycles) or MMA (1024) alone: with either ablated the launch takes 0.70-0.76x at M = 1024,
// 0.64-0.80x at 4096. The integer pipe is the busiest (53 % of cycles at M = 1024, tensor
// 37 %), so the decode is written for fewest integer-pipe instructions.
#pragma once
#if !WG_MX4 || WG_N != BM || WG_TMA || WG_DECODERS || WG_KSPLIT || FUSED_QUANT2
#error "WG_SWAP: MXFP4, N the tile's rows, no TMA / decoders / K split / fused quantization"
#endif
#define WGS_ACC (BM / 2)  // accumulators per thread and m64
// The consumers hold 2 x BM / 2 accumulators, two fragment sets and two groups' packs: on
// 128-row tiles more than the 168 registers per thread that 384 threads get, on 64-row tiles
// just more in some configurations (8 bytes spilled with RWOI). The producer gives registers
// back and the consumers take them (setmaxnreg), within the block's 384 x 168: 128 x 72 +
// 256 x 216.
#define WGS_SETMAXNREG 1
#define WGS_PRODUCER_REGS 72
#define WGS_CONSUMER_REGS 216
static_assert(128 * WGS_PRODUCER_REGS + 256 * WGS_CONSUMER_REGS <= 384 * 168, "setmaxnreg");
#define WGS_ROWS 256                 // weight rows of a block
#define WGS_A_HALF (BM * WG_ROW)     // one 64-K half of the activation tile
#define WGS_PACKS (WGS_ROWS * 64)    // a step's packed codes: 4 chunks per row
#define WGS_SCALES (WGS_ROWS * 4)    // a step's scales: one word per row
#define WGS_KSTEP 128                // K values per step
#define WGS_SCALE_AHEAD 2
static_assert(WG_STAGE_BYTES == 2 * WGS_A_HALF + WGS_PACKS + WGS_SCALES, "stage layout");
static_assert(WG_B_ROWS == WGS_ROWS, "block rows");

// Byte offset of block row b's chunk j in a stage's pack area: [16-row group][chunk][row], so
// that a 16-row group's step is one 1 KiB run (as in AITER's 16 x 16 layout: WG_BULK_PACKS
// copies it whole) and a warp's 8 rows of one chunk are 128 contiguous bytes.
__device__ __forceinline__ u32 wgs_pack_at(int b, int j) {
  return (u32)((b >> 4) * 1024 + j * 256 + (b & 15) * 16);
}

// Output column (and whether it exists) and physical weight row of block row b.
template <bool GATED>
__device__ __forceinline__ int wgs_row(const Params& p, int n0, int b, bool& ok) {
  if (GATED) {
    int col = n0 + 64 * (b >> 7) + (b & 63);
    ok = col < p.I;
    return (b >> 6) & 1 ? up_row(col, p.Ip) : gate_row(col, p.Ip);
  }
  int col = n0 + b;
  ok = col < p.H;
  return col;
}

// Producer thread t's share of a step's packs and scales: block rows t and t + 128, their
// four 16-byte packs (codes 128 ks .. 128 ks + 127) by cp.async, zeros for a row past N or
// codes past K, and their scale words (127, a scale of 1, where the codes are zeros).
// WG_BULK_PACKS (AITER 16 x 16 weights): thread t < 16 instead copies 16-row group t's step,
// one run of up to 1 KiB, by a bulk copy that completes on the stage's barrier; a group past
// N is not copied (its rows' outputs are never stored), nor are chunks past the row's end
// (their codes meet zero activations and scales of 1).
template <bool GATED>
struct WgsPackCopies {
  const u8* src[2];   // the row's first pack (the expert's first byte for a row past N)
  const u8* srow[2];  // the row's scales (the row part of their offsets)
  bool ok[2];
  int K;
  u32 ahead[WGS_SCALE_AHEAD][2][4];  // the scale bytes of the next steps, in flight
#if WG_BULK_PACKS
  const u8* group;  // thread t < 16: group t's first chunk, null past N
  int chunks;       // the chunks of a row (its stored K / 32)
#endif
  __device__ WgsPackCopies(const Params& p, int e, int n0, int K_, int t) : K(K_) {
    int Kst = GATED ? p.Hp : p.Ip, Nst = GATED ? 2 * p.Ip : p.Hp;
    i64 wrow_bytes = (i64)Kst / 2;
    const u8* W = (const u8*)(GATED ? p.w13 : p.w2) + (i64)e * Nst * wrow_bytes;
    const u8* S = (const u8*)(GATED ? p.w13_scale : p.w2_scale);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      int R = wgs_row<GATED>(p, n0, t + 128 * h, ok[h]);
      src[h] = W + (ok[h] ? wg_row_chunk0(R, wrow_bytes) : 0);
      srow[h] = S + (ok[h] ? mx_scale_row_part(e, R, Nst, Kst >> 5) : 0);
    }
#if WG_BULK_PACKS
    bool gok;
    int R0 = wgs_row<GATED>(p, n0, 16 * (t & 15), gok);  // a group's rows are consecutive
    group = gok ? W + wg_row_chunk0(R0, wrow_bytes) : nullptr;
    chunks = Kst >> 5;
#endif
#pragma unroll
    for (int i = 0; i < WGS_SCALE_AHEAD; ++i) load_scales(i, ahead[i]);
  }
  __device__ __forceinline__ void load_scales(int ks, u32 (&sc)[2][4]) const {
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        int kc = 4 * ks + j;
        sc[h][j] = ok[h] && kc * 32 < K ? (u32)srow[h][mx_scale_col_part(kc)] : 127u;
      }
  }
  __device__ __forceinline__ void copy(u32 sp, u32 ss, int ks, int t, u32 bar) {
#if WG_BULK_PACKS
    (void)bar;
    if (t < 16 && group) {
      int n = min(4, chunks - 4 * ks);
      if (n > 0) {
        mbar_expect_tx(bar, (u32)n * 256u);
        bulk_copy(sp + (u32)(t * 1024), group + (i64)ks * 4 * WG_CHUNK_STRIDE, (u32)n * 256u,
                  bar);
      }
    }
#endif
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#if !WG_BULK_PACKS
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        int kc = 4 * ks + j;
        bool zero = !ok[h] || kc * 32 >= K;
        cp_async16_or_zero(sp + wgs_pack_at(t + 128 * h, j),
                           src[h] + (zero ? 0 : (i64)kc * WG_CHUNK_STRIDE), zero);
      }
#endif
      const u32* b = ahead[0][h];
      st_shared_u32(ss + 4 * (t + 128 * h), b[0] | b[1] << 8 | b[2] << 16 | b[3] << 24);
    }
#pragma unroll
    for (int i = 0; i + 1 < WGS_SCALE_AHEAD; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int j = 0; j < 4; ++j) ahead[i][h][j] = ahead[i + 1][h][j];
    load_scales(ks + WGS_SCALE_AHEAD, ahead[WGS_SCALE_AHEAD - 1]);
  }
};

// The packs of one 32-code group of a thread's four rows ([m][h][word]): at `sp` (the
// thread's row 16 w + gid, chunk grp, wgs_pack_at), m adds 64 rows, h 8.
__device__ __forceinline__ void wgs_load_group(u32 sp, u32 (&pk)[2][2][4]) {
#pragma unroll
  for (int m = 0; m < 2; ++m)
#pragma unroll
    for (int h = 0; h < 2; ++h) ld_shared_words(sp + wgs_pack_at(64 * m + 8 * h, 0), pk[m][h]);
}

// Those packs into the A fragments of the group's two K slices ([m][slice][register],
// mma_sm90.cuh), their scales byte grp of sc[m][h].
template <bool TWICE>
__device__ __forceinline__ void wgs_decode_group(const u32 (&pk)[2][2][4], const u32 (&sc)[2][2],
                                                 int grp, int tig, u32 (&fr)[2][2][4]) {
#pragma unroll
  for (int m = 0; m < 2; ++m)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const u32* v = pk[m][h];
      u32 f1, f2 = 0u;
      if (TWICE) {  // scale byte grp
        mx_factors(__byte_perm(sc[m][h], 0u, 0x4440u + (u32)grp), f1, f2);
      } else {  // the pair is computed once for groups grp and grp ^ 2 (grp is unrolled)
        u32 pair = grp & 1 ? mx_factor_small_pair<1>(sc[m][h]) : mx_factor_small_pair<0>(sc[m][h]);
        f1 = grp >> 1 ? mx_half_dup<1>(pair) : mx_half_dup<0>(pair);
      }
      // byte tig of words 0 and 1 (slice 2 grp: k 2 tig.. and 2 tig + 8..), of 2 and 3 (+ 1)
      const u32 sel = (u32)tig | (u32)(tig + 4) << 8;
      u32 o[4];
      mx_e2m1_bytes2(__byte_perm(v[0], v[1], sel), f1, f2, TWICE, o);
      mx_e2m1_bytes2(__byte_perm(v[2], v[3], sel), f1, f2, TWICE, o + 2);
      fr[m][0][h] = o[0];      // codes 2 tig, 2 tig + 1 of slice 2 grp
      fr[m][0][2 + h] = o[1];  // + 8
      fr[m][1][h] = o[2];      // slice 2 grp + 1
      fr[m][1][2 + h] = o[3];
    }
}

// Descriptor of the tile's BM sorted rows, K slice s (0..7) of the step at sa.
__device__ __forceinline__ u64 wgs_b_desc(u32 sa, int s) {
  return wg_a_desc(sa + (u32)((s >> 2) * WGS_A_HALF), s & 3);
}

// A step's MMAs: 4 groups of 32 codes, each decoded and then multiplied (see the file head).
// The fragment sets fr[set][m][slice][register] outlive the step: its last group's MMAs still
// read set 1 until the next step's first wait. N: the tile rows the MMAs cover, BM, or BM / 2
// on a tile whose second half is padding (half the tensor work; the accumulators of those
// rows stay 0 and the epilogue skips padding rows).
template <bool TWICE, int N>
__device__ __forceinline__ void wgs_step(u32 sa, u32 sp, const u32 (&sc)[2][2], int tig,
                                         u32 (&fr)[2][2][2][4], float (&acc)[2][WGS_ACC]) {
  // The next group's packs are loaded before this group's decode, so that their latency
  // passes under it (the loads, asm volatile, keep their place among the MMAs' asm). Not on
  // 128-row tiles: the second buffer's 16 registers made ptxas serialize the MMAs (C7512).
  constexpr int AHEAD = BM == 64;
  u32 pk[1 + AHEAD][2][2][4];  // [buffer][m][h][word]
  wgs_load_group(sp, pk[0]);
#pragma unroll
  for (int grp = 0; grp < 4; ++grp) {
    u32(&f)[2][2][4] = fr[grp & 1];
    if (AHEAD && grp + 1 < 4)
      wgs_load_group(sp + wgs_pack_at(0, grp + 1), pk[(grp + 1) & AHEAD]);
    if (!AHEAD && grp > 0) wgs_load_group(sp + wgs_pack_at(0, grp), pk[0]);
    wgs_decode_group<TWICE>(pk[grp & AHEAD], sc, grp, tig, f);
    wgmma_fence();  // the fragments were just written
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
      for (int s = 0; s < 2; ++s) {
        if constexpr (N == 32)
          wgmma_bf16_rs_n32(acc[m], f[m][s], wgs_b_desc(sa, 2 * grp + s), 1);
        else if constexpr (N == 64)
          wgmma_bf16_rs_n64(acc[m], f[m][s], wgs_b_desc(sa, 2 * grp + s), 1);
        else
          wgmma_bf16_rs_n128(acc[m], f[m][s], wgs_b_desc(sa, 2 * grp + s), 1);
      }
    wgmma_commit();
    wgmma_wait<1>();  // group grp - 1 is done: its fragment set may be rewritten
  }
}

template <bool GATED>
__device__ void moe_gemm_wg_swap(const Params& p) {
  pdl_enter();
  extern __shared__ u8 wg_smem_raw[];
  __shared__ __align__(8) u64 s_full[WG_STAGES], s_empty[WG_STAGES];
  int tid = threadIdx.x;
  int tiles = *(const int*)p.total_tiles, nblk = wg_column_blocks<GATED>(p);
  int work = tiles * nblk;
  if ((int)blockIdx.x >= work) return;  // every thread of the block, before any barrier
  u32 base = (smem_addr(wg_smem_raw) + 1023u) & ~1023u;
  u32 full0 = smem_addr(&s_full[0]), empty0 = smem_addr(&s_empty[0]);
  wg_ring_init(tid, full0, empty0);  // the last block-wide barrier: the roles never meet again
  int K = GATED ? p.H : p.I;
  int kbytes = K * 2;
  int nk = (K + WGS_KSTEP - 1) / WGS_KSTEP;
  const int* sorted = (const int*)p.sorted_rows;
  const int* tile_expert = (const int*)p.tile_expert;

  if (tid < 128) {
    // Producer: activation chunk t & 7 of rows (t >> 3) + 16 i of both halves, the packs and
    // scales of block rows t and t + 128.
#if WGS_SETMAXNREG && !defined(MP_HOST)
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(WGS_PRODUCER_REGS));
#endif
    u32 it = 0;  // ring steps produced
    for (int w = blockIdx.x; w < work; w += gridDim.x) {
      int tile, n0;
      wg_work<GATED>(w, tiles, nblk, tile, n0);
      WgActCopies<GATED, 128> acts(p, sorted + tile * BM, K, tid);
      WgsPackCopies<GATED> packs(p, tile_expert[tile], n0, K, tid);
      for (int ks = 0; ks < nk; ++ks, ++it) {
        int st = it % WG_STAGES;
        mbar_wait(empty0 + 8 * st, ((it / WG_STAGES) & 1) ^ 1);  // first pass: free
        u32 sa = base + (u32)st * WG_STAGE_BYTES, bar = full0 + 8 * st;
        packs.copy(sa + 2 * WGS_A_HALF, sa + 2 * WGS_A_HALF + WGS_PACKS, ks, tid, bar);
        acts.copy(sa, 2 * ks, kbytes, tid);
        acts.copy(sa + WGS_A_HALF, 2 * ks + 1, kbytes, tid);
        cp_async_arrive(bar);
        mbar_arrive(bar);  // after the scales' stores (a release)
      }
    }
    cp_async_wait<0>();
    return;
  }

  // Consumers.
#if WGS_SETMAXNREG && !defined(MP_HOST)
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(WGS_CONSUMER_REGS));
#endif
  int ctid = tid - 128, wg = ctid >> 7, warp = (ctid >> 5) & 3, lane = ctid & 31;
  int gid = lane >> 2, tig = lane & 3;
  // This thread's first block row (m = 0, h = 0); m adds 64, h adds 8.
  int brow = 128 * wg + 16 * warp + gid;
  u32 it = 0;  // ring steps consumed
  u32 fr[2][2][2][4];
  for (int w = blockIdx.x; w < work; w += gridDim.x) {
    int tile, n0;
    wg_work<GATED>(w, tiles, nblk, tile, n0);
    int e = tile_expert[tile];
    // A tile's rows are its expert's pairs, then padding (route_block): padding at row BM / 2
    // means the MMAs need cover only the first half. Under uniform routing that is about half
    // the tiles at BM / 4 .. BM pairs per expert (measured: 0.96x at gpt-oss M = 1024, 0.93x
    // at 2048; 4096, a third of its tiles half, unchanged: bench/NOTES.md session 25).
    const bool half = sorted[tile * BM + BM / 2] < 0;  // a uniform load
    float acc[2][WGS_ACC];
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
      for (int i = 0; i < WGS_ACC; ++i) acc[m][i] = 0.0f;
    // The K loop, compiled for both MMA widths (a block-uniform branch per work item).
    auto k_loop = [&](auto half_case) {
      constexpr int N = decltype(half_case)::value ? BM / 2 : BM;
      for (int ks = 0; ks < nk; ++ks, ++it) {
        int st = it % WG_STAGES;
        mbar_wait(full0 + 8 * st, (it / WG_STAGES) & 1);
        // The producer's cp.async wrote the activations through the generic proxy; the barrier
        // made them visible to this thread, the fence to its wgmma (the async proxy).
        fence_proxy_async();
        u32 sa = base + (u32)st * WG_STAGE_BYTES, sp = sa + 2 * WGS_A_HALF;
        u32 sc[2][2];
#pragma unroll
        for (int m = 0; m < 2; ++m)
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            u32 v[1];
            ld_shared_words(sp + WGS_PACKS + (u32)(4 * (brow + 64 * m + 8 * h)), v);
            sc[m][h] = v[0];
          }
        // Scales above 2^1 need a second multiply (mx_factors); real weights have none, and a
        // warp-uniform branch keeps that path out of the common one.
        bool big = false;
#pragma unroll
        for (int m = 0; m < 2; ++m)
#pragma unroll
          for (int h = 0; h < 2; ++h) big |= mx_any_scale_above_128(sc[m][h]);
        u32 spr = sp + wgs_pack_at(brow, 0);
        if (__any_sync(0xffffffffu, big))
          wgs_step<true, N>(sa, spr, sc, tig, fr, acc);
        else
          wgs_step<false, N>(sa, spr, sc, tig, fr, acc);
        // wgs_step's last wait retired its group 2; group 3 still reads this stage, the stage
        // of step ks - 1 is done (its group 3 retired at this step's first wait).
        if (ks > 0 && lane == 0) mbar_arrive(empty0 + 8 * ((it - 1) % WG_STAGES));
      }
    };
    if (half)
      k_loop(mp_bool<true>{});
    else
      k_loop(mp_bool<false>{});
    // The epilogue's loads (pairs, routing weights, biases), issued before the stores of
    // their sorted rows and, for the first batch, before the last MMAs retire: a store between
    // two loads would keep the second waiting (the compiler cannot move a load above a store
    // it may alias), and ncu had the item-by-item chain of them as the kernel's long-
    // scoreboard stalls. 8 x EPI_J rows at a time: 64 (128 rows' would not fit beside 128
    // accumulators), or 32 on 128-row tiles in stage 2 and in stage 1 with the routing weight
    // on the input (64 spilled there once the K loop had its two copies: the compile check).
    constexpr int EPI_J = BM == 128 && (!GATED || RWOI) ? 4 : 8;
    int r0 = 16 * warp + gid;  // MMA row of h = 0
    float bias[2][2];          // stage 1: [h][gate, up]; stage 2: [m][h]
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      if (GATED) {
        int col = n0 + 64 * wg + r0 + 8 * h;
        bias[h][0] = bias[h][1] = 0.0f;
        if (col < p.I) gated_bias(p, e, col, bias[h][0], bias[h][1]);
      } else {
#pragma unroll
        for (int m = 0; m < 2; ++m) {
          int col = n0 + 128 * wg + 64 * m + r0 + 8 * h;
          bias[m][h] = col < p.H ? down_bias(p, e, col) : 0.0f;
        }
      }
    }
#pragma unroll
    for (int j0 = 0; j0 < BM / 8; j0 += EPI_J) {
      int q[EPI_J][2];
      float wt[EPI_J][2];
#pragma unroll
      for (int j = 0; j < EPI_J; ++j)
#pragma unroll
        for (int c = 0; c < 2; ++c) q[j][c] = sorted[tile * BM + 8 * (j0 + j) + 2 * tig + c];
#pragma unroll
      for (int j = 0; j < EPI_J; ++j)
#pragma unroll
        for (int c = 0; c < 2; ++c)
          wt[j][c] = q[j][c] >= 0 ? ((const float*)p.topk_weights)[q[j][c]] : 0.0f;
      if (j0 == 0) {
        wgmma_wait<0>();
        if (lane == 0) mbar_arrive(empty0 + 8 * ((it - 1) % WG_STAGES));
      }
      // acc[m][4 j + 2 h + c]: MMA row r0 + 8 h of m64 m, sorted row 8 j + 2 tig + c.
#pragma unroll
      for (int j = 0; j < EPI_J; ++j)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          i64 qq = q[j][c];
          if (qq < 0) continue;
          int a = 4 * (j0 + j) + c;
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            int r = r0 + 8 * h;
            if (GATED) {
              int col = n0 + 64 * wg + r;
              if (col < p.I)
                ((u16*)p.inter)[qq * p.I + col] = gated_value_biased(
                    p, acc[0][a + 2 * h], acc[1][a + 2 * h], wt[j][c], bias[h][0], bias[h][1]);
            } else {
#pragma unroll
              for (int m = 0; m < 2; ++m) {
                int col = n0 + 128 * wg + 64 * m + r;
                if (col < p.H)
                  store_partial(p, qq * p.H + col,
                                down_value_biased(acc[m][a + 2 * h], wt[j][c], bias[m][h]));
              }
            }
          }
        }
    }
  }
}

MP_KERNEL void __launch_bounds__(WG_WS_THREADS, 1) moe_stage1(Params p) {
  moe_gemm_wg_swap<true>(p);
}
MP_KERNEL void __launch_bounds__(WG_WS_THREADS, 1) moe_stage2(Params p) {
  moe_gemm_wg_swap<false>(p);
}
